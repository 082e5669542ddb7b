"""Progress of long work in Python: what `measure`, `estimate`, `find_batch_size` and `plan` do.

The CLI shows a spinner and one line per trial or candidate (the phase, for a measurement or
an estimate); in Python the same display is on by default when stderr is a terminal (or a
notebook), so work that takes minutes is not silent. Each public entry point takes
`progress`:

- `None` (default): on when stderr is a terminal or a Jupyter notebook and no event callback
  was given, since a caller with a callback shows its own;
- `True` / `False`: on / off;
- a callable: receives each event (a phase's text for `measure` and `estimate`, a `Trial` for
  `find_batch_size`, a `Candidate` for `plan`), and nothing is printed.

The older event callbacks (`on_progress`, `on_trial`, `on_candidate`) still work, with a
`DeprecationWarning`: `progress=callable` receives the same events.
"""

from __future__ import annotations

import functools
import inspect
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from memfit.sizes import format_size

Progress = bool | Callable[[Any], None] | None
F = TypeVar("F", bound=Callable[..., Any])


def shows_progress(
    callback: str,
    title: Callable[[dict[str, Any]], str],
    line: str,
    *,
    deprecated: bool = False,
) -> Callable[[F], F]:
    """Decorate an entry point so that its `progress` argument displays its `callback` events.

    The decorated function takes `progress` (see the module) and an event callback argument
    named `callback`; the display is chained after that callback, so the function body needs
    no change.

    Args:
        callback: the name of the function's event callback argument (`"on_trial"`).
        title: the spinner's text from the call's arguments (by name, defaults applied).
        line: how an event is shown: `"trial"` or `"candidate"` (one line each, by this
            module's formatters), or `"phase"` (a text that replaces the spinner's).
        deprecated: the callback argument is an old spelling of `progress=callable`: a
            caller who passes it gets a `DeprecationWarning`.

    Example:
        ```python
        @shows_progress("on_trial", lambda a: "Searching", "trial")
        def find_batch_size(model, *, on_trial=None, progress=None): ...
        ```
    """
    formatter = {"trial": trial_line, "candidate": candidate_line, "phase": None}[line]

    def decorate(function: F) -> F:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
            given = arguments.get(callback)
            if deprecated and given is not None:
                warnings.warn(
                    f"{function.__name__}({callback}=...) is deprecated and goes in the next "
                    f"release: pass progress=<callable>, which receives the same events",
                    DeprecationWarning,
                    stacklevel=2,
                )
            with display(arguments.get("progress"), title(arguments), formatter, given) as show:
                if show is not None:
                    arguments[callback] = _chain(given, show)
                arguments["progress"] = False
                return function(*bound.args, **bound.kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


@contextmanager
def display(
    progress: Progress,
    title: str,
    formatter: Callable[[Any], str] | None,
    callback: Callable[[Any], None] | None = None,
) -> Iterator[Callable[[Any], None] | None]:
    """Show a spinner with `title` and one line per event on stderr, while the block runs.

    Yields the function to call with each event, or None when progress is off.

    Args:
        progress: see the module: None (automatic), True, False, or a callable.
        title: what the work is, e.g. `"memfit.find_batch_size: measuring batch sizes"`.
        formatter: turns an event into one line (rich markup); None: each event is a
            phase's text, shown in the spinner's line instead of a line of its own.
        callback: the caller's own event callback; with progress None, one turns it off.

    Example:
        ```python
        with display(True, "Searching", trial_line) as show:
            show(trial)
        ```
    """
    if progress is False:
        yield None
        return
    if callable(progress):
        yield progress
        return
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    if progress is None and (
        callback is not None or not (console.is_terminal or console.is_jupyter)
    ):
        yield None
        return
    started = time.monotonic()
    count = [0]
    with console.status(f"{title} ...", spinner="dots") as status:

        def show(event: Any) -> None:
            if formatter is None:
                status.update(f"{title}: {event}, {_elapsed(started)}")
                return
            count[0] += 1
            console.print(f"  {formatter(event)}")
            status.update(f"{title}: {count[0]} so far, {_elapsed(started)}")

        console.print(f"memfit: {title}")
        yield show
    console.print(f"memfit: done in {_elapsed(started)}")


def trial_line(trial: Any) -> str:
    """One line for a batch-search `Trial`: size, verdict, peak, prediction, time.

    Args:
        trial: a `memfit.Trial`.

    Example:
        ```python
        trial_line(memfit.Trial(16, oom=False, peak_bytes=2**28, seconds=1.5, fits=True))
        # 'trial     16: [green]fits[/]  peak 256.00 MiB  1.5 s'
        ```
    """
    verdict = (
        "[bold red]out of memory[/]"
        if trial.oom
        else "[green]fits[/]"
        if trial.fits
        else "[yellow]over the margin[/]"
    )
    notes = []
    if trial.soak:
        notes.append(f"over {trial.steps} steps")
    if trial.predicted_peak_bytes:
        notes.append(f"predicted {format_size(trial.predicted_peak_bytes)}")
    return (
        f"trial {trial.batch_size:>6}: {verdict}  peak {format_size(trial.peak_bytes)}"
        + (f"  ({', '.join(notes)})" if notes else "")
        + f"  {trial.seconds:.1f} s"
    )


def candidate_line(candidate: Any) -> str:
    """One line for a plan's `Candidate`: stage, configuration, verdict, peak, time.

    Args:
        candidate: a `memfit.Candidate`.

    Example:
        ```python
        candidate_line(memfit.Candidate("float32", None, 2, 8, predicted_peak_bytes=2**28))
        # 'estimated  float32         remat none         K=2    micro 8     [yellow]over ...'
        ```
    """
    c = candidate
    verdict = (
        f"[red]{c.error[:80]}[/]"
        if c.error
        else f"[bold red]did not hold: {c.recoveries[0][:80]}[/]"
        if c.confirmed is False and c.recoveries
        else "[bold red]out of memory[/]"
        if c.oom
        else "[green]fits[/]"
        if c.fits
        else "[yellow]over the margin[/]"
    )
    stage = (
        ("confirmed" if c.confirmed else "failed")
        if c.confirmed is not None
        else "measured"
        if c.measured
        else "estimated"
        if c.predicted_peak_bytes is not None
        else "-"
    )
    peak = c.peak_bytes if c.measured else c.predicted_peak_bytes
    return (
        f"{stage:<10} {c.precision:<15} remat {str(c.remat or 'none'):<12}"
        f" K={c.micro_batches:<4} micro {c.micro_batch_size:<5} {verdict}  peak "
        + format_size(peak)
        + (f"  {c.step_seconds:.3f} s/batch" if c.step_seconds else "")
    )


def _chain(
    first: Callable[[Any], None] | None, second: Callable[[Any], None]
) -> Callable[[Any], None]:
    if first is None:
        return second

    def both(event: Any) -> None:
        first(event)
        second(event)

    return both


def _elapsed(started: float) -> str:
    seconds = int(time.monotonic() - started)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
