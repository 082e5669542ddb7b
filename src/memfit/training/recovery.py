"""Recovery records: what `memfit.fit` and `GuardedStep` did about each out-of-memory error.

A `Recovery` is one out-of-memory error a step recovered from (where it struck, K before and
after, how long it took); a `FitSummary` collects them with K per input shape and the count of
updates. `history.memfit` and `GuardedStep.summary` are a `FitSummary`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit.serialize import json_dict
from memfit.sizes import format_size


@dataclass
class Recovery:
    """One out-of-memory error a step recovered from.

    Attributes:
        update: the optimizer update being computed (its iteration count before the step).
        epoch: the epoch (from 0), when known.
        input_shapes: shapes of the batch's inputs.
        phase: `"gradients"` (forward/backward) or `"apply"` (the optimizer update).
        old_micro_batches, new_micro_batches: K before and after.
        peak_bytes: the device's peak when the error struck, when known.
        seconds: from the error to the step completed with the new K.
        trace_seconds: of `seconds`, the time spent tracing the step for the new K.
        message: TensorFlow's error, first line.
        elsewhere: another worker (of a multi-worker strategy) ran out of memory, and this
            one retried with it.

    Example:
        ```python
        memfit.fit(model, x, y, batch_size=64, on_recovery=print)
        # out of memory in the gradients of update 3 (epoch 1, batch 64x256x256x3, peak
        # 7.9 GiB): retried with 2 micro-batches (was 1), 4.1 s
        ```
    """

    update: int
    epoch: int | None
    input_shapes: list[list[int]]
    phase: str
    old_micro_batches: int
    new_micro_batches: int
    peak_bytes: int | None
    seconds: float = 0.0
    trace_seconds: float = 0.0
    message: str = ""
    elsewhere: bool = False

    def __str__(self) -> str:
        where = f"epoch {self.epoch + 1}, " if self.epoch is not None else ""
        peak = f", peak {format_size(self.peak_bytes)}" if self.peak_bytes else ""
        whose = " on another worker" if self.elsewhere else ""
        return (
            f"out of memory{whose} in the {self.phase} of update {self.update + 1} ({where}batch "
            f"{'x'.join(map(str, self.input_shapes[0]))}{peak}): retried with "
            f"{self.new_micro_batches} micro-batches (was {self.old_micro_batches}), "
            f"{self.seconds:.1f} s"
        )


@dataclass
class FitSummary:
    """What `memfit.fit` did: micro-batches per input shape, recoveries, updates.

    Attributes:
        micro_batches: K per input-shape key (e.g. `"16x128x128x3|16x4"`).
        recoveries: each `Recovery`, in order.
        updates: optimizer updates trained.
        guarded_updates: of those, the updates whose state was snapshot before they ran.

    Example:
        ```python
        history = memfit.fit(model, x, y, batch_size=64)
        summary = history.memfit                   # a FitSummary
        print(summary.micro_batches, len(summary.recoveries))
        ```
    """

    micro_batches: dict[str, int] = field(default_factory=dict)
    recoveries: list[Recovery] = field(default_factory=list)
    updates: int = 0
    guarded_updates: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (sizes in bytes, times in seconds)."""
        return json_dict(self)
