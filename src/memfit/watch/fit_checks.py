"""The detectors of one watched fit: which run after each step and loss, and what has fired.

`memfit.Watch` makes a `FitChecks` per fit and hands it each step record and each step's
loss; it runs the detectors of `memfit.watch.detectors` that apply (memory only after the
warm-up steps, each kind until it has fired once) and passes what they find to `report`.
The detectors are pure functions; this module holds their per-fit state (the memory floors,
the loss history, the trace count at the end of warm-up). No TensorFlow here.

Example:
    ```python
    found = []
    checks = FitChecks(found.append)
    for record in steps:
        checks.after_step(steps[: record["step"] + 1], record, budget_bytes=2**30)
    ```
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import memfit.watch.detectors as detectors
from memfit.watch.findings import WatchFinding

# Process-wide: the memory left in use when each fit began (repeated fits / model builds).
_FIT_STARTS: list[int] = []


@dataclass(frozen=True)
class Thresholds:
    """When the detectors of a watched fit fire: `memfit.Watch`'s keyword arguments, once.

    Args:
        warmup_steps: steps ignored by the memory and input detectors at the start.
        headroom: `near_budget` when the peak leaves less than this share of the budget.
        input_bound_fraction: `input_bound` when waiting takes at least this share of a step.
        growth_bytes: `memory_growth` needs at least this rise of the memory left in use...
        growth_fraction: ... and at least this share of what was in use after warm-up.
        spike_factor: `divergence` (spike) needs a loss this many times the recent median.
        plateau_steps: `divergence` (plateau) after this many steps without progress.

    Example:
        >>> Thresholds(headroom=0.2).warmup_steps
        5
    """

    warmup_steps: int = 5
    headroom: float = 0.1
    input_bound_fraction: float = 0.25
    growth_bytes: int = 1024 * 1024
    growth_fraction: float = 0.05
    spike_factor: float = 3.0
    plateau_steps: int = 200


class FitChecks:
    """Runs the detectors on one fit's steps and losses; each finding goes to `report`.

    `report` is expected to add each finding's kind to `fired` (the first finding of a kind
    is the one kept): a detector whose kind has fired is not run again.

    Args:
        report: called with each finding (or None when a detector found nothing).
        thresholds: when the detectors fire (default: `Thresholds()`).

    Attributes:
        fired: the kinds of finding reported so far in this fit.
    """

    def __init__(
        self,
        report: Callable[[WatchFinding | None], None],
        thresholds: Thresholds | None = None,
    ) -> None:
        self.report = report
        self.thresholds = thresholds = thresholds or Thresholds()
        self.warmup_steps = thresholds.warmup_steps
        self.headroom = thresholds.headroom
        self.input_bound_fraction = thresholds.input_bound_fraction
        self.growth_bytes = thresholds.growth_bytes
        self.growth_fraction = thresholds.growth_fraction
        self.fired: set[str] = set()
        self.floors = detectors.Floors()
        self.loss_monitor = detectors.LossMonitor(
            spike_factor=thresholds.spike_factor, plateau_steps=thresholds.plateau_steps
        )
        self.traces_at_warmup: int | None = None

    def after_step(
        self,
        steps: Sequence[dict[str, Any]],
        record: dict[str, Any],
        *,
        budget_bytes: int | None,
        guarded: bool = False,
        params: dict[str, Any] | None = None,
    ) -> None:
        """Run the step detectors after one step.

        Args:
            steps: the fit's step records so far, `record` last.
            record: the step's record (a log step line, without the loss).
            budget_bytes: the memory budget, if known.
            guarded: the step is `memfit.fit`'s (it retraces per micro-batch count).
            params: Keras' `callback.params`: the fit's `epochs` and `steps` (per epoch).
        """
        step = record["step"]
        if step == self.warmup_steps:
            self.traces_at_warmup = record["traces"]
        if step < self.warmup_steps:
            return
        self._check_memory(steps, record, budget_bytes, guarded, params)
        if (
            record["input_wait_seconds"] is not None
            and step % 5 == 0
            and "input_bound" not in self.fired
        ):
            self.report(
                detectors.input_bound(
                    steps,
                    step,
                    warmup_steps=self.warmup_steps,
                    fraction=self.input_bound_fraction,
                )
            )

    def _check_memory(
        self,
        steps: Sequence[dict[str, Any]],
        record: dict[str, Any],
        budget_bytes: int | None,
        guarded: bool,
        params: dict[str, Any] | None,
    ) -> None:
        step = record["step"]
        if "retracing" not in self.fired:
            self.report(
                detectors.retracing(
                    step,
                    record["traces"],
                    self.traces_at_warmup,
                    self.warmup_steps,
                    guarded=guarded,
                )
            )
        current, peak = record["memory_current_bytes"], record["memory_peak_bytes"]
        if current is None:
            return
        closed = self.floors.add(step, current, record["traces"] or 0)
        if closed and "memory_growth" not in self.fired:
            recent = [s["memory_peak_bytes"] or 0 for s in steps[-5:]]
            self.report(
                detectors.memory_growth(
                    self.floors,
                    step,
                    budget_bytes=budget_bytes,
                    recent_peak_bytes=max(recent) if recent else None,
                    guarded=guarded,
                    growth_bytes=self.growth_bytes,
                    growth_fraction=self.growth_fraction,
                )
            )
        if peak is None or not budget_bytes:
            return
        near = peak >= (1 - self.headroom) * budget_bytes
        if "near_budget" not in self.fired and (closed or near):
            self.report(
                detectors.near_budget(
                    steps,
                    step,
                    budget_bytes=budget_bytes,
                    floors=self.floors,
                    headroom=self.headroom,
                    planned_steps=_planned_steps(params),
                    growth_bytes=self.growth_bytes,
                )
            )
        if "thrashing" not in self.fired and peak >= 0.95 * budget_bytes:
            self.report(detectors.thrashing(steps, step, budget_bytes=budget_bytes))

    def after_loss(
        self,
        step: int,
        loss: float,
        epoch: int,
        evidence: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """Run the loss detectors on one step's own loss.

        Args:
            step: the step.
            loss: its loss (not a running mean).
            epoch: its epoch.
            evidence: what to add to a finding's evidence (e.g. the learning rate), read
                only when there is a finding.
        """
        found = self.loss_monitor.add(step, loss, epoch)
        if found is not None and evidence is not None:
            found.evidence.update(evidence())
        self.report(found)

    def fit_started(self, current_bytes: int, step: int) -> None:
        """Note the memory in use as a fit begins; `memory_growth` when it keeps rising.

        The memory at the start of every fit in this process is kept, whichever `Watch`
        watched it: models built again and again leave more in use at each start.

        Args:
            current_bytes: bytes in use on the device as this fit begins.
            step: the current step.
        """
        _FIT_STARTS.append(current_bytes)
        if "memory_growth" in self.fired:
            return
        self.report(
            detectors.repeated_fits(
                _FIT_STARTS,
                step,
                growth_bytes=self.growth_bytes,
                growth_fraction=self.growth_fraction,
            )
        )


def _planned_steps(params: dict[str, Any] | None) -> int | None:
    """The steps a fit will run (epochs x steps per epoch), when Keras knows them."""
    params = params or {}
    epochs, steps = params.get("epochs"), params.get("steps")
    if isinstance(epochs, int) and isinstance(steps, int) and epochs and steps:
        return epochs * steps
    return None
