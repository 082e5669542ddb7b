"""The estimate: `Estimate`, a training step's predicted peak with its breakdown and range."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from memfit.backend.attribution import KINDS
from memfit.budget.budget import Budget
from memfit.estimation.bounds import RUN_STEPS
from memfit.estimation.simulate import Replay
from memfit.serialize import json_dict, suffixed
from memfit.sizes import format_size

CATEGORIES = KINDS  # the breakdown's kinds, shared with `measure --explain`


OPTIMIZERS = ("adam", "sgd")


@dataclass
class Estimate:
    """The predicted peak memory of one training step, and what makes it up.

    Attributes:
        batch_size: samples in the step.
        peak_bytes: predicted allocator peak of the step (weights, optimizer state and the
            batch included), comparable with `Measurement.peak_bytes`: the likely executor
            order's peak, and under several inter-op threads, where each step's order is a
            race, the highest step of the processes replayed (that order's and the sampled
            ones': a run's peak is its highest step).
        breakdown: bytes live at the peak by category (`weights`, `optimizer_slots`,
            `other_state`, `inputs`, `activations` kept for the backward pass, `gradients`,
            `temporaries`, `workspace` of kernels, and `fragmentation`: what the BFC
            allocator hands out beyond the requests, whole chunks it would not split); sums
            to `peak_bytes`.
        per_layer: `[{"layer", "bytes", ...categories}]`, largest first.
        peak_moment: when the peak happens: `phase` (forward/backward/update), `layer`, `op`.
        what_ifs: other configurations and their predicted peaks.
        resident_bytes: predicted bytes in use before the step (weights, optimizer state, batch).
        activations_kept_bytes: bytes the forward pass leaves for the backward pass (live as
            the backward pass starts), whether or not the peak comes then.
        budget: the budget compared against, if any.
        input_shapes: shape of one sample per input.
        high_bytes: the high bound of the peak over a run of `steps` steps: the highest of
            the processes TensorFlow could run (other executor orders, other allocator
            histories), plus an allowance, raised by how a run's highest step rises over its
            steps (see `memfit.estimation.bounds`). `peak_bytes` is the likely (typical)
            step's peak; a card is safe to rent for the high bound.
        steps: steps of training `high_bytes` covers.
        step_high_bytes: the high bound of the highest of 5 steps after a warm-up in a fresh
            process (what `memfit estimate --check` measures), before the run's rise.
        sample_peaks_bytes: the peak of each sampled process behind `high_bytes`.
        order_peak_bytes: the likely executor order's peak alone (equal to `peak_bytes`
            but where a sampled process peaked higher under several inter-op threads; None
            for an estimate not made by a replay).
        trace_seconds: seconds spent tracing the step, grappler included (0 when it was
            made from the traces at two other batch sizes).
        estimate_seconds: seconds the estimate took, from loading the model to the last
            what-if.
    """

    batch_size: int
    peak_bytes: int
    breakdown: dict[str, int]
    per_layer: list[dict[str, Any]] = field(default_factory=list)
    peak_moment: dict[str, str] = field(default_factory=dict)
    what_ifs: list[dict[str, Any]] = field(default_factory=list)
    resident_bytes: int = 0
    activations_kept_bytes: int = 0
    budget: Budget | None = None
    input_shapes: list[list[int]] = field(default_factory=list)
    trace_seconds: float = 0.0
    high_bytes: int | None = None
    sample_peaks_bytes: list[int] = field(default_factory=list)
    estimate_seconds: float = 0.0
    order_peak_bytes: int | None = None
    steps: int = RUN_STEPS
    step_high_bytes: int | None = None

    @property
    def fits(self) -> bool | None:
        """Whether the high bound (else the predicted peak) fits the budget (None: no budget)."""
        if self.budget is None:
            return None
        return (self.high_bytes or self.peak_bytes) <= self.budget.usable_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: sizes in bytes with `_bytes` keys."""
        return json_dict(
            self,
            "batch_size peak_bytes high_bytes steps step_high_bytes sample_peaks_bytes "
            "order_peak_bytes resident_bytes "
            "activations_kept_bytes breakdown per_layer peak_moment what_ifs budget fits "
            "input_shapes trace_seconds estimate_seconds",
            breakdown=suffixed(self.breakdown, "_bytes"),
        )

    def __str__(self) -> str:
        moment = self.peak_moment
        high = (
            f", up to {format_size(self.high_bytes)} over {self.steps} steps"
            if self.high_bytes
            else ""
        )
        return (
            f"batch {self.batch_size}: predicted peak {format_size(self.peak_bytes)}{high} "
            f"(in the {moment.get('phase', '?')} pass at {moment.get('layer') or moment.get('op')})"
        )


def summarise(result: Replay) -> tuple[dict[str, int], list[dict[str, Any]]]:
    breakdown = dict.fromkeys(CATEGORIES, 0)
    layers: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CATEGORIES, 0))
    for item in result.live:
        breakdown[item.category] = breakdown.get(item.category, 0) + item.nbytes
        layers[item.layer or "(other)"][item.category] += item.nbytes
    per_layer = [
        {"layer": name, "bytes": sum(parts.values()), **{f"{k}_bytes": v for k, v in parts.items()}}
        for name, parts in layers.items()
    ]
    per_layer.sort(key=lambda row: -row["bytes"])
    return breakdown, per_layer
