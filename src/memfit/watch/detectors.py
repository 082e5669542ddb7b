"""Detectors: pure functions over the series `memfit.Watch` records.

Nothing here imports TensorFlow: every detector takes plain numbers (the step records that
`Watch` writes to its log, a list of losses) and returns a `WatchFinding` or `None`, so each
one can be tested on synthetic series and rerun on a log.

A step record is a dict with the keys of a log's step line: `step`, `step_seconds`,
`input_wait_seconds`, `memory_current_bytes` (in use after the step), `memory_peak_bytes`
(the step's peak), `traces`, `batch_size` and `input_shape` (the first input's shape).

Noise: thresholds compare a change with the series' own spread, measured robustly as the
median absolute deviation (MAD, scaled by 1.4826 to match a standard deviation for normal
noise), so a noisy but healthy run stays quiet and a clean run's real change is still found.

Example:
    ```python
    from memfit.watch import detectors

    monitor = detectors.LossMonitor()
    for step, loss in enumerate(losses):
        finding = monitor.add(step, loss)
        if finding is not None:
            print(finding.message)
    ```
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memfit.sizes import format_size
from memfit.watch.findings import LR_FIX, PIPELINE_FIX, WatchFinding

# Waiting less than this per step is not worth a finding (taking a batch eagerly costs
# ~0.3-1 ms of Python even from a prefetched pipeline).
MIN_INPUT_WAIT_SECONDS = 0.005
# MAD * 1.4826 estimates the standard deviation of normal noise.
MAD_SCALE = 1.4826


# -- robust statistics --------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    """The median of `values` (NaN when empty)."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return math.nan
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def robust_spread(values: Sequence[float]) -> float:
    """The median absolute deviation of `values`, scaled to a standard deviation."""
    if len(values) < 2:
        return 0.0
    centre = median(values)
    return MAD_SCALE * median([abs(v - centre) for v in values])


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The median of pairwise slopes: a line's slope that outliers do not move."""
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs))
        for j in range(i + 1, len(xs))
        if xs[j] != xs[i]
    ]
    return median(slopes) if slopes else 0.0


def mann_kendall(values: Sequence[float]) -> float:
    """Mann-Kendall's z for a monotonic trend in `values` (about N(0, 1) for pure noise)."""
    n = len(values)
    if n < 3:
        return 0.0
    x = np.asarray(values, dtype=float)
    s = float(np.triu(np.sign(x[None, :] - x[:, None]), k=1).sum())
    variance = n * (n - 1) * (2 * n + 5) / 18
    return (s - float(np.sign(s))) / math.sqrt(variance)


def shape_text(shape: Sequence[Any] | None) -> str:
    """`[16, 256, 256, 3]` -> `16x256x256x3`."""
    return "x".join("?" if d is None else str(d) for d in shape) if shape else "?"


# -- memory: leaks and retracing ----------------------------------------------------------------
class Floors:
    """Window minima of the memory left in use after each step (what a leak raises).

    A window's minimum drops the noise of batches in flight; windows are merged in pairs
    past `limit`, so a long run costs bounded memory and time.

    Args:
        window: steps per window at first.
        limit: windows kept before pairs are merged.
    """

    def __init__(self, window: int = 4, limit: int = 400) -> None:
        self.window = window
        self.limit = limit
        self.values: list[int] = []
        self.steps: list[int] = []
        self.traces: list[int] = []
        self._current: int | None = None
        self._count = 0

    def add(self, step: int, current: int, traces: int) -> bool:
        """Add one step; True when a window closed."""
        self._current = current if self._current is None else min(self._current, current)
        self._count += 1
        if self._count < self.window:
            return False
        self.values.append(self._current)
        self.steps.append(step)
        self.traces.append(traces)
        self._current, self._count = None, 0
        if len(self.values) > self.limit:
            self.values = [
                min(a, b) for a, b in zip(self.values[::2], self.values[1::2], strict=False)
            ]
            self.steps = self.steps[1::2]
            self.traces = self.traces[1::2]
            self.window *= 2
        return True

    def trend(self, min_rise_bytes: int, last: int = 40) -> float | None:
        """Bytes a step the floor rises by over the last `last` windows, when it clearly does.

        The slope is Theil-Sen's; it counts only when the rise it predicts over those windows
        is at least `min_rise_bytes` and four times the spread of the floors around the line.
        """
        values, steps = self.values[-last:], self.steps[-last:]
        if len(values) < 6:
            return None
        slope = theil_sen(steps, values)
        rise = slope * (steps[-1] - steps[0])
        residuals = [v - slope * s for s, v in zip(steps, values, strict=False)]
        if slope <= 0 or rise < max(min_rise_bytes, 4 * robust_spread(residuals)):
            return None
        return slope


