"""Plan: the fastest way to train a target effective batch within a budget, from measurements.

A configuration is a precision policy, a recompute (`keras.RematScope`) mode and K, the number
of micro-batches `memfit.fit` splits each batch into. For each precision and recompute mode
the planner finds the smallest K whose step fits the budget with margin, measuring the very
step `memfit.fit` runs (micro-batched gradients, one update) in a fresh child process, then
picks the configuration with the shortest measured time per effective batch.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.budget import Budget, as_budget, emulated_budget
from memfit.errors import MemfitError
from memfit.sizes import format_size

DEFAULT_MARGIN = 0.05
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# "full" is left out by default: on the TF backend it raised inside Functional.call.
REMAT_MODES: tuple[str | None, ...] = (None, "larger_than", "activations")


@dataclass
class Candidate:
    """One measured configuration.

    Attributes:
        precision: Keras dtype policy.
        remat: `keras.RematScope` mode, or None for no recompute.
        micro_batches: K.
        micro_batch_size: samples per micro-batch (the last may hold fewer).
        peak_bytes: measured peak of the whole step (None when it failed to run).
        step_seconds: measured time per effective batch (None when it did not fit).
        fits: peak within the budget less the margin.
        oom: the step ran out of memory.
        error: why the configuration could not be measured, if it could not.
    """

    precision: str
    remat: str | None
    micro_batches: int
    micro_batch_size: int
    peak_bytes: int | None = None
    step_seconds: float | None = None
    fits: bool = False
    oom: bool = False
    error: str | None = None


@dataclass
class Plan:
    """The configuration `memfit.fit` should train with, and what it was chosen from.

    Attributes:
        batch_size: the effective batch (samples per optimizer update).
        micro_batches: K, micro-batches per step (`accumulation_steps`).
        micro_batch_size: samples per micro-batch.
        precision: dtype policy to build the model under.
        remat: `keras.RematScope` mode to build the model under, or None.
        peak_bytes: measured peak of the chosen step.
        step_seconds: measured time per effective batch of the chosen step.
        budget: the budget planned for; `margin`: the share of it kept free.
        candidates: every configuration measured, in order.
        fits: whether any configuration fits.
        note: what was not considered and why (e.g. precision needs a factory).
    """

    batch_size: int
    micro_batches: int
    micro_batch_size: int
    precision: str
    remat: str | None
    peak_bytes: int | None
    step_seconds: float | None
    budget: Budget
    margin: float
    candidates: list[Candidate] = field(default_factory=list)
    fits: bool = True
    note: str = ""
    seconds: float = 0.0

    @contextlib.contextmanager
    def build_scope(self) -> Iterator[None]:
        """Build the model inside this block to build it as planned: precision and recompute.

        Sets the Keras dtype policy to `precision` (restored afterwards) and enters a
        `keras.RematScope` of the `remat` mode, so that `memfit.fit(model, ...,
        micro_batches=plan)` accepts the model built here.

        Example:
            ```python
            plan = memfit.plan("mypkg.models:build", 256, "T4")
            with plan.build_scope():
                model = mypkg.models.build()
            memfit.fit(model, x, y, batch_size=256, micro_batches=plan)
            ```
        """
        from memfit.backend import tf as tfb

        keras = tfb.import_keras()
        previous = keras.mixed_precision.dtype_policy()
        keras.mixed_precision.set_dtype_policy(self.precision)
        try:
            with keras.RematScope(mode=self.remat) if self.remat else contextlib.nullcontext():
                yield
        finally:
            keras.mixed_precision.set_dtype_policy(previous)

    @property
    def accumulation_steps(self) -> int:
        """Gradient-accumulation steps per update: the same number as `micro_batches`."""
        return self.micro_batches

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (sizes in bytes, times in seconds)."""
        return {
            "batch_size": self.batch_size,
            "micro_batch_size": self.micro_batch_size,
            "accumulation_steps": self.accumulation_steps,
            "micro_batches": self.micro_batches,
            "precision": self.precision,
            "remat": self.remat,
            "peak_bytes": self.peak_bytes,
            "step_seconds": self.step_seconds,
            "fits": self.fits,
            "budget": self.budget.to_dict(),
            "margin": self.margin,
            "limit_bytes": int(self.budget.usable_bytes * (1 - self.margin)),
            "candidates": [asdict(c) for c in self.candidates],
            "note": self.note,
            "plan_seconds": self.seconds,
        }

    def summary(self) -> str:
        """One or two sentences for people."""
        if not self.fits:
            return (
                f"no configuration fits batch {self.batch_size} in "
                f"{format_size(self.budget.usable_bytes)} ({self.budget.name}), even one "
                f"sample per micro-batch; "
                + (self.note or "use a card with more memory or smaller inputs")
            )
        split = (
            f"{self.micro_batches} micro-batches of {self.micro_batch_size}"
            if self.micro_batches > 1
            else "no split"
        )
        text = (
            f"batch {self.batch_size}: {split}, {self.precision}"
            + (f", remat {self.remat}" if self.remat else "")
            + f" — peak {format_size(self.peak_bytes)} of "
            f"{format_size(self.budget.usable_bytes)}, {self.step_seconds:.3f} s per batch"
        )
        return text + (f". {self.note}" if self.note else "")


