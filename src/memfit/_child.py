"""Entry point of memfit's child processes (see memfit._runner). Not public."""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any


def measure_spec(
    workload: dict[str, Any],
    batch_size: int,
    repeats: int,
    micro_batches: int = 1,
    recompute: Any = None,
    explain: bool = False,
) -> dict[str, Any]:
    """Build a workload (`WorkloadSpec.to_json`) and measure it in this (fresh) process.

    `micro_batches`, `recompute` and `explain` as in `memfit.measure`.
    """
    measure = open_measurer(workload, micro_batches=micro_batches, recompute=recompute)
    return measure(batch_size=batch_size, repeats=repeats, explain=explain)


def open_measurer(
    workload: dict[str, Any],
    micro_batches: int = 1,
    warm_relaxed: bool = False,
    recompute: Any = None,
) -> Callable[..., dict[str, Any]]:
    """Build a workload (`WorkloadSpec.to_json`) once; return `measure(batch_size, repeats)`.

    The model is built under the spec's precision (left set: the process is thrown away) and
    recompute. `warm_relaxed`: trace the shared relaxed step now (`Workload.warm_relaxed`),
    so that a first `measure(..., exact=False)` costs only the graph's optimisation and its
    steps.
    """
    from memfit._runner import RESIDENT_MARK
    from memfit.backend import tf as tfb
    from memfit.checks import check_batch_size
    from memfit.errors import MemfitError
    from memfit.measuring import measure_workload
    from memfit.recomputation import remat_recompute
    from memfit.workload_spec import WorkloadSpec

    spec = WorkloadSpec.from_json(workload)
    recompute = recompute or remat_recompute(spec.remat)
    try:
        if spec.is_task:
            from memfit.step_workload import refuse_for_step

            # The task's own step: its model, optimizer and train_step (a `StepWorkload`).
            refuse_for_step(recompute=recompute)
            built = spec.task_workload()
            built.build_optimizer()
        else:
            built = spec.workload(spec.build_model(keep_policy=True))
        if (
            not spec.is_task
            and built.model.optimizer is not None
            and not built.model.optimizer.built
        ):
            built.model.optimizer.build(built.model.trainable_variables)
        if recompute:
            # memfit's recompute (`memfit.recompute`), applied for this throwaway process.
            from memfit.recomputation import recompute as segmented

            segmented(built.model, recompute).apply()
        if warm_relaxed:
            built.warm_relaxed()
    except Exception as exc:
        if not tfb.is_oom(exc):
            raise
        from memfit.budget import emulated_budget

        budget = emulated_budget()
        raise MemfitError(
            f"the model's weights and optimizer state alone do not fit in "
            f"{budget.name if budget else 'the budget'}: creating them ran out of memory "
            f"({tfb.oom_summary(exc)}). No batch size can fit; use a card with more memory, a "
            f"smaller model, or an optimizer with less state (SGD keeps none, Adam two copies "
            f"of the weights)"
        ) from None
    device = tfb.default_device()
    info = tfb.memory_info(device)
    if info is not None:
        # Tell the parent what is resident, in case a step fails slowly (see _runner.py).
        print(f"{RESIDENT_MARK}{info['current']}", file=sys.stderr, flush=True)
    from memfit.budget import emulated_budget

    budget = emulated_budget()

    def measure(
        batch_size: int,
        repeats: int,
        exact: bool = True,
        restore: bool = True,
        warm_up: bool = True,
        warm_up_batch: int | None = None,
        continuous: bool = False,
        explain: bool = False,
    ) -> dict[str, Any]:
        check_batch_size(batch_size)
        tfb.require_memory_stats(device)
        stall = _stall_exits(
            device, info["current"] if info else 0, budget.usable_bytes if budget else None
        )
        with stall:
            return measure_workload(
                built,
                int(batch_size),
                repeats=repeats,
                device=device,
                budget=budget,
                micro_batches=micro_batches,
                exact=exact,
                restore=restore,
                warm_up=warm_up,
                warm_up_batch=warm_up_batch,
                continuous=continuous,
                explain=explain,
            ).to_dict()

    return measure


