"""Memory growth: what is left in use after each step rising steadily (a leak), and memory in
use at the start of repeated fits rising.

`Floors` keeps the window minima of the memory in use after each step (what a leak raises),
which `near_budget` also reads for its trend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.sizes import format_size
from memfit.watch.detectors.stats import median, robust_spread, theil_sen
from memfit.watch.detectors.tracing import retrace_cause, retrace_fix
from memfit.watch.findings import WatchFinding


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
