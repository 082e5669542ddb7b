"""One batch size, trained for a few steps in a fresh child process: OOM or not, and how long.

The baselines' trials: each is a child process (the same isolation memfit's own search uses),
so an OOM cannot disturb the next trial and every method pays the same start-up costs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.budget.budget import Budget
from memfit.errors import MeasurementError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_STEPS = "bench.trials:train_steps"
FIT_STEPS = "bench.trials:fit_steps"


def train_steps(
    spec: str, batch_size: int, steps: int, input_shape: list[int] | None, data: str | None
) -> dict[str, Any]:
    """Child side: build the model and train `steps` steps (Keras' train function) at one size.

    Keras' train function runs on the batch as given (as `train_on_batch` does): no pipeline
    holds a second copy of the batch in the (CPU-emulated) device's memory, as it would not
    on a GPU, where tf.data's buffers live in host memory.
    """
    from memfit.backend import tf as tfb
    from memfit.workload.models import call_factory, load_model
    from memfit.workload.workload import Workload

    model = load_model(spec, input_shape=tuple(input_shape) if input_shape else None)
    dataset = call_factory(data) if data else None
    workload = Workload(model, input_shape=input_shape, data=dataset)
    try:
        x, y = workload.batch(batch_size)
        start = time.perf_counter()
        for _ in range(steps):
            _train_once(workload.model, x, y)
        return {"oom": False, "seconds": time.perf_counter() - start}
    except Exception as exc:  # noqa: BLE001 - only OOMs are an answer; others are re-raised
        if tfb.is_oom(exc):
            return {"oom": True}
        raise


def fit_steps(
    spec: str, batch_size: int, steps: int, input_shape: list[int] | None, data: str | None
) -> dict[str, Any]:
    """Child side: does plain `model.fit` train `steps` steps at `batch_size`? (the check)

    The check every method's answer gets in the batch benchmark: build the model, make one
    batch as the search's trials do, then `model.fit` on a dataset of that batch repeated
    `steps` times, one epoch, as a user would train: its batch dimension undefined, as a
    pipeline's `batch` (or `model.fit` on arrays) leaves it (`Workload.fit_dataset`; a
    dataset of one fixed size traces another step). Run it in a fresh process under the
    emulated budget (`ChildTrials(..., function=FIT_STEPS)`).

    Args:
        spec: MODEL spec (`memfit.load_model`).
        batch_size: samples per step.
        steps: steps `model.fit` trains.
        input_shape: one sample's shape, for models with undefined inputs.
        data: `package.module:dataset_fn` of unbatched samples (models with dict targets).

    Returns:
        `{"oom": False, "seconds": s, "steps": n}` when every step ran (`seconds`: the fit's
        wall time), `{"oom": True}` when the fit ran out of memory.

    Example:
        >>> from memfit.process.runner import run_in_child  # doctest: +SKIP
        >>> run_in_child(FIT_STEPS, {"spec": "keras.applications.MobileNetV2", "batch_size": 8,
        ...     "steps": 20, "input_shape": [96, 96, 3], "data": None})  # doctest: +SKIP
        {'oom': False, 'seconds': 9.1, 'steps': 20}
    """
    from memfit.backend import tf as tfb
    from memfit.workload.models import call_factory, load_model
    from memfit.workload.workload import Workload

    model = load_model(spec, input_shape=tuple(input_shape) if input_shape else None)
    dataset = call_factory(data) if data else None
    workload = Workload(model, input_shape=input_shape, data=dataset)
    try:
        x, y = workload.batch(batch_size)
        batches = workload.fit_dataset((x, y)).take(steps)
        start = time.perf_counter()
        history = workload.model.fit(batches, epochs=1, verbose=0)
        seconds = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - only OOMs are an answer; others are re-raised
        if tfb.is_oom(exc):
            return {"oom": True}
        raise
    losses = history.history.get("loss") or [float("nan")]
    return {"oom": False, "seconds": seconds, "steps": steps, "loss": float(losses[-1])}


def search_child(
    method: str,
    spec: str,
    steps: int,
    input_shape: list[int] | None,
    data: str | None,
) -> dict[str, Any]:
    """Child side: one whole baseline search in this process, as the original tools run theirs.

    The model is built once; each trial trains `steps` steps (`train_on_batch`) on it (Keras
    keeps one train function, relaxing the batch dimension after the second size), an OOM is
    caught and the next size tried in the same process — Lightning's and Accelerate's way.
    Only the search is timed.

    Args:
        method: `lightning_power`, `lightning_binsearch` or `accelerate`.
        spec: MODEL spec the child loads.
        steps: training steps per trial.
        input_shape: one sample's shape, for models with undefined inputs.
        data: `package.module:dataset_fn` of unbatched samples, for models with dict targets.

    Returns:
        `found`, `trials` (each `batch_size`, `oom`, `seconds`, `note`), `steps`, `seconds`.

    Example:
        >>> run_in_child("bench.trials:search_child", {"method": "lightning_binsearch",
        ...     "spec": "keras.applications.MobileNetV2", "steps": 3,
        ...     "input_shape": [96, 96, 3], "data": None}, budget=budget)  # doctest: +SKIP
    """
    import gc

    from bench.baselines import binsearch_scaling, find_executable_batch_size, power_scaling
    from memfit.backend import tf as tfb
    from memfit.budget.budget import emulated_budget
    from memfit.workload.models import call_factory, load_model
    from memfit.workload.workload import Workload

    budget = emulated_budget()
    model = load_model(spec, input_shape=tuple(input_shape) if input_shape else None)
    dataset = call_factory(data) if data else None
    workload = Workload(model, input_shape=input_shape, data=dataset)
    device = tfb.default_device()
    tf = tfb.import_tf()
    trials: list[dict[str, Any]] = []

    def runs(size: int) -> bool:
        start = time.perf_counter()
        ok, note = True, ""
        needed = workload.synthetic_batch_bytes(size)
        resident = (tfb.memory_info(device) or {}).get("current", 0)
        if budget is not None and needed is not None and resident + needed > budget.usable_bytes:
            # Making that batch would crash TensorFlow (SIGSEGV) instead of raising an OOM.
            ok, note = False, "the batch's inputs alone exceed the budget"
        else:
            for attempt in range(2):
                try:
                    x, y = workload.batch(size)
                    for _ in range(steps):
                        _train_once(workload.model, x, y)
                    del x, y
                    break
                except Exception as exc:  # noqa: BLE001 - OOM is the answer; others re-raised
                    if tfb.is_oom(exc):
                        ok = False
                        break
                    # After OOMs, TF 2.21 can fail every later step of the same train
                    # function with AlreadyExistsError (a grappler TemporaryVariable left in
                    # the per-step container; seen on RetinaNet), which no search could go on
                    # from. Then, once, a fresh train function (one trace more) and the trial
                    # again; Lightning's PyTorch loop has no trace to break.
                    if attempt or not isinstance(exc, tf.errors.AlreadyExistsError):
                        raise
                    note = "retried on a fresh train function (AlreadyExistsError)"
                    workload.model.make_train_function(force=True)
            gc.collect()  # Lightning's garbage_collection_cuda()
        trials.append(
            {
                "batch_size": size,
                "oom": not ok,
                "seconds": time.perf_counter() - start,
                "note": note,
            }
        )
        return ok

    finders = {
        "lightning_power": power_scaling,
        "lightning_binsearch": binsearch_scaling,
        "accelerate": find_executable_batch_size,
    }
    start = time.perf_counter()
    found = finders[method](runs)
    return {
        "found": found,
        "trials": trials,
        "steps": steps * len(trials),
        "seconds": time.perf_counter() - start,
    }


def _train_once(model: Any, x: Any, y: Any) -> None:
    """One step of Keras' own train function on the batch as given (what `train_on_batch`
    runs, without its symbolic build, which fails on keras-hub's dict targets)."""
    model.make_train_function()

    def batches() -> Any:
        yield (x, y)

    model.train_function(batches())


