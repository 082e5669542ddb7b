"""A plan's confirmation run in a fresh process: train a few steps of `memfit.fit` as planned.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from memfit.backend import tf as tfb
from memfit.errors import MemfitError
from memfit.recomputation.remat import remat_recompute
from memfit.training.fitting import fit
from memfit.training.guarded_step import GuardedStep
from memfit.workload.spec import WorkloadSpec


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
        fit(
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

    step = GuardedStep(
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
