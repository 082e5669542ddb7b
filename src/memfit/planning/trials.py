"""The planner's trials: the child processes that estimate, measure and confirm candidates.

`PlanTrials` runs each in a fresh child process under the budget — the estimate of a
configuration and K (`memfit.estimate`, many in one process), one measured step
(`memfit.fit`'s, at its K) and a confirmation (steps of `memfit.fit`) — and fills in the
candidate's fields from what the child reports. It decides nothing: which candidates to run
is `memfit.planning.planner`'s, with `memfit.planning.strategy`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from memfit.budget.budget import Budget
from memfit.errors import MeasurementError, MemfitError
from memfit.measuring.isolate import measure_in_child
from memfit.planning.child import open_estimator
from memfit.process.runner import ChildWorker, run_in_child
from memfit.sizes import format_size
from memfit.training.child import confirm_plan
from memfit.training.plan import TASK_PRECISION, Candidate
from memfit.workload.spec import WorkloadSpec

# A confirmation run is over at TensorFlow's first OOM line: stop its process this soon after.
CONFIRM_OOM_GRACE = 5.0


def _precision_arg(precision: str) -> str | None:
    """The child's precision argument: None for float32 (the default policy) and for a
    task's own precision (its config's, left as it is)."""
    return None if precision in ("float32", TASK_PRECISION) else precision


class Estimator:
    """The estimate's child process: predicts a configuration's peak at one K.

    Attributes:
        device: `"GPU"` or `"CPU"`, the device the child estimates for.
    """

    def __init__(self, worker: Any, batch_size: int, limit: int) -> None:
        self.worker, self.batch_size, self.limit = worker, batch_size, limit
        device = worker.call(what="device")["device"]
        self.device = "GPU" if str(device).upper().startswith("GPU") else "CPU"

    def predict(self, candidate: Candidate) -> int | None:
        """Fill in the candidate's predicted peak and whether it fits (or why it could not
        be estimated); the estimate's resident bytes (weights, optimizer state, batch), or
        None when it failed."""
        try:
            result = self.worker.call(
                precision=_precision_arg(candidate.precision),
                remat=candidate.remat,
                batch_size=self.batch_size,
                micro_batches=candidate.micro_batches,
            )
        except MeasurementError as exc:  # this configuration cannot be traced or built
            candidate.error = f"estimate: {exc}"
            return None
        candidate.predicted_peak_bytes = int(result["peak_bytes"])
        candidate.fits = candidate.predicted_peak_bytes <= self.limit
        return int(result["resident_bytes"])


@dataclass
class PlanTrials:
    """Estimates, measures and confirms candidates in child processes under one budget.

    Attributes:
        batch_size: the target effective batch.
        budget: the budget the children run under.
        limit: the most a fitting peak may reach (the budget less the margin).
        workload: what the children build and train (its model a MODEL string or a saved
            copy); each candidate's precision and remat replace the workload's.
        repeats: measured steps per measured candidate after the warm-up.
    """

    batch_size: int
    budget: Budget
    limit: int
    workload: WorkloadSpec
    repeats: int

    def variant(self, candidate: Candidate) -> WorkloadSpec:
        """The workload built under the candidate's precision and remat."""
        return dataclasses.replace(
            self.workload, precision=_precision_arg(candidate.precision), remat=candidate.remat
        )

    @contextlib.contextmanager
    def estimator(self) -> Iterator[Estimator]:
        """An `Estimator` in a fresh child process, killed at the end of the block.

        Raises:
            MeasurementError: the estimator process could not start or died.
        """
        args = {"workload": self.workload.to_json()}
        worker = ChildWorker(open_estimator, args, budget=self.budget)
        try:
            yield Estimator(worker, self.batch_size, self.limit)
        finally:
            worker.shutdown(kill=True)

    def measure(self, candidate: Candidate) -> None:
        """Measure one candidate's step (`memfit.fit`'s, at its K) in a fresh child: its peak,
        time and whether it fits, or why it could not be measured."""

        try:
            m = measure_in_child(
                self.variant(candidate),
                self.batch_size,
                repeats=self.repeats,
                budget=self.budget,
                micro_batches=candidate.micro_batches,
            )
        except MemfitError as exc:
            candidate.error = str(exc)
            candidate.fits = False
            return
        candidate.measured = True
        candidate.peak_bytes, candidate.step_seconds, candidate.oom = (
            m.peak_bytes,
            m.step_seconds,
            m.oom,
        )
        candidate.fits = not m.oom and m.peak_bytes is not None and m.peak_bytes <= self.limit

    def confirm(self, candidate: Candidate, steps: int) -> bool:
        """Train `steps` steps of `memfit.fit` at the candidate in a fresh child process;
        whether it held (no recovery, peak within the limit). `recoveries` says why not."""
        result = run_in_child(
            confirm_plan,
            {
                "workload": self.variant(candidate).to_json(),
                "batch_size": self.batch_size,
                "micro_batches": candidate.micro_batches,
                "steps": steps,
            },
            budget=self.budget,
            oom_grace=CONFIRM_OOM_GRACE,
        )
        if result.get("hung_after_oom"):
            candidate.oom = True
            candidate.recoveries = [f"out of memory: {result.get('oom_message') or 'OOM'}"]
            peak = result.get("max_in_use_bytes")
        else:
            candidate.recoveries = list(result["recoveries"])
            if result.get("error"):
                candidate.recoveries.append(result["error"])
            candidate.oom = bool(candidate.recoveries)  # memfit.fit recovers from OOMs only
            peak = result.get("peak_bytes")
            if not candidate.recoveries and result["steps_done"] < steps:
                candidate.recoveries.append(f"trained {result['steps_done']} of {steps} steps")
            if result.get("step_seconds") is not None:
                candidate.step_seconds = float(result["step_seconds"])
        if peak is not None:
            candidate.peak_bytes = max(int(peak), candidate.peak_bytes or 0)
        if not candidate.recoveries and (peak is None or peak > self.limit):
            candidate.recoveries.append(
                f"peak {format_size(peak)} over the limit {format_size(self.limit)}"
                if peak is not None
                else "no peak reported"
            )
        candidate.measured = True
        candidate.confirmed = not candidate.recoveries
        candidate.fits = candidate.confirmed
        return candidate.confirmed