def open_estimator(workload: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    """Return `estimate(precision, remat, batch_size, micro_batches)` for `memfit.plan`.

    Each call predicts (with `memfit.estimate`, nothing run) the peak of the step
    `memfit.fit` runs for the workload (`WorkloadSpec.to_json`) built under `precision` and
    `remat`: the model's step at the micro-batch size, plus what a micro-batched step holds
    besides (the gradient sums and the rest of the batch). One model is alive at a time: a
    new configuration replaces the last. `estimate(what="device")` answers only the device
    the child trains on.
    """
    import dataclasses
    import gc
    import math

    from memfit.backend import tf as tfb
    from memfit.estimation import estimate_workload
    from memfit.workload_spec import WorkloadSpec

    keras = tfb.import_keras()
    spec = WorkloadSpec.from_json(workload)
    dataset = spec.load_data()
    built: dict[tuple[str | None, str | None], Any] = {}

    def workload_for(precision: str | None, remat: str | None) -> Any:
        key = (precision, remat)
        if key not in built:
            built.clear()
            keras.backend.clear_session()
            gc.collect()
            variant = dataclasses.replace(
                spec, precision=precision, remat=remat, data=dataset, saved_data=None
            )
            built[key] = variant.workload()
        return built[key]

    def estimate(
        what: str = "estimate",
        precision: str | None = None,
        remat: str | None = None,
        batch_size: int = 1,
        micro_batches: int = 1,
    ) -> dict[str, Any]:
        device = tfb.default_device()
        if what == "device":
            return {"device": device}
        workload = workload_for(precision, remat)
        micro = math.ceil(batch_size / micro_batches)
        from memfit.recomputation import remat_recompute

        result = estimate_workload(workload, micro, recompute=remat_recompute(remat))
        extra = 0
        if micro_batches > 1:
            # Gradient sums, one per trainable variable, and the rest of the batch, which
            # stays in memory while its micro-batches are sliced from it.
            extra = sum(int(math.prod(v.shape)) * 4 for v in workload.model.trainable_variables)
            full, part = (workload.synthetic_batch_bytes(n) for n in (batch_size, micro))
            extra += (full - part) if full is not None and part is not None else 0
        return {
            "device": device,
            "peak_bytes": result.peak_bytes + extra,
            "step_peak_bytes": result.peak_bytes,
            "resident_bytes": result.resident_bytes,
            "extra_bytes": extra,
        }

    return estimate


def open_what_if_estimator(
    workload: dict[str, Any],
    batch_size: int,
    threads: list[int],
    gpus: bool = False,
    path: list[str] | None = None,
) -> Callable[..., dict[str, Any]]:
    """Return `estimate(**variant)` for `memfit.estimate`'s what-ifs (see its `helper`).

    Each call builds the workload (`WorkloadSpec.to_json`) with the variant's fields
    replaced (`precision`, `remat`, `optimizer`, `input_shape`), traces and replays its step
    at `batch_size` as the parent would, under the parent's thread counts (`threads`:
    inter-op, intra-op) and grappler passes (`gpus`: whether the parent sees a GPU; this
    process runs with them hidden), and returns the what-if row's figures
    (`estimation.what_if_figures`). `path`: the parent's `sys.path`, so that a factory
    importable there is importable here.
    """
    for entry in path or []:
        if entry not in sys.path:
            sys.path.append(entry)
    from memfit.backend import tf as tfb
    from memfit.backend.tf_grappler import describe_as
    from memfit.backend.tf_kernels import assume_threads
    from memfit.estimation import estimate_variant
    from memfit.workload_spec import WorkloadSpec

    describe_as(gpus=gpus)
    tfb.import_keras()  # now, while the parent traces its own step
    spec = WorkloadSpec.from_json(workload)
    inter, intra = threads

    def estimate(**variant: Any) -> dict[str, Any]:
        with assume_threads(inter, intra):
            return estimate_variant(spec, int(batch_size), variant)

    return estimate


class _Recovered(Exception):
    """Raised from `memfit.fit`'s `on_recovery` to end a confirmation run at once."""


def confirm_plan(
    workload: dict[str, Any], batch_size: int, micro_batches: int, steps: int
) -> dict[str, Any]:
    """Train `steps` steps of `memfit.fit` at a plan's configuration, in this fresh process.

    The model is built from the workload (`WorkloadSpec.to_json`) under the plan's precision
    and recompute, its batch of `batch_size` samples (synthesised, or the dataset's largest)
    repeats for `steps` updates of `K = micro_batches`. The run stops at the first recovery
    (the plan did not hold). Training pauses between steps (no allocator-stall watch here):
    the parent stops the process soon after TensorFlow logs an OOM instead
    (`run_in_child(oom_grace=...)`).

    Returns:
        `steps_done`, `recoveries` (their descriptions), `peak_bytes` (highest step peak),
        `peaks_bytes`, `step_seconds` (median after the first step), `error` (why training
        stopped, when `memfit.fit` gave up).
    """
    import time

    import memfit
    from memfit.backend import tf as tfb
    from memfit.errors import MemfitError
    from memfit.recomputation import remat_recompute
    from memfit.workload_spec import WorkloadSpec

    tf = tfb.import_tf()
    spec = WorkloadSpec.from_json(workload)
    if spec.is_task:
        return _confirm_task_plan(spec, batch_size, micro_batches, steps)
    keras = tfb.import_keras()
    built = spec.workload()
    model = built.model
    device = tfb.default_device()
    x, y = built.batch(int(batch_size))
    batches = tf.data.Dataset.from_tensors((x, y)).repeat(int(steps))
    peaks: list[int] = []
    times: list[float] = []
    recoveries: list[str] = []

    class Recorder(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            times.append(time.perf_counter() - self.started)
            peak = self.model.train_function.guarded_step.last_peak_bytes
            if peak is not None:
                peaks.append(int(peak))

    def stop(recovery: Any) -> None:
        recoveries.append(str(recovery))
        raise _Recovered

    error = None
    try:
        memfit.fit(
            model,
            batches,
            epochs=1,
            verbose=0,
            callbacks=[Recorder()],
            micro_batches=int(micro_batches),
            on_recovery=stop,
            recompute=remat_recompute(spec.remat),
            # One batch, already on the card: nothing to serve (a worker would only add a
            # process and count the batch twice).
            data_service=None,
        )
    except _Recovered:
        pass
    except MemfitError as exc:  # even one sample per micro-batch ran out of memory
        error = str(exc)
    return _confirmation(times, peaks, recoveries, error, device)


def _confirmation(
    times: list[float], peaks: list[int], recoveries: list[str], error: str | None, device: str
) -> dict[str, Any]:
    """What a confirmation run reports (see `confirm_plan`)."""
    import statistics

    return {
        "steps_done": len(times),
        "recoveries": recoveries,
        "peak_bytes": max(peaks) if peaks else None,
        "peaks_bytes": peaks,
        "step_seconds": statistics.median(times[1:]) if len(times) > 1 else None,
        "error": error,
        "device": device,
    }


def _confirm_task_plan(
    spec: Any, batch_size: int, micro_batches: int, steps: int
) -> dict[str, Any]:
    """`confirm_plan` for a Model Garden task: `steps` calls of `GuardedStep.from_task` at K
    on one batch of the task's inputs, stopped at the first recovery."""
    import time

    import memfit
    from memfit.backend import tf as tfb
    from memfit.errors import MemfitError

    tf = tfb.import_tf()
    built = spec.task_workload()
    device = tfb.default_device()
    data = built.batch(int(batch_size))
    peaks: list[int] = []
    times: list[float] = []
    recoveries: list[str] = []

    def stop(recovery: Any) -> None:
        recoveries.append(str(recovery))
        raise _Recovered

    step = memfit.GuardedStep(
        built.model,
        int(micro_batches),
        optimizer=built.optimizer,
        step_fn=built.step_fn,
        metrics=built.metrics,
        on_recovery=stop,
        verbose=False,
    )
    error = None
    try:
        for _ in range(int(steps)):
            started = time.perf_counter()
            logs = step(data)
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, logs)
            times.append(time.perf_counter() - started)
            if step.last_peak_bytes is not None:
                peaks.append(int(step.last_peak_bytes))
    except _Recovered:
        pass
    except MemfitError as exc:  # even one sample per micro-batch ran out of memory
        error = str(exc)
    return _confirmation(times, peaks, recoveries, error, device)


# Where the call being answered writes its result. `main` runs as `__main__` and fills the
# list of the imported `memfit._child`, the module the handlers come from.
_answer_path: list[str] = []
# Share of the room above the resident bytes that a step must hold for a quiet child to be
# taken to wait for memory.
STALL_PRESSURE = 0.5


def _stall_exits(device: str, resident: int, limit: int | None = None) -> Any:
    """Around a measurement in this child: when the step stalls in TensorFlow's allocator
    retry (an OOM is then certain, see `AllocatorStallWatch`), answer OOM now and end the
    process instead of waiting out the 10 s retry. The child is used up after an OOM anyway.

    A quiet spell counts only while the step holds at least `STALL_PRESSURE` of the room the
    budget's `limit` leaves above the `resident` bytes: a request refused with more than that
    free would be a single tensor larger than the rest of the step, and TensorFlow then
    raises after its retry all the same. Without a limit (no emulated budget: the CPU
    allocator is not capped) there is no watch."""
    import contextlib

    from memfit.backend import tf as tfb
    from memfit.sizes import format_size

    if not _answer_path or limit is None or not tfb.allocator_stall_detectable(device):
        return contextlib.nullcontext()

    def answer_oom() -> None:
        info = tfb.memory_info(device) or {}
        _write(
            _answer_path[-1],
            {
                "result": {
                    "hung_after_oom": True,
                    "allocator_stall": True,
                    "max_in_use_bytes": info.get("peak"),
                    "resident_bytes": resident,
                    "oom_message": (
                        f"an allocation waited for memory with "
                        f"{format_size(info.get('current', 0))} in use and nothing left "
                        f"running to free any"
                    ),
                }
            },
        )
        sys.stderr.flush()
        os._exit(0)

    def pressed() -> bool:
        info = tfb.memory_info(device) or {}
        held = info.get("current", 0) - resident
        return held >= STALL_PRESSURE * (limit - resident)

    return tfb.AllocatorStallWatch(answer_oom, pressed=pressed)


def dataset_size(spec: str) -> int | None:
    """Number of samples a `package.module:dataset_fn` dataset yields, or None when it repeats
    for ever or is longer than `SAMPLES_READ` of unknown length (`workload.count_samples`: a
    bounded read, never element by element through an infinite dataset)."""
    from memfit.workload import count_samples

    return count_samples(load_dataset(spec))


def load_dataset(spec: str) -> Any:
    """Call a `package.module:dataset_fn` that returns a tf.data.Dataset of (x, y) samples."""
    from memfit.models import call_factory

    return call_factory(spec)


def _clean(text: str) -> str:
    """A model's error message on one line (its layer and cause), as `memfit.errors` makes it."""
    try:
        from memfit.errors import clean_message
    except ImportError:  # pragma: no cover - the child runs in memfit's environment
        return text
    return clean_message(text) or text


def _payload(call: Callable[[], Any]) -> dict[str, Any]:
    """Run `call`; its result, or its error as the parent re-raises it."""
    try:
        return {"result": call()}
    except Exception as exc:  # noqa: BLE001 - everything goes back to the parent
        is_memfit = "memfit.errors" in sys.modules and isinstance(
            exc, sys.modules["memfit.errors"].MemfitError
        )
        return {
            "error": {
                "type": type(exc).__name__,
                "message": str(exc) if is_memfit else _clean(str(exc)),
                "memfit": is_memfit,
                "traceback": traceback.format_exc(),
            }
        }


def _write(path: str, payload: dict[str, Any]) -> None:
    # Written whole, then renamed: the parent polls for the file and must never see half.
    with open(path + ".part", "w") as handle:
        json.dump(payload, handle)
    os.replace(path + ".part", path)


def _function(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def main(argv: list[str]) -> int:
    with open(argv[1]) as handle:
        job = json.load(handle)
    answer_path = importlib.import_module("memfit._child")._answer_path

    def prepare() -> Any:
        import memfit  # noqa: F401 - applies MEMFIT_MEMORY before TensorFlow initialises
        from memfit.emulation import ensure_memory_statistics

        ensure_memory_statistics()
        return _function(job["function"])(**job["kwargs"])

    if not job.get("serve"):
        answer_path.append(job["result"])
        _write(job["result"], _payload(prepare))
        return 0
    # Serving: the function returned a handler; answer one request per stdin line.
    handler: list[Any] = []
    ready = _payload(lambda: handler.append(prepare()))
    _write(job["result"], ready)
    if "error" in ready:
        return 0
    for line in sys.stdin:
        request = json.loads(line)
        answer_path.append(request["result"])
        _write(request["result"], _payload(lambda r=request: handler[0](**r["kwargs"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
