"""What the planner looks at and answers: `Candidate` (one configuration and K) and `Plan`.

A `Candidate` is filled in as the planner estimates, measures and confirms it; a `Plan` is
the configuration `memfit.fit` should train with, the candidates it was chosen from, and how
it was confirmed. Both are plain data with `to_dict` for `--json`; `Plan.build_scope` builds
a model as planned.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from memfit.backend import tf as tfb
from memfit.budget.budget import Budget
from memfit.budget.fitting import limit_bytes
from memfit.recomputation.remat import remat_scope
from memfit.serialize import json_dict
from memfit.sizes import format_size

# The precision of a plan for a Model Garden task: its config's
# (`runtime.mixed_precision_dtype`), which the planner leaves as it is.
TASK_PRECISION = "task's own"


@dataclass
class Candidate:
    """One configuration the planner looked at: estimated, measured, confirmed.

    Attributes:
        precision: Keras dtype policy.
        remat: `keras.RematScope` mode, or None for no recompute.
        micro_batches: K.
        micro_batch_size: samples per micro-batch (the last may hold fewer).
        peak_bytes: measured peak of the whole step (None when not measured or it failed).
        step_seconds: measured time per effective batch (None when not measured or no fit).
        fits: within the budget less the margin: measured when `measured`, else predicted.
        oom: the step ran out of memory.
        error: why the configuration could not be estimated or measured, if it could not.
        predicted_peak_bytes: the estimate's peak (`memfit.estimate`), when estimated.
        measured: the step ran in a child process (else the candidate was only estimated).
        confirmed: None when no confirmation ran; True when `memfit.fit` trained the
            confirmation's steps in a fresh process without a recovery within the limit,
            False when it did not (`recoveries` says why).
        recoveries: what went wrong in the confirmation run.
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
    predicted_peak_bytes: int | None = None
    measured: bool = False
    confirmed: bool | None = None
    recoveries: list[str] = field(default_factory=list)

    @property
    def estimated_only(self) -> bool:
        """Whether the candidate was only estimated, never run."""
        return not self.measured and self.predicted_peak_bytes is not None

    @property
    def config(self) -> tuple[str, str | None]:
        """Its precision and recompute mode."""
        return self.precision, self.remat

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (sizes in bytes, times in seconds)."""
        return json_dict(self, estimated_only=self.estimated_only)


@dataclass
class Plan:
    """The configuration `memfit.fit` should train with, and what it was chosen from.

    Attributes:
        batch_size: the effective batch (samples per optimizer update), global: over all
            replicas.
        micro_batches: K, micro-batches per step (`accumulation_steps`) on each replica.
        micro_batch_size: samples per micro-batch on each replica.
        precision: dtype policy to build the model under.
        remat: `keras.RematScope` mode to build the model under, or None.
        peak_bytes: measured peak of the chosen step.
        step_seconds: measured time per effective batch of the chosen step.
        budget: the budget planned for; `margin`: the share of it kept free.
        candidates: every configuration estimated or measured, in order.
        fits: whether any configuration fits (and, when confirmed, held).
        note: what was not considered and why (e.g. precision needs a factory).
        seconds: how long planning took.
        confirmed: True when the chosen configuration trained `confirm_steps` steps of
            `memfit.fit` in a fresh process without a recovery; None when not confirmed.
        confirmation: how the plan was confirmed, for people.
        replicas: data-parallel replicas sharing `batch_size` (1: one device); each trains
            `batch_size / replicas` samples in K micro-batches, under `budget` (the tightest
            replica's, less `allreduce_bytes`).
        allreduce_bytes: the gradient all-reduce's extra buffer on each replica, kept off
            the budget (0 with one replica).
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
    confirmed: bool | None = None
    confirmation: str = ""
    replicas: int = 1
    allreduce_bytes: int = 0

    @property
    def per_replica_batch_size(self) -> int:
        """Samples each replica trains per update: `batch_size / replicas`."""
        return self.batch_size // self.replicas

    @contextlib.contextmanager
    def build_scope(self) -> Iterator[None]:
        """Build the model inside this block to build it as planned: precision and recompute.

        Sets the Keras dtype policy to `precision` (restored afterwards) and enters a
        `keras.RematScope` of the `remat` mode, so that `memfit.fit(model, ...,
        plan=plan)` accepts the model built here.

        Example:
            ```python
            plan = memfit.plan("mypkg.models:build", 256, budget="T4")
            with plan.build_scope():
                model = mypkg.models.build()
            memfit.fit(model, x, y, batch_size=256, plan=plan)
            ```
        """

        keras = tfb.import_keras()
        previous = keras.mixed_precision.dtype_policy()
        if self.precision != TASK_PRECISION:
            keras.mixed_precision.set_dtype_policy(self.precision)
        try:
            with remat_scope(self.remat):
                yield
        finally:
            keras.mixed_precision.set_dtype_policy(previous)

    @property
    def accumulation_steps(self) -> int:
        """Gradient-accumulation steps per update: the same number as `micro_batches`."""
        return self.micro_batches

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (sizes in bytes, times in seconds)."""
        return json_dict(
            self,
            "batch_size replicas per_replica_batch_size allreduce_bytes micro_batch_size "
            "accumulation_steps micro_batches precision remat peak_bytes step_seconds fits "
            "budget margin limit_bytes candidates confirmed confirmation note plan_seconds",
            limit_bytes=limit_bytes(self.budget.usable_bytes, self.margin),
            plan_seconds=self.seconds,
        )

    def summary(self) -> str:
        """One or two sentences for people."""
        if not self.fits and self.confirmed is False and self.confirmation:
            return f"batch {self.batch_size}: {self.confirmation}. " + (
                self.note or "use a card with more memory or smaller inputs"
            )
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
        if self.replicas > 1:
            uneven = self.micro_batches * self.micro_batch_size != self.per_replica_batch_size
            split = (
                f"per-replica micro-batch {self.micro_batch_size}, K={self.micro_batches}, "
                f"global effective batch {self.batch_size} ({self.replicas} replicas x "
                f"{self.micro_batches} x {self.micro_batch_size}"
                + (", the last micro-batch smaller" if uneven else "")
                + f"; {format_size(self.allreduce_bytes)} kept per replica for the gradient "
                f"all-reduce)"
            )
        text = (
            f"batch {self.batch_size}: {split}, "
            + ("the task's own precision" if self.precision == TASK_PRECISION else self.precision)
            + (f", remat {self.remat}" if self.remat else "")
            + f" — peak {format_size(self.peak_bytes)} of "
            f"{format_size(self.budget.usable_bytes)}, {self.step_seconds:.3f} s per batch"
        )
        text += (
            f". {self.confirmation[:1].upper()}{self.confirmation[1:]}" if self.confirmation else ""
        )
        return text + (f". {self.note}" if self.note else "")
