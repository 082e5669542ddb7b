"""The budget's edge: a peak that nearly fills the budget or whose trend will reach it
(`near_budget`), and steps at the edge that are markedly slower (`thrashing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.sizes import format_size
from memfit.watch.detectors.growth import Floors
from memfit.watch.detectors.stats import median, robust_spread
from memfit.watch.findings import WatchFinding


def near_budget(
    steps: Sequence[dict[str, Any]],
    step: int,
    *,
    budget_bytes: int,
    floors: Floors | None = None,
    headroom: float = 0.1,
    planned_steps: int | None = None,
    growth_bytes: int = 1024 * 1024,
) -> WatchFinding | None:
    """`near_budget` when the peak nearly fills the budget, or its trend will reach it.

    It holds when the latest steps' peak leaves less than `headroom` of the budget free, or
    when the memory left in use after each step rises steadily (`Floors.trend`) and at that
    rate the peak reaches the budget before training ends (`planned_steps`; without it,
    within ten times the steps run so far). The message says in about how many steps.

    Args:
        steps: the step records so far.
        step: the current step.
        budget_bytes: the budget.
        floors: the run's `Floors`, for the trend.
        headroom: the share of the budget that must stay free.
        planned_steps: steps the whole fit will run, when known.
        growth_bytes: smallest rise over the trend's windows that counts.
    """
    recent = [s for s in steps[-5:] if s.get("memory_peak_bytes")]
    if not recent or not budget_bytes:
        return None
    peak = max(s["memory_peak_bytes"] for s in recent)
    batch_size = recent[-1].get("batch_size")
    slope = floors.trend(growth_bytes) if floors is not None else None
    steps_to_oom = None
    if slope:
        steps_to_oom = max(0, int((budget_bytes - peak) / slope))
    close = peak >= (1 - headroom) * budget_bytes
    horizon = (planned_steps - step) if planned_steps else 10 * (step + 1)
    trending = steps_to_oom is not None and steps_to_oom <= horizon
    if not close and not trending:
        return None
    evidence: dict[str, Any] = {
        "peak_bytes": int(peak),
        "budget_bytes": int(budget_bytes),
        "headroom_fraction": round(1 - peak / budget_bytes, 4),
        "batch_size": batch_size,
    }
    if peak < budget_bytes:
        message = (
            f"the step's peak {format_size(peak)} leaves {100 * (1 - peak / budget_bytes):.1f}% "
            f"of the budget {format_size(budget_bytes)} free"
        )
    else:
        message = (
            f"the step's peak {format_size(peak)} is above the budget {format_size(budget_bytes)}"
        )
    floor = min(s.get("memory_current_bytes") or peak for s in steps[-10:])
    if close and batch_size and peak > floor:
        per_sample = (peak - floor) / batch_size
        oom_batch = int((budget_bytes - floor) / per_sample) + 1
        evidence["per_sample_bytes"] = int(per_sample)
        evidence["oom_batch_size"] = oom_batch
        message += f"; a batch of about {oom_batch} (or larger inputs) would not fit"
    if steps_to_oom is not None:
        evidence["growth_bytes_per_step"] = int(slope or 0)
        evidence["steps_to_oom"] = steps_to_oom
        evidence["oom_step"] = step + steps_to_oom
        message += (
            f"; memory in use rises about {format_size(int(slope or 0))} a step: at this rate, "
            f"out of memory in about {steps_to_oom:,} steps (near step {step + steps_to_oom:,})"
        )
        cause = (
            "memory left in use after each step keeps rising (tensors kept alive from step "
            "to step, or retracing), so the same step will soon not fit"
        )
        fix = (
            "find what keeps memory (see a memory_growth finding; `keras.backend."
            "clear_session()`, keep Python numbers rather than tensors); until then, train "
            "with memfit.fit, which splits a step that no longer fits into micro-batches"
        )
    else:
        cause = (
            "activations for this batch and input size nearly fill the device; a larger "
            "batch, larger inputs (a later shard of bigger images) or memory fragmentation "
            "will run out of memory"
        )
        fix = (
            "train with memfit.fit (it splits a batch that does not fit into micro-batches "
            "and keeps the effective batch), or lower the batch (`memfit batch` finds the "
            "largest that fits), or use mixed precision"
        )
    return WatchFinding("near_budget", step, None, message, cause, fix, evidence)


def thrashing(
    steps: Sequence[dict[str, Any]],
    step: int,
    *,
    budget_bytes: int,
    edge: float = 0.95,
    slowdown: float = 1.5,
    window: int = 200,
) -> WatchFinding | None:
    """`thrashing` when steps at the budget's edge are also markedly slower.

    Steps whose peak is above `edge` of the budget are compared with the steps of the same
    input shape below 90% of it: their median time must be `slowdown` times as long, and
    longer by four robust spreads of the calm steps' times (a noisy step time is not a jump).
    Near the edge the allocator works: it frees cached blocks, retries allocations and (on
    the BFC allocator) waits for memory; the next larger step runs out.

    Args:
        steps: the step records so far.
        step: the current step.
        budget_bytes: the budget.
        edge: the share of the budget from which a step is at the edge.
        slowdown: how much slower edge steps must be.
        window: how many recent steps to look at.
    """
    recent = [s for s in steps[-window:] if s.get("memory_peak_bytes") and s.get("step_seconds")]
    hot = [s for s in recent if s["memory_peak_bytes"] >= edge * budget_bytes]
    if len(hot) < 3:
        return None
    shape = hot[-1].get("input_shape")
    hot = [s for s in hot if s.get("input_shape") == shape]
    calm = [
        s
        for s in recent
        if s["memory_peak_bytes"] < 0.9 * budget_bytes and s.get("input_shape") == shape
    ]
    if len(hot) < 3 or len(calm) < 5:
        return None
    hot_time = median([s["step_seconds"] for s in hot])
    calm_times = [s["step_seconds"] for s in calm]
    calm_time = median(calm_times)
    if hot_time < slowdown * calm_time or hot_time < calm_time + 4 * robust_spread(calm_times):
        return None
    peak = median([s["memory_peak_bytes"] for s in hot])
    return WatchFinding(
        "thrashing",
        step,
        None,
        f"{len(hot)} of the last {len(recent)} steps peaked above {100 * edge:.0f}% of the "
        f"budget {format_size(budget_bytes)} (median {format_size(int(peak))}) and took "
        f"{hot_time / calm_time:.1f}x as long as the steps below 90% "
        f"({1000 * hot_time:.0f} ms vs {1000 * calm_time:.0f} ms)",
        cause=(
            "the allocator is working at the edge of the budget: it frees cached blocks, "
            "retries allocations and waits for memory, which costs time on every such step; "
            "a slightly larger step will run out of memory"
        ),
        fix=(
            "keep the peak below 90% of the budget: lower the batch (`memfit batch` finds the "
            "largest that fits with a margin), or train with memfit.fit and micro_batches=2, "
            "or use mixed precision"
        ),
        evidence={
            "edge_steps": len(hot),
            "steps": len(recent),
            "edge_peak_bytes": int(peak),
            "budget_bytes": int(budget_bytes),
            "edge_step_seconds": round(hot_time, 6),
            "calm_step_seconds": round(calm_time, 6),
            "slowdown": round(hot_time / calm_time, 3),
        },
    )
