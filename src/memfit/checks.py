"""The arguments memfit's analyses share: their checks, and the options few runs change.

A batch size, a count (steps, repeats, micro-batches, the largest batch to try, replicas),
the soak's steps and the margin (the share of the budget kept free) are checked here and
nowhere else, so that `memfit.measure`, `estimate`, `find_batch_size`, `plan`, `fit`, the
child processes and the CLI say the same thing about the same mistake. The margin's default
lives here too; `Options`, the knobs that most runs leave at their defaults, in one object
that every analysis takes; and `keyword_only` and `takes_options`, which keep an old
spelling working for one release.

This module imports nothing of memfit but its errors, so any module may use it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from memfit.errors import MemfitError, WorkloadError

DEFAULT_MARGIN = 0.05
"""Share of the budget kept free by default (the peak stays below 95% of it)."""

F = TypeVar("F", bound=Callable[..., Any])


def keyword_only(*names: str) -> Callable[[F], F]:
    """Let keyword-only `names` still be given by position, with a `DeprecationWarning`.

    For arguments that were positional in an earlier release: a call that passes them after
    the positional ones works as before, and is told to name them.

    Args:
        names: the keyword-only arguments, in the order they used to come.

    Example:
        >>> @keyword_only("budget")
        ... def search(model, *, budget=None):
        ...     return budget
        >>> search("m", budget="1GiB")
        '1GiB'
    """

    def decorate(function: F) -> F:
        positional = [
            p.name
            for p in inspect.signature(function).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            extra = args[len(positional) :]
            if extra:
                if len(extra) > len(names):
                    raise TypeError(
                        f"{function.__name__}() takes {len(positional)} positional arguments "
                        f"but {len(args)} were given"
                    )
                for name, value in zip(names, extra, strict=False):
                    if name in kwargs:
                        raise TypeError(
                            f"{function.__name__}() got multiple values for argument {name!r}"
                        )
                    kwargs[name] = value
                given = ", ".join(f"{name}=" for name in names[: len(extra)])
                warnings.warn(
                    f"{function.__name__}: pass {given} by name; by position it stops working "
                    f"in the next release",
                    DeprecationWarning,
                    stacklevel=2,
                )
                args = args[: len(positional)]
            return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def check_whole_number(
    value: Any, name: str, *, minimum: int = 1, error: type[MemfitError] = WorkloadError
) -> int:
    """Return `value` as an int when it is a whole number of at least `minimum`, else raise.

    A bool is not a whole number here, nor is a float such as 2.0 or a string such as "8";
    NumPy integers are.

    Args:
        value: the argument to check.
        name: how the message names it (the parameter's name, e.g. `"micro_batches"`).
        minimum: the smallest value allowed.
        error: the `MemfitError` subclass to raise (callers keep the class they raised before).

    Raises:
        MemfitError: `error`, with the text "NAME must be a whole number of at least MINIMUM,
            got VALUE".
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise error(f"{name} must be a whole number of at least {minimum}, got {value!r}")
    return int(value)


def check_positive_int(value: Any, name: str, *, error: type[MemfitError] = WorkloadError) -> int:
    """Return `value` as an int when it is a whole number of at least 1 (steps, repeats, K...).

    Raises:
        MemfitError: `error` (default `WorkloadError`): "NAME must be a whole number of at
            least 1, got VALUE".
    """
    return check_whole_number(value, name, minimum=1, error=error)


def check_batch_size(value: Any, *, error: type[MemfitError] = WorkloadError) -> int:
    """Return a batch size as an int when it is a whole number of at least 1.

    Raises:
        MemfitError: `error` (default `WorkloadError`): "batch size must be a whole number of
            at least 1, got VALUE".
    """
    return check_whole_number(value, "batch size", minimum=1, error=error)


def check_replicas(value: Any) -> int:
    """Return a replica count (data-parallel copies of the model) as an int of at least 1.

    Raises:
        MemfitError: "replicas must be a whole number of at least 1, got VALUE".
    """
    return check_whole_number(value, "replicas", minimum=1, error=MemfitError)


def check_soak_steps(value: Any) -> int:
    """Return the soak's steps as an int when a whole number from 0 (0 skips the soak).

    Raises:
        WorkloadError: "soak_steps must be a whole number of at least 0, got VALUE".
    """
    return check_whole_number(value, "soak_steps", minimum=0)


def check_margin(value: Any) -> float:
    """Return the margin as a float when it is a share of the budget from 0 to below 1.

    Raises:
        MemfitError: "margin must be a share of the budget from 0 to below 1, got VALUE".
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise MemfitError(f"margin must be a share of the budget from 0 to below 1, got {value!r}")
    return float(value)


def check_threads(value: Any) -> tuple[int, int]:
    """Return thread counts `(inter, intra)` from a pair or an `"INTER,INTRA"` string.

    Raises:
        WorkloadError: "threads must be INTER,INTRA: two whole numbers of at least 1 (inter-op
            and intra-op threads), got VALUE".
    """
    parts = value.split(",") if isinstance(value, str) else value
    try:
        inter, intra = (int(p) if isinstance(p, str) else p for p in parts)
        return (
            check_whole_number(inter, "inter-op threads"),
            check_whole_number(intra, "intra-op threads"),
        )
    except (TypeError, ValueError, WorkloadError):
        raise WorkloadError(
            "threads must be INTER,INTRA: two whole numbers of at least 1 (inter-op and "
            f"intra-op threads), got {value!r}"
        ) from None


@dataclasses.dataclass(frozen=True)
class Options:
    """The knobs of memfit's analyses that most runs leave at their defaults.

    One object for all of them, which every analysis takes as `options=` and reads what
    applies to it: the same `Options` can go to `measure`, `estimate`, `find_batch_size` and
    `plan` (as `tf.data.Options` goes to any dataset).

    Args:
        isolated: the model is a MODEL string (`"keras.applications.ResNet50"`, a `.keras`
            file, `package.module:factory`) that a child process loads, so this process
            needs no TensorFlow state (`measure`, `find_batch_size`).
        safe_mode: False lets a child load a trusted `.keras` file (or the saved copy of a
            model) that runs Python code, such as a Lambda layer (`find_batch_size`, `plan`).
        repeats: measured steps per measurement, the highest peak kept (default 3 for
            `measure`, 1 for each of `plan`'s candidates).
        device: the device `measure` runs on (default the first GPU, else the CPU).
        worst_case: `measure` builds its batches of the dataset's largest samples.
        samples: other processes `estimate` replays for its high bound (default 4), the
            executor's order drawn at random in each; 0 leaves the bound out.
        threads: `(inter_op, intra_op)` thread counts the estimate replays the executor
            with (default: TensorFlow's defaults on this machine).
        soak_steps: training steps `find_batch_size`'s answer must hold from a fresh start
            before it is the answer (default 20; 0 answers from the search's trials).
        confirm: `plan` trains its chosen plan for `confirm_steps` in a fresh process before
            answering with it.
        confirm_steps: the steps of that confirmation (default 20).

    A field left at None takes the default of the analysis it goes to.

    Example:
        >>> options = Options(isolated=True, soak_steps=0)
        >>> options.repeats is None, options.soak_steps
        (True, 0)
        >>> Options(threads="1,2").threads
        (1, 2)
    """

    isolated: bool = False
    safe_mode: bool = True
    repeats: int | None = None
    device: str | None = None
    worst_case: bool = False
    samples: int | None = None
    threads: tuple[int, int] | None = None
    soak_steps: int | None = None
    confirm: bool = True
    confirm_steps: int | None = None

    def __post_init__(self) -> None:
        for name in ("repeats", "confirm_steps"):
            if getattr(self, name) is not None:
                check_positive_int(getattr(self, name), name)
        if self.samples is not None:
            check_whole_number(self.samples, "samples", minimum=0)
        if self.soak_steps is not None:
            check_soak_steps(self.soak_steps)
        if self.threads is not None:
            object.__setattr__(self, "threads", check_threads(self.threads))

    def get(self, name: str, default: Any) -> Any:
        """The field `name`, or the analysis's own `default` where it is left at None."""
        value = getattr(self, name)
        return default if value is None else value


def takes_options(*names: str) -> Callable[[F], F]:
    """Let the `Options` fields `names` still be given as keywords, with a `DeprecationWarning`.

    For knobs that were keyword arguments of the function in an earlier release: a call that
    passes them works as before (they replace those fields of its `options`), and is told to
    pass them in `options=memfit.Options(...)`.

    Args:
        names: the `Options` fields the function took as keywords.

    Example:
        >>> @takes_options("repeats")
        ... def measure(model, *, options=None):
        ...     return (options or Options()).repeats
        >>> measure("m", options=Options(repeats=2))
        2
    """
    fields = {field.name for field in dataclasses.fields(Options)}
    unknown = set(names) - fields
    if unknown:
        raise ValueError(f"not Options fields: {sorted(unknown)}")

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            legacy = {name: kwargs.pop(name) for name in names if name in kwargs}
            if legacy:
                given = ", ".join(f"{name}={value!r}" for name, value in legacy.items())
                warnings.warn(
                    f"{function.__name__}: pass options=memfit.Options({given}); as keyword "
                    f"arguments they stop working in the next release",
                    DeprecationWarning,
                    stacklevel=2,
                )
                kwargs["options"] = dataclasses.replace(
                    kwargs.get("options") or Options(), **legacy
                )
            return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