def retrace_cause(guarded: bool) -> str:
    """Why a train function is traced again and again."""
    if guarded:
        return (
            "memfit.fit traces its step for each new input shape exactly, and batches keep "
            "arriving with new shapes (each traced function keeps its graph and buffers)"
        )
    return (
        "tf.function traces again for each new input signature: batches with varying shapes "
        "(variable image sizes or sequence lengths, a last smaller batch), Python numbers "
        "passed as arguments, or the model recompiled / train_function reset"
    )


def retrace_fix(guarded: bool) -> str:
    """What to do about retracing (memfit.fit traces per shape and K, Keras per signature)."""
    if guarded:
        return (
            "give batches a few fixed shapes (memfit.fit keeps one traced step per input shape "
            "and micro-batch count): resize or pad images to a few size buckets, batch with "
            "`drop_remainder=True`; or pass micro_batches= up front so an out-of-memory retry "
            "does not trace the step again"
        )
    return (
        "give batches a few fixed shapes: resize or pad to size buckets "
        "(`padded_batch`, `tf.data.experimental.bucket_by_sequence_length`), batch with "
        "`drop_remainder=True`, pass tensors rather than Python numbers, and do not compile "
        "or reset the train function inside the loop"
    )


def retracing(
    step: int,
    traces: int | None,
    traces_at_warmup: int | None,
    warmup_steps: int,
    *,
    guarded: bool = False,
    min_retraces: int = 5,
) -> WatchFinding | None:
    """`retracing` when the train function was traced `min_retraces` times since warm-up.

    Args:
        step: the current step.
        traces: how often the train function has been traced so far.
        traces_at_warmup: the count at the end of warm-up.
        warmup_steps: the warm-up's length in steps.
        guarded: the step is memfit.fit's (its cause and fix differ).
        min_retraces: traces after warm-up that make a finding.
    """
    if traces is None or traces_at_warmup is None:
        return None
    retraces = traces - traces_at_warmup
    if retraces < min_retraces:
        return None
    return WatchFinding(
        kind="retracing",
        step=step,
        epoch=None,
        message=(
            f"the train function was traced again {retraces} times after warm-up "
            f"(in {step - warmup_steps} steps)"
        ),
        cause=retrace_cause(guarded),
        fix=retrace_fix(guarded),
        evidence={
            "traces": traces,
            "retraces_after_warmup": retraces,
            "steps_after_warmup": step - warmup_steps,
        },
    )