def plan(
    model: Any,
    batch_size: int,
    budget: Budget | str | int | None = None,
    *,
    margin: float = DEFAULT_MARGIN,
    precisions: Sequence[str] | None = None,
    remat_modes: Sequence[str | None] | None = None,
    input_shape: Any = None,
    data: str | None = None,
    optimizer: str | None = None,
    loss: str | None = None,
    repeats: int = 1,
    on_candidate: Callable[[Candidate], None] | None = None,
) -> Plan:
    """Plan K (micro-batches), precision and recompute for a target effective batch.

    Every candidate is measured in a fresh child process under the budget: the step that
    `memfit.fit` runs at that K. Precision and recompute change how the model is built, so
    they are planned only for a MODEL string that builds it — a factory
    (`package.module:factory`) or a built-in (`keras.applications.ResNet50`); for a model
    object or a `.keras` file only K is planned, and `note` says what a factory would add.

    Args:
        model: a MODEL string, or a compiled Keras model (saved for the child; K only).
        batch_size: the target effective batch.
        budget: the budget (`Budget`, size, or card name); default the emulated one.
        margin: share of the budget kept free (default 0.05).
        precisions: dtype policies to consider (default float32, mixed_float16,
            mixed_bfloat16 when the model can be rebuilt; float32 otherwise).
        remat_modes: `keras.RematScope` modes to consider, None meaning no recompute
            (default None, "larger_than", "activations" when the model can be rebuilt).
        input_shape: one sample's shape, for models with undefined inputs.
        data: `package.module:dataset_fn` of unbatched samples (detectors, dict targets).
        optimizer, loss: by name, to compile with (default: the model's own).
        repeats: measured steps per candidate after the warm-up.
        on_candidate: called with each measured `Candidate` (progress displays).

    Returns:
        A `Plan`; pass it to `memfit.fit(..., micro_batches=plan)`.

    Example:
        ```python
        p = memfit.plan("keras.applications.ResNet50", 256, "T4", input_shape=(224, 224, 3))
        print(p.summary())
        ```
    """
    from memfit.fit import _positive_int
    from memfit.isolate import measure_in_child, save_for_child

    batch_size = _positive_int(batch_size, "batch_size")
    if not (isinstance(margin, (int, float)) and 0 <= margin < 1):
        raise MemfitError(f"margin must be a share of the budget from 0 to below 1, got {margin!r}")
    resolved = as_budget(budget) or emulated_budget()
    if resolved is None:
        raise MemfitError(
            "no budget to plan for: pass budget= (a size or card), or emulate one with "
            "memfit.emulate() / --memory / --device"
        )
    rebuildable = isinstance(model, str) and not model.endswith((".keras", ".h5"))
    note = ""
    if not rebuildable:
        if precisions not in (None, ("float32",), ["float32"]) or remat_modes not in (
            None,
            (None,),
            [None],
        ):
            raise MemfitError(
                "precision and recompute need the model rebuilt: give a factory "
                "(package.module:factory) or a built-in name instead of a model object or file"
            )
        note = (
            "Only K was planned: a model factory (package.module:factory) would let the planner "
            "also try mixed precision and recompute"
        )
    precisions = list(precisions or (PRECISIONS if rebuildable else ("float32",)))
    remat_modes = list(remat_modes or (REMAT_MODES if rebuildable else (None,)))
    limit = int(resolved.usable_bytes * (1 - margin))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memfit-plan-") as tmp:
        spec = model if isinstance(model, str) else save_for_child(model, tmp)
        candidates: list[Candidate] = []

        def measure_k(precision: str, remat: str | None, k: int) -> Candidate:
            m = measure_in_child(
                spec,
                batch_size,
                data=data,
                input_shape=input_shape,
                optimizer=optimizer,
                loss=loss,
                repeats=repeats,
                budget=resolved,
                micro_batches=k,
                precision=None if precision == "float32" else precision,
                remat=remat,
            )
            candidate = Candidate(
                precision=precision,
                remat=remat,
                micro_batches=k,
                micro_batch_size=math.ceil(batch_size / k),
                peak_bytes=m.peak_bytes,
                step_seconds=m.step_seconds,
                oom=m.oom,
                fits=not m.oom and m.peak_bytes is not None and m.peak_bytes <= limit,
            )
            candidates.append(candidate)
            if on_candidate is not None:
                on_candidate(candidate)
            return candidate

        hint = 1  # the smallest fitting K of the configurations planned so far
        for precision in precisions:
            for remat in remat_modes:
                try:
                    _smallest_fitting_k(measure_k, precision, remat, batch_size, hint)
                except MemfitError as exc:
                    failed = Candidate(precision, remat, hint, math.ceil(batch_size / hint))
                    failed.error = str(exc)
                    candidates.append(failed)
                    if on_candidate is not None:
                        on_candidate(failed)
                fitting = [c for c in candidates if c.fits]
                if fitting:
                    hint = min(c.micro_batches for c in fitting)
    fitting = [c for c in candidates if c.fits and c.step_seconds is not None]
    result_seconds = time.perf_counter() - started
    if not fitting:
        return Plan(
            batch_size=batch_size,
            micro_batches=batch_size,
            micro_batch_size=1,
            precision=precisions[0],
            remat=None,
            peak_bytes=None,
            step_seconds=None,
            budget=resolved,
            margin=float(margin),
            candidates=candidates,
            fits=False,
            note=note,
            seconds=result_seconds,
        )
    best = min(fitting, key=lambda c: c.step_seconds or math.inf)
    return Plan(
        batch_size=batch_size,
        micro_batches=best.micro_batches,
        micro_batch_size=best.micro_batch_size,
        precision=best.precision,
        remat=best.remat,
        peak_bytes=best.peak_bytes,
        step_seconds=best.step_seconds,
        budget=resolved,
        margin=float(margin),
        candidates=candidates,
        note=note,
        seconds=result_seconds,
    )


def _k_values(batch_size: int) -> list[int]:
    """The K worth trying: each gives a different micro-batch size (doubling, then 1 sample)."""
    values, k = [], 1
    while k < batch_size:
        values.append(k)
        k *= 2
    return [*values, batch_size]


def _smallest_fitting_k(
    measure_k: Callable[[str, str | None, int], Candidate],
    precision: str,
    remat: str | None,
    batch_size: int,
    hint: int,
) -> Candidate | None:
    """Walk K from `hint`: down while it still fits, up until it fits."""
    ks = _k_values(batch_size)
    index = min(range(len(ks)), key=lambda i: abs(ks[i] - hint))
    first = measure_k(precision, remat, ks[index])
    if first.fits:
        best = first
        while index > 0:
            index -= 1
            candidate = measure_k(precision, remat, ks[index])
            if not candidate.fits:
                break
            best = candidate
        return best
    while index + 1 < len(ks):
        index += 1
        candidate = measure_k(precision, remat, ks[index])
        if candidate.fits:
            return candidate
    return None
