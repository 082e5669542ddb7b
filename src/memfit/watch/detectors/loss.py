"""Loss: divergence (explosion, spike, steady increase, plateau) and non-finite losses, each
judged against the loss's own noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from memfit.watch.detectors.stats import mann_kendall, median, robust_spread
from memfit.watch.findings import LR_FIX, WatchFinding


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
