"""One batch size, trained for a few steps in a fresh child process: OOM or not, and how long.

The baselines' trials: each is a child process (the same isolation memfit's own search uses),
so an OOM cannot disturb the next trial and every method pays the same start-up costs.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.budget import Budget
from memfit.errors import MeasurementError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_steps(
    spec: str, batch_size: int, steps: int, input_shape: list[int] | None, data: str | None
) -> dict[str, Any]:
    """Child side: build the model and run `steps` steps of `model.fit` on one batch size."""
    from memfit.backend import tf as tfb
    from memfit.models import _call_factory, load_model
    from memfit.workload import Workload

    tf = tfb.import_tf()
    model = load_model(spec, input_shape=tuple(input_shape) if input_shape else None)
    dataset = _call_factory(data) if data else None
    workload = Workload(model, input_shape=input_shape, data=dataset)
    try:
        x, y = workload.batch(batch_size)
        batches = tf.data.Dataset.from_tensors((x, y)).repeat(steps)
        start = time.perf_counter()
        workload.model.fit(batches, epochs=1, verbose=0)
        return {"oom": False, "seconds": time.perf_counter() - start}
    except Exception as exc:  # noqa: BLE001 - only OOMs are an answer; others are re-raised
        if tfb.is_oom(exc):
            return {"oom": True}
        raise


@dataclass
class TrialLog:
    """What one method's trials cost."""

    trials: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ChildTrials:
    """`runs(batch_size)` for the baselines: a child process trains `steps` steps.

    Args:
        spec: MODEL spec the child loads.
        budget: emulated budget of every child.
        steps: training steps per trial.
        input_shape: one sample's shape, for models with undefined inputs.
        data: `package.module:dataset_fn` of unbatched samples, for models with dict targets.
        seen: shared record of every size's outcome (size -> list of runs/OOM), for the
            ground truth.
    """

    def __init__(
        self,
        spec: str,
        budget: Budget,
        steps: int,
        input_shape: list[int] | None,
        data: str | None,
        seen: dict[int, list[bool]],
        on_trial: Any = None,
    ) -> None:
        self.spec, self.budget, self.steps = spec, budget, steps
        self.input_shape, self.data, self.seen = input_shape, data, seen
        self.log = TrialLog()
        self.on_trial = on_trial

    def __call__(self, batch_size: int) -> bool:
        from memfit.isolate import run_in_child

        start = time.perf_counter()
        note = ""
        try:
            result = run_in_child(
                "bench.trials:train_steps",
                {
                    "spec": self.spec,
                    "batch_size": int(batch_size),
                    "steps": self.steps,
                    "input_shape": self.input_shape,
                    "data": self.data,
                },
                budget=self.budget,
                env={"PYTHONPATH": ROOT},
            )
            oom = bool(result.get("oom") or result.get("hung_after_oom"))
        except MeasurementError as exc:
            # A child killed by the allocator (SIGSEGV making a tensor past the cap) ran out too.
            if "SIGSEGV" not in str(exc):
                raise
            oom, note = True, "killed by SIGSEGV"
        seconds = time.perf_counter() - start
        self.log.trials.append(
            {"batch_size": int(batch_size), "oom": oom, "seconds": seconds, "note": note}
        )
        self.log.steps += self.steps
        self.log.seconds += seconds
        self.seen.setdefault(int(batch_size), []).append(not oom)
        if self.on_trial is not None:
            self.on_trial(int(batch_size), oom, seconds)
        return not oom