@dataclass
class TrialLog:
    """What one method's trials cost."""

    trials: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ChildTrials:
    """`runs(batch_size)`: a fresh child process trains `steps` steps at that size.

    The baselines' trials (`train_steps`, Keras' train function on the batch as given) and
    the benchmark's check of every answer (`fit_steps`, plain `model.fit`). A child that
    runs out of memory, dies of SIGSEGV making a tensor past the cap, or hangs in the
    allocator's retry after an OOM counts as out of memory.

    Args:
        spec: MODEL spec the child loads.
        budget: emulated budget of every child.
        steps: training steps per trial.
        input_shape: one sample's shape, for models with undefined inputs.
        data: `package.module:dataset_fn` of unbatched samples, for models with dict targets.
        seen: shared record of every size's outcome (size -> list of runs/OOM), for the
            ground truth.
        on_trial: called with `(batch_size, oom, seconds)` after each trial.
        function: the child function (`TRAIN_STEPS` or `FIT_STEPS`).

    Example:
        >>> check = ChildTrials("keras.applications.MobileNetV2", Budget.from_size("1GiB"),
        ...     20, [96, 96, 3], None, {}, function=FIT_STEPS)  # doctest: +SKIP
        >>> check(8)  # doctest: +SKIP
        True
    """

    def __init__(
        self,
        spec: str,
        budget: Budget,
        steps: int,
        input_shape: list[int] | None,
        data: str | None,
        seen: dict[int, list[bool]],
        on_trial: Callable[[int, bool, float], None] | None = None,
        function: str = TRAIN_STEPS,
    ) -> None:
        self.spec, self.budget, self.steps = spec, budget, steps
        self.input_shape, self.data, self.seen = input_shape, data, seen
        self.log = TrialLog()
        self.on_trial = on_trial
        self.function = function

    def __call__(self, batch_size: int) -> bool:
        from memfit.process.runner import run_in_child

        start = time.perf_counter()
        note = ""
        try:
            result = run_in_child(
                self.function,
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
            if result.get("hung_after_oom"):
                note = "hung in the allocator's retry after an OOM"
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