def memory_growth(
    floors: Floors,
    step: int,
    *,
    budget_bytes: int | None = None,
    recent_peak_bytes: int | None = None,
    guarded: bool = False,
    growth_bytes: int = 1024 * 1024,
    growth_fraction: float = 0.05,
) -> WatchFinding | None:
    """`memory_growth` when the memory left in use after each step rises steadily.

    The floors (window minima) are split in three; the last third's median must be above the
    first's by `growth_bytes` and `growth_fraction` of it, each third must take part in the
    rise, and no single jump may make most of it (a cache, validation's first run).

    Args:
        floors: the run's `Floors`.
        step: the current step.
        budget_bytes: the budget, to say when it would be used up.
        recent_peak_bytes: the latest steps' peak.
        guarded: the step is memfit.fit's.
        growth_bytes: smallest rise that counts.
        growth_fraction: smallest rise as a share of what was in use at first.
    """
    n = len(floors.values)
    for start in (0, n // 2):
        values = floors.values[start:]
        if len(values) < 6:
            continue
        third = len(values) // 3
        parts = [values[:third], values[third : 2 * third], values[2 * third :]]
        m1, m2, m3 = (median(p) for p in parts)
        rise = m3 - m1
        if rise < max(growth_bytes, growth_fraction * m1):
            continue
        if m2 - m1 < 0.2 * rise or m3 - m2 < 0.2 * rise:
            continue  # one jump (a cache, a new function), not a steady rise
        steps_up = [b - a for a, b in zip(values, values[1:], strict=False)]
        if max(steps_up) > 0.5 * rise or sum(d > 0.05 * rise for d in steps_up) < 3:
            continue  # most of the rise in one jump (validation's first run, a cache)
        steps = floors.steps[start:]
        centre1 = median([float(s) for s in steps[:third]])
        centre3 = median([float(s) for s in steps[2 * third :]])
        per_step = rise / max(1.0, centre3 - centre1)
        traces = floors.traces[start:]
        retraced = traces[-1] - traces[0]
        evidence: dict[str, Any] = {
            "growth_bytes_per_step": int(per_step),
            "rise_bytes": int(rise),
            "from_bytes": int(m1),
            "to_bytes": int(m3),
            "steps": int(steps[-1] - steps[0]),
            "retraces": int(retraced),
        }
        message = (
            f"memory left in use after each step grew by {format_size(int(rise))} "
            f"({format_size(int(m1))} -> {format_size(int(m3))}), about "
            f"{format_size(int(per_step))} per step"
        )
        if budget_bytes:
            left = budget_bytes - (recent_peak_bytes or int(m3))
            steps_left = max(0, int(left / per_step))
            evidence["steps_to_budget"] = steps_left
            message += f"; at this rate the budget is used up in about {steps_left:,} steps"
        if retraced >= 2:
            cause = (
                f"the train function was traced {retraced} more times while memory grew: "
                + retrace_cause(guarded)
            )
            fix = retrace_fix(guarded)
            evidence["cause"] = "retracing"
        else:
            cause = (
                "memory grows while the train function is not retraced: Python keeps "
                "tensors alive from step to step, e.g. a callback or loop appending model "
                "outputs, losses or gradients (tensors) to a list, or a metric accumulated "
                "as a tensor"
            )
            fix = (
                "keep Python numbers (`float(t)`, `t.numpy()`) or running aggregates "
                "instead of tensors, clear such lists every epoch, or use keras.metrics; "
                "check custom callbacks first"
            )
            evidence["cause"] = "python_references"
        return WatchFinding("memory_growth", step, None, message, cause, fix, evidence, "problem")
    return None


def repeated_fits(
    starts: Sequence[int],
    step: int,
    *,
    growth_bytes: int = 1024 * 1024,
    growth_fraction: float = 0.05,
) -> WatchFinding | None:
    """`memory_growth` when the memory in use at the start of fits rose over the last ones.

    Args:
        starts: bytes in use when each fit in this process began, oldest first.
        step: the current step.
        growth_bytes: smallest rise that counts.
        growth_fraction: smallest rise as a share of the first start.
    """
    starts = list(starts)[-4:]
    if len(starts) < 3:
        return None
    rises = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    total = starts[-1] - starts[0]
    if min(rises) <= 0 or total < max(growth_bytes, growth_fraction * starts[0]):
        return None
    return WatchFinding(
        "memory_growth",
        step,
        None,
        f"memory in use when fit starts rose over the last {len(starts)} fits in this "
        f"process: {' -> '.join(format_size(s) for s in starts)}",
        cause=(
            "models are built or fitted again and again in one process, and the old ones "
            "(their weights, optimizer state and traced functions) are still referenced"
        ),
        fix=(
            "drop references to old models and call `keras.backend.clear_session()` and "
            "`gc.collect()` between builds, or run each trial in its own process"
        ),
        evidence={"fit_start_bytes": starts, "rise_bytes": total, "cause": "repeated_fit"},
        severity="problem",
    )


# -- memory: the budget's edge ------------------------------------------------------------------
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


# -- input ----------------------------------------------------------------------------------------
def input_bound(
    steps: Sequence[dict[str, Any]],
    step: int,
    *,
    warmup_steps: int = 5,
    fraction: float = 0.25,
    min_wait_seconds: float = MIN_INPUT_WAIT_SECONDS,
) -> WatchFinding | None:
    """`input_bound` when waiting for the next batch takes `fraction` of recent steps.

    Steps that traced the train function again are left out (slow for another reason).

    Args:
        steps: the step records so far.
        step: the current step.
        warmup_steps: steps at the start to leave out.
        fraction: share of step time spent waiting that makes a finding.
        min_wait_seconds: and at least this wait a step.
    """
    recent = [
        s
        for s in steps[-60:]
        if s["step"] >= warmup_steps and s.get("input_wait_seconds") is not None
    ]
    recent = [
        s
        for i, s in enumerate(recent)
        if i == 0 or s.get("traces") is None or s["traces"] == recent[i - 1].get("traces")
    ]
    if len(recent) < 20:
        return None
    wait = sum(s["input_wait_seconds"] for s in recent)
    total = sum(s["step_seconds"] for s in recent)
    if total <= 0:
        return None
    share = wait / total
    mean_wait = wait / len(recent)
    if share < fraction or mean_wait < min_wait_seconds:
        return None
    return WatchFinding(
        "input_bound",
        step,
        None,
        f"{100 * share:.0f}% of each step is spent waiting for the next batch "
        f"({1000 * mean_wait:.1f} ms of {1000 * total / len(recent):.1f} ms); the device "
        f"idles meanwhile",
        cause=(
            "the input pipeline produces batches slower than the model consumes them: a "
            "`map` without `num_parallel_calls`, no `prefetch`, Python in the pipeline, "
            "or data read from slow storage on every epoch"
        ),
        fix=PIPELINE_FIX,
        evidence={
            "input_wait_fraction": round(share, 4),
            "input_wait_seconds": round(mean_wait, 6),
            "step_seconds": round(total / len(recent), 6),
            "steps": len(recent),
        },
    )


# -- loss -----------------------------------------------------------------------------------------
@dataclass
class LossMonitor:
    """Divergence and non-finite losses, fed one step's loss at a time.

    Patterns, each judged against the loss's own noise (its robust spread over the last
    `window` steps) and against where it started (the median of the first 3 losses; a
    divergence is a loss above its start):

    - `explosion`: two losses in a row above `explosion_factor` times both the start and
      the median of the losses before them (found at once: the run is lost);
    - `spike`: a loss above `spike_factor` times the recent median and `noise_sigmas`
      spreads above it, *and* most of the next `confirm_steps` losses stay up there (one
      bad batch, or a warm-up's short spike, is not a divergence);
    - `increase`: over the last `trend_window` losses (or 2 or 4 times as many) a
      Mann-Kendall trend test finds a rise (z above `trend_z`: noise alone gets there about
      once in 30,000 tests), and the last
      `2 * block` losses' median is 20% above both the window's first and the start;
    - `plateau`: after `plateau_steps`, the median of the last 50 is not below 97% of the
      start (noise-aware: by three standard errors of that median).

    Args:
        spike_factor: see `spike`.
        explosion_factor: see `explosion`.
        noise_sigmas: robust spreads (or standard errors) a change must exceed.
        confirm_steps: steps after a spike that must mostly stay up.
        window: losses the recent median and spread are taken over.
        block: half the stretch whose median `increase` compares.
        trend_window: losses the `increase` trend test looks at.
        trend_z: the trend test's threshold.
        plateau_steps: steps before `plateau` can hold.

    Example:
        ```python
        monitor = LossMonitor()
        findings = [f for s, loss in enumerate(losses) if (f := monitor.add(s, loss))]
        ```
    """

    spike_factor: float = 3.0
    explosion_factor: float = 10.0
    noise_sigmas: float = 6.0
    confirm_steps: int = 8
    window: int = 20
    block: int = 10
    trend_window: int = 60
    trend_z: float = 4.0
    plateau_steps: int = 200
    history: list[float] = field(default_factory=list)
    fired: set[str] = field(default_factory=set)
    _candidate: tuple[int, int, float, float, float] | None = None  # (step, index, loss, med, thr)

    def add(
        self, step: int, loss: float, epoch: int | None = None, extra: dict[str, Any] | None = None
    ) -> WatchFinding | None:
        """Take one step's loss; a finding the first time a pattern holds.

        Args:
            step: the step.
            loss: its loss (the step's own, not a running mean).
            epoch: its epoch.
            extra: evidence to add (e.g. the learning rate).
        """
        extra = extra or {}
        history = self.history
        if not math.isfinite(loss):
            if "non_finite_loss" in self.fired:
                return None
            self.fired.add("non_finite_loss")
            last = history[-1] if history else None
            return WatchFinding(
                "non_finite_loss",
                step,
                epoch,
                f"the loss is {loss}"
                + (f" (the last finite loss was {last:.4g})" if last is not None else ""),
                cause=(
                    "the weights or activations overflowed: a learning rate too high for "
                    "the model, no warm-up, exploding gradients, or invalid inputs/labels "
                    "(NaN in the data, a log of 0)"
                ),
                fix=LR_FIX + "; check the data for NaN/Inf",
                evidence={"loss": str(loss), "last_finite_loss": last, **extra},
                severity="problem",
            )
        history.append(float(loss))
        n = len(history)
        if "divergence" in self.fired or n < 2:
            return None
        base = median(history[:3]) if n > 3 else history[0]
        previous = history[-self.window - 1 : -1]
        recent = median(previous)
        found = self._explosion(step, loss, base, recent)
        if found is None:
            found = self._spike(step, loss, base, recent, previous)
        if found is None and n % self.block == 0:
            found = self._increase(step, base)
        if found is None and n >= self.plateau_steps:
            found = self._plateau(step, base)
        if found is None:
            return None
        pattern, at, message, evidence = found
        self.fired.add("divergence")
        return self._finding(pattern, at, epoch, message, {**evidence, **extra})

    def _explosion(
        self, step: int, loss: float, base: float, recent: float
    ) -> tuple[str, int, str, dict[str, Any]] | None:
        history = self.history
        if len(history) < 3:
            return None
        before = history[-2]
        # Both losses against the stretch before them (the first one would lift a median).
        earlier = median(history[-self.window - 2 : -2])
        limit = self.explosion_factor * max(base, earlier)
        if loss > limit and before > limit and loss > 1e-6:
            return (
                "explosion",
                step - 1,
                f"the loss exploded to {before:.4g} and {loss:.4g}, over "
                f"{self.explosion_factor:.0f}x where it was ({max(base, earlier):.4g}; it "
                f"started at {base:.4g})",
                {"loss": loss, "start_loss": base, "recent_median_loss": earlier},
            )
        return None

    def _spike(
        self, step: int, loss: float, base: float, recent: float, previous: list[float]
    ) -> tuple[str, int, str, dict[str, Any]] | None:
        history = self.history
        n = len(history)
        if self._candidate is None:
            threshold = max(self.spike_factor * recent, 1.5 * base)
            if n <= 5 or loss <= threshold or loss <= 1e-6:
                return None
            # The spread only for a candidate: it costs two sorts, and most steps are not.
            threshold = max(threshold, recent + self.noise_sigmas * robust_spread(previous))
            if loss > threshold:
                self._candidate = (step, n - 1, loss, recent, threshold)
            return None
        at, index, first, med, threshold = self._candidate
        after = history[index:]
        if len(after) < self.confirm_steps:
            return None
        self._candidate = None
        up = sum(v > threshold for v in after[: self.confirm_steps])
        if 2 * up <= self.confirm_steps:
            return None  # it came back down: one bad batch or a warm-up's spike
        level = median(after[: self.confirm_steps])
        return (
            "spike",
            at,
            f"the loss jumped to {first:.4g}, {first / med:.1f}x its recent median {med:.4g}, "
            f"and stayed up ({up} of the next {self.confirm_steps} steps, median {level:.4g}; "
            f"it started at {base:.4g})",
            {"loss": first, "start_loss": base, "recent_median_loss": med, "level_loss": level},
        )

    def _increase(self, step: int, base: float) -> tuple[str, int, str, dict[str, Any]] | None:
        for size in (self.trend_window, 2 * self.trend_window, 4 * self.trend_window):
            window = self.history[-size:]
            if len(window) < size:
                return None
            z = mann_kendall(window)
            head, tail = median(window[: 2 * self.block]), median(window[-2 * self.block :])
            if z >= self.trend_z and tail >= 1.2 * base and tail >= 1.2 * head:
                return (
                    "increase",
                    step,
                    f"the loss is climbing: median {head:.4g} -> {tail:.4g} over the last "
                    f"{size} steps, a rise far beyond its noise (trend test z = {z:.1f}); it "
                    f"started at {base:.4g}",
                    {
                        "loss": tail,
                        "start_loss": base,
                        "recent_median_loss": head,
                        "trend_z": round(z, 2),
                    },
                )
        return None

    def _plateau(self, step: int, base: float) -> tuple[str, int, str, dict[str, Any]] | None:
        last = self.history[-50:]
        level = median(last)
        error = 1.2533 * robust_spread(last) / math.sqrt(len(last))
        if level < 0.97 * base or level < base - 3 * error:
            return None
        return (
            "plateau",
            step,
            f"the loss has not fallen in {len(self.history)} steps: median of the last 50 "
            f"is {level:.4g}, it started at {base:.4g}",
            {"loss": level, "start_loss": base, "recent_median_loss": level},
        )

    def _finding(
        self, pattern: str, step: int, epoch: int | None, message: str, evidence: dict[str, Any]
    ) -> WatchFinding:
        cause = {
            "explosion": "updates far too large: the learning rate is too high for this "
            "model (or was not warmed up), or gradients exploded",
            "spike": "updates too large for the loss surface: the learning rate is too high "
            "(or was not warmed up), or a bad batch produced huge gradients",
            "increase": "the optimizer is overshooting: the learning rate is too high for "
            "this model and batch",
            "plateau": "the model is not learning: a learning rate far too high (bouncing) or "
            "too low, dead activations after a blow-up, or labels that do not match the loss",
        }[pattern]
        fix = (
            LR_FIX
            if pattern != "plateau"
            else (
                "try learning rates 10x lower and 10x higher on a short run, add a warm-up, and "
                "check that labels match the loss (e.g. sparse vs one-hot, from_logits)"
            )
        )
        return WatchFinding(
            "divergence",
            step,
            epoch,
            message,
            cause,
            fix,
            {"pattern": pattern, **evidence},
            "problem",
        )


# -- out of memory --------------------------------------------------------------------------------
@dataclass
class OomDiagnosis:
    """Why a step ran out of memory, from the steps before it, and the fix in numbers.

    Attributes:
        cause: `first_step`, `budget`, `input_shape`, `batch_size`, `memory_growth` or
            `near_limit` (nothing changed: the same step fitted before, at the edge).
        text: the cause in words, with the numbers.
        fix: what to do, with the numbers.
        evidence: the numbers (`_bytes`, shapes, the largest batch, the side, K).
    """

    cause: str
    text: str
    fix: str
    evidence: dict[str, Any]


def _per_sample(shape: Sequence[Any] | None) -> int | None:
    if not shape or len(shape) < 2 or any(not isinstance(d, int) for d in shape[1:]):
        return None
    return math.prod(shape[1:])


def _pixels(shape: Sequence[Any] | None) -> tuple[int, int] | None:
    if shape and len(shape) == 4 and all(isinstance(d, int) for d in shape[1:3]):
        return int(shape[1]), int(shape[2])
    return None


def diagnose_oom(
    steps: Sequence[dict[str, Any]],
    *,
    input_shape: Sequence[Any] | None,
    batch_size: int | None,
    budget_bytes: int | None,
    start_budget_bytes: int | None = None,
    guarded: bool = False,
    margin: float = 0.1,
) -> OomDiagnosis:
    """Compare a step that ran out of memory with the steps before it; the fix in numbers.

    What changed, checked in this order: the budget (another process took memory), the
    input's shape per sample (larger images), the batch size, the memory in use before the
    step (growth); when nothing did, the step ran at the edge; with no step before, the
    configuration never fitted. The fix comes from how the recorded peaks scale: the step's
    peak less the memory in use is taken as proportional to batch x elements per sample
    (measured on the steps at the last shape), which gives the largest batch at the failing
    input size, the image side that fits at the failing batch, and the micro-batches K that
    `memfit.fit` needs, each leaving `margin` of the budget free.

    Args:
        steps: the records of the steps that completed before, oldest first.
        input_shape: the failing batch's first input shape (e.g. `[16, 256, 256, 3]`).
        batch_size: its batch size.
        budget_bytes: the budget now.
        start_budget_bytes: the budget when training began (a drop: another process).
        guarded: the step is memfit.fit's (its fix is worded for it).
        margin: share of the budget the suggested sizes leave free.

    Example:
        ```python
        d = diagnose_oom(records, input_shape=[16, 256, 256, 3], batch_size=16,
                         budget_bytes=900 * 2**20)
        print(d.cause, d.evidence["largest_batch_size"], d.fix)
        ```
    """
    if not batch_size and input_shape and isinstance(input_shape[0], int):
        batch_size = input_shape[0]
    batch = batch_size
    shape = list(input_shape) if input_shape else None
    evidence: dict[str, Any] = {
        "input_shape": shape,
        "batch_size": batch,
        "budget_bytes": budget_bytes,
    }
    known = [s for s in steps if s.get("memory_peak_bytes") and s.get("memory_current_bytes")]
    if not steps:
        evidence["cause"] = "first_step"
        text = (
            f"the first step, on {shape_text(shape)} batches, ran out of memory: this "
            f"configuration never fitted"
            + (f" the budget of {format_size(budget_bytes)}" if budget_bytes else "")
        )
        fix = (
            "memfit.fit finds the micro-batches it needs by itself and keeps the effective "
            "batch; to choose a batch or image size up front, measure it: `memfit batch MODEL "
            "--memory <budget>` gives the largest batch that fits, `memfit estimate` what each "
            "part of the step takes"
            if not guarded
            else "even one sample per micro-batch does not fit from the first step: use "
            "smaller inputs, mixed precision or recompute (`memfit plan`), or a card with more "
            "memory"
        )
        return OomDiagnosis("first_step", text, fix, evidence)

    last = steps[-1]
    prev_shape = last.get("input_shape")
    prev_batch = last.get("batch_size") or (prev_shape[0] if prev_shape else None)
    before = last.get("memory_current_bytes")
    evidence.update({"previous_input_shape": prev_shape, "previous_batch_size": prev_batch})
    if before is not None:
        evidence["in_use_before_bytes"] = int(before)

    # How the step's memory scales, from the steps at the last shape.
    ref = [s for s in known if s.get("input_shape") == prev_shape]
    if len(ref) >= 3:
        ref = ref[1:]  # the first step at a shape carries one-time allocations
    ref = ref[-20:]
    per_element = None
    elems, prev_elems = _per_sample(shape), _per_sample(prev_shape)
    if ref and prev_elems and prev_batch:
        ref_peak = median([s["memory_peak_bytes"] for s in ref])
        ref_floor = median([s["memory_current_bytes"] for s in ref])
        if ref_peak > ref_floor:
            per_element = (ref_peak - ref_floor) / (prev_batch * prev_elems)
            evidence["reference_peak_bytes"] = int(ref_peak)
            evidence["reference_in_use_bytes"] = int(ref_floor)
    early = [s["memory_current_bytes"] for s in known[1:6]] or [
        s["memory_current_bytes"] for s in known[:1]
    ]
    early_floor = median(early) if early else None
    base_floor = before if before is not None else early_floor

    changes: list[str] = []
    cause = "near_limit"
    if start_budget_bytes and budget_bytes and budget_bytes < 0.95 * start_budget_bytes:
        cause = "budget"
        changes.append(
            f"the budget fell from {format_size(start_budget_bytes)} to "
            f"{format_size(budget_bytes)} (another process took device memory)"
        )
    if elems and prev_elems and elems > 1.05 * prev_elems:
        cause = cause if changes else "input_shape"
        pixels, prev_pixels = _pixels(shape), _pixels(prev_shape)
        what = "pixels" if pixels and prev_pixels else "elements per sample"
        changes.append(
            f"the batch is {shape_text(shape)}, {elems / prev_elems:.3g}x the {what} of the "
            f"earlier {shape_text(prev_shape)} batches"
        )
        evidence["size_ratio"] = round(elems / prev_elems, 4)
    if batch and prev_batch and batch > prev_batch:
        cause = cause if changes else "batch_size"
        changes.append(f"the batch size rose from {prev_batch} to {batch}")
    growth = (before - early_floor) if before is not None and early_floor is not None else 0
    if growth > 0 and budget_bytes and growth >= 0.05 * budget_bytes:
        evidence["growth_bytes"] = int(growth)
        if not changes:
            cause = "memory_growth"
            base_floor = early_floor
        changes.append(
            f"memory in use before the step rose from {format_size(int(early_floor or 0))} to "
            f"{format_size(int(before or 0))} over {len(steps)} steps"
        )
    evidence["cause"] = cause

    # The fix, in numbers.
    sizes: dict[str, Any] = {}
    if per_element and elems and batch and budget_bytes and base_floor is not None:
        avail = (1 - margin) * budget_bytes - base_floor
        per_sample = per_element * elems
        predicted = base_floor + per_sample * batch
        sizes["per_sample_bytes"] = int(per_sample)
        sizes["predicted_peak_bytes"] = int(predicted)
        largest = max(0, int(avail // per_sample))
        sizes["largest_batch_size"] = largest
        if largest >= 1:
            sizes["micro_batches"] = math.ceil(batch / largest)
        pixels = _pixels(shape)
        if pixels and avail > 0:
            target_batch = 1 if guarded and largest < 1 else batch
            scale = math.sqrt(avail / (per_element * target_batch * elems))
            h, w = (_round_side(d * scale) for d in pixels)
            if 1 <= h < pixels[0] and 1 <= w < pixels[1]:  # a smaller side is the fix
                sizes["fitting_side"] = [h, w]
                sizes["fitting_side_batch_size"] = target_batch
    evidence.update(sizes)

    if cause == "near_limit":
        peaks = [s["memory_peak_bytes"] for s in known[-20:]]
        top = max(peaks) if peaks else None
        text = (
            f"nothing changed: the same {shape_text(shape)} step fitted "
            f"{len(ref) or len(steps)} times before"
            + (
                f", with peaks up to {format_size(top)} ({100 * top / budget_bytes:.0f}% of the "
                f"budget {format_size(budget_bytes)})"
                if top and budget_bytes
                else ""
            )
            + "; near the limit a step's peak moves from step to step (allocator state, op "
            "order), and this one went over"
        )
    else:
        text = "; ".join(changes)
    if cause == "memory_growth":
        text += " while the batch stayed the same: something keeps memory from step to step"
    fix = _oom_fix(cause, sizes, shape, batch, guarded, margin)
    return OomDiagnosis(cause, text, fix, evidence)


def _round_side(value: float) -> int:
    side = int(math.floor(value))
    return side - side % 8 if side >= 32 else side


def _oom_fix(
    cause: str,
    sizes: dict[str, Any],
    shape: Sequence[Any] | None,
    batch: int | None,
    guarded: bool,
    margin: float,
) -> str:
    parts: list[str] = []
    at = shape_text(list(shape[1:])) if shape else "this input size"
    if cause == "memory_growth":
        parts.append(
            "find what keeps memory from step to step (tensors appended to Python lists in a "
            "callback or loop, retracing with new shapes) and keep Python numbers instead; "
            "at the memory in use when training started the step fitted"
        )
    if cause == "budget":
        parts.append(
            "stop the other process or pick another device (`memfit doctor` lists who holds "
            "the GPU's memory)"
        )
    largest = sizes.get("largest_batch_size")
    k = sizes.get("micro_batches")
    side = sizes.get("fitting_side")
    spare = f"leaving {100 * margin:.0f}% of the budget free"
    if guarded:
        if k and batch and 1 < k <= batch:
            parts.append(
                f"nothing is lost: memfit.fit splits these batches; pass micro_batches={k} "
                f"(micro-batches of {math.ceil(batch / k)}) to start there without the retry "
                f"(from the measured peaks, {largest} samples of {at} fit, {spare})"
            )
        if side:
            parts.append(
                f"or resize the images to {side[0]}x{side[1]} (fits at "
                f"{sizes.get('fitting_side_batch_size')} a micro-batch)"
            )
    else:
        if largest is not None and largest >= 1:
            parts.append(
                f"from the measured peaks, the largest batch at {at} is about {largest} ({spare})"
            )
        if side and batch:
            parts.append(f"images of {side[0]}x{side[1]} fit at batch {batch}")
        if k and batch and k > 1:
            parts.append(
                f"or keep batch {batch} with memfit.fit(model, ..., micro_batches={k}) "
                f"({k} micro-batches of {math.ceil(batch / k)}; it also recovers from an OOM "
                f"by itself)"
            )
    if not parts:
        parts.append(
            "train with memfit.fit (it splits the batch into micro-batches on OOM without "
            "losing progress), find the largest batch that fits with `memfit batch`, or use "
            "mixed precision or smaller inputs"
        )
    return "; ".join(parts)
