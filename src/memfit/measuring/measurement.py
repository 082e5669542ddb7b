"""Measurement: what one training step cost at a batch size, as `memfit.measure` found it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from memfit.budget.budget import Budget
from memfit.serialize import json_dict
from memfit.sizes import format_size


@dataclass
class Measurement:
    """What one training step costs at a batch size, measured on a device.

    Attributes:
        batch_size: samples in the step.
        device: the TensorFlow device measured (`"CPU:0"`, `"GPU:0"`).
        oom: whether the step ran out of memory (a real `ResourceExhaustedError`).
        peak_bytes: the allocator's highest in-use bytes during the step (max over the
            measured repeats); absolute, so it includes `resident_bytes`. When `oom`, the
            highest bytes reached before the failing allocation (a lower bound).
        resident_bytes: bytes in use before the step: weights, optimizer slots and anything
            else the process holds on the device.
        step_seconds: median wall time of a step after tracing (None when `oom`).
        peaks_bytes: the peak of each measured repeat, to show the spread.
        oom_message: which allocation failed, from TensorFlow's message.
        budget: the budget the step was measured under (an emulation or the given budget).
        input_shapes: shape of one sample per input.
        leaked_bytes: device bytes still held after the measurement compared with before
            (0 when memfit cleaned up fully).
        explanation: with `explain=True`, what was alive at the peak
            (`memfit.measuring.explain.Explanation`); None otherwise, or when the step ran out of
            memory.
    """

    batch_size: int
    device: str
    oom: bool
    peak_bytes: int | None
    resident_bytes: int
    step_seconds: float | None
    peaks_bytes: list[int] = field(default_factory=list)
    oom_message: str | None = None
    budget: Budget | None = None
    input_shapes: list[list[int]] = field(default_factory=list)
    leaked_bytes: int = 0
    trace_seconds: float | None = None
    explanation: Any = None

    @property
    def step_bytes(self) -> int | None:
        """Bytes the step itself needs on top of what was resident."""
        return None if self.peak_bytes is None else self.peak_bytes - self.resident_bytes

    @property
    def peak_spread_bytes(self) -> int:
        """Highest minus lowest peak across repeats: how much the allocator's history moved it."""
        return max(self.peaks_bytes) - min(self.peaks_bytes) if self.peaks_bytes else 0

    @property
    def headroom_bytes(self) -> int | None:
        """Budget left above the peak (negative: over budget), when a budget is known."""
        if self.budget is None or self.peak_bytes is None:
            return None
        return self.budget.usable_bytes - self.peak_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: sizes in bytes (`*_bytes`), times in seconds (`*_seconds`)."""
        peaks = self.peaks_bytes
        return json_dict(
            self,
            step_bytes=self.step_bytes,
            peak_spread_bytes=self.peak_spread_bytes,
            peak_min_bytes=min(peaks) if peaks else None,
            peak_median_bytes=int(statistics.median(peaks)) if peaks else None,
            headroom_bytes=self.headroom_bytes,
            repeats=len(peaks),
        )

    def __str__(self) -> str:
        if self.oom:
            return (
                f"batch {self.batch_size}: out of memory on {self.device} "
                f"(reached {format_size(self.peak_bytes)}"
                + (f" of {format_size(self.budget.usable_bytes)}" if self.budget else "")
                + ")"
            )
        return (
            f"batch {self.batch_size}: peak {format_size(self.peak_bytes)} "
            f"(± {format_size(self.peak_spread_bytes)}), resident "
            f"{format_size(self.resident_bytes)}, {self.step_seconds:.3f} s/step"
        )
