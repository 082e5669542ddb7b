"""The planner's flow: estimate every configuration, measure the finalists, confirm one.

`Planner` keeps the candidates of one plan and walks them: it asks `memfit.planning.strategy`
which K to try, how long each should take and what to measure or confirm next, and asks
`memfit.planning.trials` to run each estimate, measurement and confirmation in a child
process. `memfit.planning.plan` builds one and turns its choice into a `Plan`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from memfit.budget.budget import Budget
from memfit.errors import MeasurementError, MemfitError
from memfit.planning import strategy
from memfit.planning.strategy import MAX_CONFIRMATIONS, MAX_FINALISTS
from memfit.planning.trials import Estimator, PlanTrials
from memfit.sizes import format_size
from memfit.training.plan import Candidate
from memfit.workload.spec import WorkloadSpec

Config = tuple[str, str | None]  # (precision, remat)


class Planner:
    """The candidates of one plan, and the order in which they are estimated, measured and
    confirmed.

    Args:
        batch_size: the target effective batch.
        budget: the budget planned for.
        limit: the most a fitting peak may reach (the budget less the margin).
        workload: what the child processes build and train (see `PlanTrials`).
        repeats: measured steps per measured candidate after the warm-up.
        on_candidate: called with a `Candidate` each time it is estimated, measured or
            confirmed.
    """

    def __init__(
        self,
        batch_size: int,
        budget: Budget,
        limit: int,
        workload: WorkloadSpec,
        repeats: int,
        on_candidate: Callable[[Candidate], None] | None,
        *,
        ks: list[int] | None = None,
        estimable: bool = True,
        trainer: str = "memfit.fit",
    ) -> None:
        self.batch_size, self.budget, self.limit = batch_size, budget, limit
        # A step the estimate cannot trace at K (a Model Garden task's) is planned from
        # measurements alone; `trainer` is what the confirmation trains with.
        self.estimable, self.trainer = estimable, trainer
        self.trials = PlanTrials(batch_size, budget, limit, workload, repeats)
        self.on_candidate = on_candidate or (lambda _c: None)
        self.candidates: list[Candidate] = []
        self.device = "CPU"
        self.skipped: list[Config] = []
        # The estimate's resident bytes (weights, optimizer state, batch) per configuration.
        self.resident: dict[Config, int] = {}
        self.ks = ks or strategy.k_values(batch_size)

    # -- the flow ---------------------------------------------------------------------------
    def run(self, configs: list[Config], confirm_steps: int) -> tuple[Candidate | None, str]:
        """Estimate, measure the finalists, confirm; the chosen candidate and how it held."""
        finalists = None
        if self.estimable:
            try:
                finalists = self.estimate(configs)
            except MeasurementError:
                finalists = None  # the estimator process died: plan from measurements alone
        if finalists is None or not any(c.predicted_peak_bytes for c in self.candidates):
            finalists = self.measured_walk(configs)
            measured = True
        elif not finalists:
            finalists = self.last_resort()
            measured = True
        else:
            measured = False
        if not confirm_steps or len(finalists) > 1 or self.near_neighbours(finalists):
            if not measured:
                finalists = [c for c in map(self.measure_config, finalists) if c is not None]
            queue = sorted(
                (c for c in finalists if c.fits), key=lambda c: c.step_seconds or math.inf
            )
        else:
            queue = list(finalists)
        if not confirm_steps:
            if not queue:
                return None, ""
            return queue[0], ""
        return self.confirm_queue(queue, confirm_steps)

    def confirm_queue(self, queue: list[Candidate], steps: int) -> tuple[Candidate | None, str]:
        """Confirm candidates in order; one that fails gives way to its configuration with
        more K, queued by its expected time among the others (a measured finalist that is
        faster than the larger K goes first)."""
        failed: list[str] = []
        expected: dict[int, float] = {}  # seconds per batch of larger K queued, not measured
        while queue and len(failed) < MAX_CONFIRMATIONS:
            candidate = queue.pop(0)
            if self.confirm(candidate, steps):
                how = (
                    f"confirmed: trained {steps} steps of {self.trainer} in a fresh process "
                    f"without a recovery, peak {format_size(candidate.peak_bytes)}"
                )
                if failed:
                    how += f" (after {'; '.join(failed)})"
                return candidate, how
            failed.append(
                f"K={candidate.micro_batches} {candidate.precision}"
                + (f" remat {candidate.remat}" if candidate.remat else "")
                + f" did not hold: {(candidate.recoveries or ['?'])[0][:160]}"
            )
            larger = [k for k in self.ks if k > candidate.micro_batches]
            if larger:
                bigger = self.candidate(candidate.precision, candidate.remat, larger[0])
                expected[id(bigger)] = self.expected_seconds(bigger, basis=candidate)
                position = strategy.queue_position(
                    [expected.get(id(c), self.expected_seconds(c)) for c in queue],
                    expected[id(bigger)],
                )
                queue.insert(position, bigger)
        if not failed:
            return None, ""  # nothing fitted to confirm
        return None, (
            f"no configuration trained {steps} steps of {self.trainer} without a recovery: "
            + "; ".join(failed)
        )

    # -- estimates --------------------------------------------------------------------------
    def estimate(self, configs: list[Config]) -> list[Candidate]:
        """Per configuration, the smallest K predicted to fit, for those that could win."""
        finalists: list[Candidate] = []
        with self.trials.estimator() as estimator:
            self.device = estimator.device
            best_k = math.inf
            for precision, remat in sorted(configs, key=lambda c: self.cost(*c, 1)):
                if best_k == 1:
                    # Dearer per step, and no configuration needs fewer micro-batches.
                    self.skipped.append((precision, remat))
                    continue
                found = self.smallest_predicted_k(estimator, precision, remat, best_k)
                if found is not None:
                    finalists.append(found)
                    best_k = found.micro_batches
        finalists.sort(key=lambda c: self.cost(c.precision, c.remat, c.micro_batches))
        return finalists[:MAX_FINALISTS]

    def smallest_predicted_k(
        self, estimator: Estimator, precision: str, remat: str | None, below: float
    ) -> Candidate | None:
        """The smallest K below `below` whose predicted peak fits, or None."""
        ks = [k for k in self.ks if k < below]
        if not ks:
            return None
        first = self.predict(estimator, precision, remat, ks[0])
        if first.error is not None or first.fits:
            return first if first.fits else None
        assert first.predicted_peak_bytes is not None
        index = strategy.first_k_index(
            ks,
            self.batch_size,
            first.predicted_peak_bytes,
            self.resident.get((precision, remat), 0),
            self.limit,
        )
        for k in ks[max(1, index) :]:
            candidate = self.predict(estimator, precision, remat, k)
            if candidate.error is not None:
                return None
            if candidate.fits:
                return candidate
        return None

    def predict(self, estimator: Estimator, precision: str, remat: str | None, k: int) -> Candidate:
        """The estimate's peak for one configuration and K (in the estimator process)."""
        candidate = self.candidate(precision, remat, k)
        resident = estimator.predict(candidate)
        if resident is not None:
            self.resident.setdefault((precision, remat), resident)
        self.on_candidate(candidate)
        return candidate

    # -- measurements -----------------------------------------------------------------------
    def near_neighbours(self, finalists: list[Candidate]) -> bool:
        """Whether a finalist's next smaller K was predicted near enough the limit to try."""
        return any(self.near_neighbour(c) is not None for c in finalists)

    def near_neighbour(self, candidate: Candidate) -> Candidate | None:
        """The candidate's next smaller K, when it was predicted near enough the limit."""
        smaller = [k for k in self.ks if k < candidate.micro_batches]
        if not smaller:
            return None
        below = self.find(candidate.precision, candidate.remat, smaller[-1])
        if below is None or not strategy.near_limit(below.predicted_peak_bytes, self.limit):
            return None
        return below

    def measure_config(self, finalist: Candidate) -> Candidate | None:
        """The smallest measured K of a finalist's configuration that fits: its near smaller
        neighbour first, then the finalist, then larger K until one fits."""
        below = self.near_neighbour(finalist)
        if below is not None and self.measure(below).fits:
            return below
        return strategy.smallest_fitting_k(
            self.measure_k(finalist.precision, finalist.remat),
            self.ks,
            finalist.micro_batches,
            up_only=True,
        )

    def measured_walk(self, configs: list[Config]) -> list[Candidate]:
        """Plan from measurements alone (the estimate could not trace the model): per
        configuration, walk K from the best so far, down while it fits, up until it fits."""
        found: list[Candidate] = []
        hint = 1
        for precision, remat in configs:
            try:
                best = strategy.smallest_fitting_k(self.measure_k(precision, remat), self.ks, hint)
            except MemfitError as exc:
                failed = self.candidate(precision, remat, hint)
                failed.error = str(exc)
                self.on_candidate(failed)
                continue
            if best is not None:
                found.append(best)
                hint = min(c.micro_batches for c in found)
        return found

    def last_resort(self) -> list[Candidate]:
        """Nothing was predicted to fit: measure one sample per micro-batch of the
        configuration predicted lowest (estimates can be high), and fewer K while it fits."""
        estimated = [c for c in self.candidates if c.predicted_peak_bytes is not None]
        if not estimated:
            return []
        lowest = min(estimated, key=lambda c: c.predicted_peak_bytes or math.inf)
        found = strategy.smallest_fitting_k(
            self.measure_k(lowest.precision, lowest.remat), self.ks, self.batch_size
        )
        return [found] if found is not None else []

    def measure_k(self, precision: str, remat: str | None) -> Callable[[int], Candidate]:
        """Measures one configuration at a given K (for `strategy.smallest_fitting_k`)."""
        return lambda k: self.measure(self.candidate(precision, remat, k))

    def measure(self, candidate: Candidate) -> Candidate:
        """One candidate's step (`memfit.fit`'s, at its K), measured in a fresh child."""
        if candidate.measured:
            return candidate
        self.trials.measure(candidate)
        self.on_candidate(candidate)
        return candidate

    def confirm(self, candidate: Candidate, steps: int) -> bool:
        """Train `steps` steps of `memfit.fit` at the candidate in a fresh child process."""
        confirmed = self.trials.confirm(candidate, steps)
        self.on_candidate(candidate)
        return confirmed

    # -- bookkeeping ------------------------------------------------------------------------
    def find(self, precision: str, remat: str | None, k: int) -> Candidate | None:
        """The candidate for one configuration and K, if there is one yet."""
        return next(
            (
                c
                for c in self.candidates
                if (c.precision, c.remat, c.micro_batches) == (precision, remat, k)
            ),
            None,
        )

    def candidate(self, precision: str, remat: str | None, k: int) -> Candidate:
        """The candidate for one configuration and K (created on first use)."""
        found = self.find(precision, remat, k)
        if found is None:
            found = Candidate(precision, remat, k, math.ceil(self.batch_size / k))
            self.candidates.append(found)
        return found

    def expected_seconds(self, candidate: Candidate, basis: Candidate | None = None) -> float:
        """Seconds per batch: measured, else scaled from `basis` (a measured K of the same
        configuration) by the cost of more micro-batches; unknown is infinite."""
        if candidate.step_seconds is not None:
            return candidate.step_seconds
        if basis is not None and basis.step_seconds is not None:
            return strategy.scaled_seconds(
                basis.step_seconds,
                self.cost(*basis.config, basis.micro_batches),
                self.cost(*candidate.config, candidate.micro_batches),
            )
        return math.inf

    def cost(self, precision: str, remat: str | None, k: int) -> float:
        """Rough time per step relative to float32 without recompute, unsplit."""
        return strategy.step_cost(self.device, precision, remat, k)

    def skipped_note(self) -> str:
        """What was not estimated and why ("" when nothing was skipped)."""
        return strategy.skipped_note(self.skipped, self.device)
