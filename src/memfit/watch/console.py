"""Console output of `memfit.Watch`: each finding when it first holds, a summary at the end.

Everything goes to stderr through rich, with the log's text escaped (a model named
`[bold]x` prints as written).

Example:
    ```python
    console = WatchConsole()
    console.finding(finding)
    console.summary(watch.summary(), watch.findings, log_path="run.jsonl")
    ```
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from memfit.sizes import format_size
from memfit.watch.findings import WatchFinding


class WatchConsole:
    """Prints findings and summaries on the terminal (stderr); rich is loaded on first use."""

    def __init__(self) -> None:
        self._console: Any = None

    def _out(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)
        return self._console

    @contextlib.contextmanager
    def working(self, title: str, show: bool = True) -> Iterator[Callable[[str], None]]:
        """Say what runs meanwhile: a spinner on a terminal, else the title on one line.

        Yields a function that takes the current phase's text. Nothing is printed when not
        `show`.
        """
        if not show:
            yield lambda _text: None
            return
        from rich.markup import escape

        out = self._out()
        started = time.monotonic()
        out.print(f"memfit watch: {escape(title)} ...")
        if not (out.is_terminal or out.is_jupyter):
            yield lambda _text: None
        else:
            with out.status(escape(title), spinner="dots") as status:
                yield lambda text: status.update(f"{escape(title)}: {escape(text)}")
        out.print(f"memfit watch: done in {time.monotonic() - started:.0f} s")

    def finding(self, finding: WatchFinding) -> None:
        """Print one finding: kind, step, what was seen, cause, fix."""
        from rich.markup import escape

        style = "bold red" if finding.severity == "problem" else "bold yellow"
        self._out().print(
            f"\n[{style}]memfit watch: {escape(finding.kind)}[/] at step {finding.step}: "
            f"{escape(finding.message)}\n  [bold]cause:[/] {escape(finding.cause)}\n"
            f"  [bold]fix:[/] {escape(finding.fix)}"
        )

    def summary(
        self,
        totals: dict[str, Any],
        findings: Sequence[WatchFinding],
        log_path: str | None = None,
    ) -> None:
        """Print one line: steps, step time, input wait, peak, Watch's own time, findings."""
        from rich.markup import escape

        parts = [f"{totals['steps']} steps"]
        if totals.get("mean_step_seconds"):
            parts.append(f"{1000 * totals['mean_step_seconds']:.1f} ms/step")
        if totals.get("input_wait_fraction") is not None:
            parts.append(f"input wait {100 * totals['input_wait_fraction']:.0f}%")
        if totals.get("peak_bytes"):
            parts.append(f"peak {format_size(totals['peak_bytes'])}")
        if totals.get("watch_overhead_fraction") is not None:
            parts.append(f"watch's own time {100 * totals['watch_overhead_fraction']:.2f}%")
        kinds = ", ".join(sorted({f.kind for f in findings})) or "none"
        style = "green" if not findings else "yellow"
        self._out().print(
            f"[{style}]memfit watch:[/] {'; '.join(parts)}; findings: {escape(kinds)}"
            + (f" (log: {escape(log_path)})" if log_path else "")
        )
