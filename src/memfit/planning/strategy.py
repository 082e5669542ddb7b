"""The planner's decisions: pure arithmetic on configurations, K, peaks and step times.

Nothing here estimates, measures, starts a process or imports TensorFlow: each function
takes a batch size, peaks (bytes), limits, step times or a callback that measures one K, and
returns the K worth trying, a first guess of K, a rough cost, an expected time, a queue
position or whether a peak is near enough the limit to measure. `memfit.planning.planner`
runs the estimates, measurements and confirmations (`memfit.planning.trials`) and asks these
what to do next, so every decision has fast tests of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

# The recompute the planner tries: none, memfit's own (`memfit.recompute(model, "sqrt")`)
# and two of Keras' modes ("full" is left out: on the TF backend it raised inside
# Functional.call; "list_of_layers" needs names the planner cannot choose).
REMAT_MODES: tuple[str | None, ...] = (None, "memfit", "larger_than", "activations")
# Finalists measured when several configurations could be the fastest; confirmations tried.
MAX_FINALISTS = 3
MAX_CONFIRMATIONS = 4
# A smaller K predicted within this share over the limit is measured too (estimates miss).
NEAR_LIMIT = 0.08
# Rough time per step relative to float32 without recompute, for the order in which
# configurations are estimated and measured (measured times decide). Reduced precision has
# no fast kernels on CPUs (MobileNetV2 160 px, 2 cores: mixed_float16 1.1x, mixed_bfloat16
# 3.3x float32's time); on GPUs it is the faster one. Recompute adds forward passes.
PRECISION_COST = {
    "CPU": {"float32": 1.0, "mixed_float16": 1.6, "mixed_bfloat16": 1.8},
    "GPU": {"float32": 1.0, "mixed_float16": 0.6, "mixed_bfloat16": 0.7},
}
REMAT_COST = {
    "memfit": 1.25,
    "activations": 1.15,
    "list_of_layers": 1.2,
    "larger_than": 1.25,
    "full": 1.35,
}


class Fitting(Protocol):
    """Anything measured at one K that says whether it fits (a `Candidate`)."""

    fits: bool


T = TypeVar("T", bound=Fitting)


def k_values(batch_size: int) -> list[int]:
    """The K worth trying: each gives a different micro-batch size (doubling, then 1 sample).

    Example:
        >>> k_values(12)
        [1, 2, 4, 8, 12]
    """
    values, k = [], 1
    while k < batch_size:
        values.append(k)
        k *= 2
    return [*values, batch_size]


def dividing_k_values(batch_size: int) -> list[int]:
    """The K that split the batch into equal micro-batches: for steps that need a static
    batch size (the Model Garden's Mask R-CNN samplers), which an unequal split breaks.

    Example:
        >>> dividing_k_values(12)
        [1, 2, 3, 4, 6, 12]
    """
    return [k for k in range(1, batch_size + 1) if batch_size % k == 0]



def step_cost(device: str, precision: str, remat: str | None, k: int) -> float:
    """Rough time per step relative to float32 without recompute, unsplit.

    Args:
        device: `"CPU"` or `"GPU"` (reduced precision is dearer on a CPU, cheaper on a GPU).
        precision: the dtype policy.
        remat: the recompute mode, or None.
        k: micro-batches per step (each doubling adds 15%).
    """
    base = PRECISION_COST[device].get(precision, 1.0)
    return base * REMAT_COST.get(remat or "", 1.0) * (1 + 0.15 * math.log2(k))


def scaled_seconds(basis_seconds: float, basis_cost: float, cost: float) -> float:
    """Seconds per batch of a configuration not measured, from a measured one of the same
    precision and recompute (`basis_seconds` at `basis_cost`), by the ratio of their costs."""
    return basis_seconds * (cost / basis_cost)


def first_k_index(
    ks: Sequence[int], batch_size: int, peak_at_first: int, resident: int, limit: int
) -> int:
    """Index in `ks` of the first K predicted to fit, from the peak predicted at `ks[0]`.

    Peaks grow about linearly in the micro-batch: what is not `resident` (weights, optimizer
    state, the batch) is taken as `batch_size` samples' worth at `ks[0]` (K=1), so K fits
    when `resident + per_sample * ceil(batch_size / K)` is within `limit`. When none is
    predicted to fit, the last index (one sample per micro-batch).
    """
    per_sample = (peak_at_first - resident) / batch_size
    return next(
        (i for i, k in enumerate(ks) if resident + per_sample * math.ceil(batch_size / k) <= limit),
        len(ks) - 1,
    )


def near_limit(predicted_peak: int | None, limit: int) -> bool:
    """Whether a K predicted over the limit is within `NEAR_LIMIT` of it: worth measuring,
    since estimates miss by a few percent."""
    return predicted_peak is not None and predicted_peak <= limit * (1 + NEAR_LIMIT)


def queue_position(expected: Sequence[float], seconds: float) -> int:
    """Where a candidate expected to take `seconds` goes in a queue whose candidates are
    expected to take `expected`: before the first slower one (after equals)."""
    return next((i for i, other in enumerate(expected) if other > seconds), len(expected))


def smallest_fitting_k(
    measure_k: Callable[[int], T],
    ks: Sequence[int],
    hint: int,
    up_only: bool = False,
) -> T | None:
    """Walk K from the one nearest `hint`: down while it still fits (unless `up_only`), up
    until it fits; the smallest K seen to fit, or None.

    Args:
        measure_k: measures one K, returning something with `fits`.
        ks: the K worth trying, ascending (`k_values`).
        hint: where to start.
        up_only: only walk up (the K below was already seen not to fit).
    """
    index = min(range(len(ks)), key=lambda i: abs(ks[i] - hint))
    first = measure_k(ks[index])
    if first.fits:
        best = first
        while index > 0 and not up_only:
            index -= 1
            candidate = measure_k(ks[index])
            if not candidate.fits:
                break
            best = candidate
        return best
    while index + 1 < len(ks):
        index += 1
        candidate = measure_k(ks[index])
        if candidate.fits:
            return candidate
    return None


def skipped_note(skipped: Sequence[tuple[str, str | None]], device: str) -> str:
    """What was not estimated and why, for people ("" when nothing was skipped).

    Args:
        skipped: the (precision, remat) configurations left out.
        device: `"CPU"` or `"GPU"`.
    """
    if not skipped:
        return ""
    precisions = sorted({p for p, _ in skipped} - {"float32"})
    modes = sorted({r for _, r in skipped if r})
    names = " and ".join(
        part
        for part in (", ".join(precisions), f"remat {', '.join(modes)}" if modes else "")
        if part
    )
    return (
        f"Not estimated: {len(skipped)} configuration"
        f"{'s' if len(skipped) > 1 else ''} ({names}): more time per step "
        f"on this {device}, and none can need fewer micro-batches than the one found"
    )
