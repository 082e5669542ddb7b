"""Measure: run one real training step at a batch size and read the device's peak memory."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from memfit.backend import tf as tfb
from memfit.backend.tf_kernels import tensor_bytes
from memfit.backend.tf_profile import AllocationRecorder, step_info
from memfit.budget.budget import Budget, as_budget, emulated_budget
from memfit.checks import Options, check_batch_size, takes_options
from memfit.console.progress import Progress, shows_progress
from memfit.errors import WorkloadError
from memfit.measuring.explain import explain_records
from memfit.measuring.isolate import measure_in_child
from memfit.measuring.measurement import Measurement  # also memfit.measuring.measurer.Measurement
from memfit.recomputation.remat import as_recompute
from memfit.sizes import format_size
from memfit.workload.accumulate import AccumulatingStep
from memfit.workload.spec import WorkloadSpec
from memfit.workload.step import StepWorkload, refuse_for_step
from memfit.workload.workload import InputShape, Workload

DEFAULT_REPEATS = 3


@takes_options("repeats", "device", "isolated", "worst_case")
@shows_progress(
    "on_progress", lambda a: f"measuring batch {a['batch_size']}", "phase", deprecated=True
)
def measure(
    model: Any,
    batch_size: int,
    *,
    data: Any = None,
    input_shape: InputShape | None = None,
    optimizer: Any = None,
    loss: Any = None,
    budget: Budget | str | int | None = None,
    micro_batches: int = 1,
    on_progress: Callable[[str], None] | None = None,
    recompute: Any = None,
    explain: bool = False,
    step_fn: Callable[[Any, Any], Any] | None = None,
    overrides: Any = (),
    params: Any = (),
    progress: Progress = None,
    options: Options | None = None,
) -> Measurement:
    """Run one real training step of `model` at `batch_size` and measure its peak memory.

    The step is the model's own `train_step` (its compiled loss and optimizer, or the given
    ones), so custom training steps are measured as they train. Protocol: one warm-up step
    (traces the function and settles the allocator), then `repeats` steps, each after resetting
    the allocator's peak; `peak_bytes` is the highest of them and `peaks_bytes` shows the
    spread. Afterwards every weight, optimizer variable (iteration count included), metric and
    RNG state is restored bit for bit, and the batch is freed, so the device holds what it held
    before.

    On CPU the allocator keeps statistics only when memfit switched on TensorFlow's BFC
    allocator before TensorFlow initialised (`memfit.emulate`, `MEMFIT_MEMORY`, the CLI's
    `--memory`); otherwise measure in a child process (`options=Options(isolated=True)`).

    Args:
        model: a Keras model, or (isolated) a MODEL string
            (`.keras` file, `package.module:factory`, `keras.applications.Name`), or a
            TF Model Garden task (`garden:EXPERIMENT`, `garden:package.module:callable`),
            whose step is the task's own `train_step` (see docs/garden.md).
        batch_size: samples in the step (at least 1).
        data: a `tf.data.Dataset` of unbatched `(x, y)` samples; default: synthesised samples.
            Isolated: a `package.module:dataset_fn` string.
        input_shape: shape of one sample for models with undefined input dimensions.
        optimizer: optimizer to compile with (default: the model's own, else Adam).
        loss: loss to compile with (default: the model's own, else one chosen for the output).
        budget: in-process: the budget to compare against (default: the emulated one).
            Isolated: the budget to emulate in the child process (default: the one this
            process emulates).
        micro_batches: measure the step `memfit.fit` runs with this many micro-batches
            (gradients accumulated over them, one update) instead of the model's `train_step`.
        on_progress: deprecated, `progress=callable` instead.
        recompute: measure the step with memfit's recompute (gradient checkpointing): a
            `segments=` policy of `memfit.recompute` (`"sqrt"`, a count, a size, layer
            names; True means `"sqrt"`), or (in process) a `memfit.Recompute` of `model`.
            Not for a step spec.
        explain: also run one step under TensorFlow's profiler and list what was alive at
            its peak, by layer and kind, beside `memfit.estimate`'s breakdown of the same
            step (`Measurement.explanation`; see `memfit.measuring.explain`). Needs the BFC
            allocator
            (a GPU, or a CPU under a memfit budget). Not for a step spec.
        step_fn: a step spec, in process: `step_fn(data, optimizer) -> logs`, the whole
            training step of `model` (Keras 3 or tf_keras) with `optimizer`, as
            `memfit.GuardedStep` takes it; `data` is then a callable `batch_size -> batch`
            or an unbatched `tf.data.Dataset`. The step measured is `tf.function(step_fn)`.
        overrides: for a `garden:` task, `key.path=value` strings applied to its experiment
            config (`task.model.input_size=[128,128,3]`).
        params: for a `garden:` task, YAML/JSON files or texts applied to its config first.
        progress: show the phases on stderr (a spinner): None (default) when stderr is a
            terminal or a notebook, True / False, or a callable that receives each
            phase's text instead (`memfit.console.progress`).
        options: the knobs few runs change (`memfit.Options`): `repeats`, the measured
            steps after the warm-up (default 3); `device` to measure (default `GPU:0` when
            present, else `CPU:0`); `isolated`, to measure in a fresh child process, for
            devices where an OOM leaves the process unusable, or when this process cannot
            measure (TensorFlow already initialised); `worst_case`, to build the batch of
            the dataset's largest samples.

    Returns:
        A `Measurement`; `oom=True` when the step ran out of memory.

    Example:
        ```python
        import memfit
        memfit.emulate("1GiB")
        model = build_model()                # a compiled Keras model
        print(memfit.measure(model, batch_size=16))
        ```
    """
    check_batch_size(batch_size)
    options = options or Options()
    repeats = options.get("repeats", DEFAULT_REPEATS)
    device, isolated, worst_case = options.device, options.isolated, options.worst_case
    if step_fn is not None:
        if isolated or isinstance(model, str):
            raise WorkloadError(
                "step_fn= measures a model object in this process; a child process cannot "
                "rebuild a Python step: name a Model Garden task (garden:EXPERIMENT) to isolate"
            )

        built = StepWorkload.from_data(model, optimizer, step_fn, data)
        return measure_built(
            built,
            batch_size,
            repeats=repeats,
            device=device,
            on_progress=on_progress,
            budget=as_budget(budget) or emulated_budget(),
            micro_batches=micro_batches,
            recompute=recompute,
            explain=explain,
        )
    if not isolated and isinstance(model, str):
        raise WorkloadError(
            "measure() takes a keras.Model in this process; to measure a MODEL string, "
            "pass options=memfit.Options(isolated=True) or load it with memfit.load_model()"
        )
    workload, given = WorkloadSpec.from_arguments(locals())
    knobs = {
        "repeats": repeats,
        "budget": as_budget(budget) or emulated_budget(),
        "micro_batches": micro_batches,
        "recompute": recompute,
        "explain": explain,
    }
    if isolated:
        return measure_in_child(workload, batch_size, model=given, **knobs)
    return measure_built(
        workload.workload(given), batch_size, device=device, on_progress=on_progress, **knobs
    )


def measure_built(
    workload: Workload,
    batch_size: int,
    *,
    repeats: int = DEFAULT_REPEATS,
    budget: Budget | None = None,
    device: str | None = None,
    on_progress: Callable[[str], None] | None = None,
    micro_batches: int = 1,
    recompute: Any = None,
    explain: bool = False,
) -> Measurement:
    """`memfit.measure` in this process of a `Workload` built once (for several batch sizes).

    Args:
        workload: the built model and its samples (`WorkloadSpec.workload`).
        batch_size: samples in the step.
        repeats, device, on_progress, micro_batches, recompute, explain: as in `measure`.
        budget: the budget to compare against (default: the emulated one).

    Returns:
        A `Measurement`.
    """
    return _recomputing(workload, recompute, measure_workload)(
        workload,
        batch_size,
        repeats=repeats,
        device=device or tfb.default_device(),
        budget=budget or emulated_budget(),
        progress=on_progress or (lambda _text: None),
        micro_batches=micro_batches,
        explain=explain,
    )


def measure_workload(
    workload: Workload,
    batch_size: int,
    *,
    repeats: int,
    device: str,
    budget: Budget | None,
    progress: Callable[[str], None] = lambda _text: None,
    micro_batches: int = 1,
    exact: bool = True,
    restore: bool = True,
    warm_up: bool = True,
    warm_up_batch: int | None = None,
    step_kind: str | None = None,
    continuous: bool = False,
    explain: bool = False,
) -> Measurement:
    """Measure a prepared Workload (see `measure`); reuses its ranked samples and traces.

    `exact=False` measures with one trace shared by all batch sizes (see
    `Workload.train_function`): faster across many sizes, peaks a few percent high.
    `restore=False` leaves the steps' updates in place (for a throwaway process: no copy of
    the state is kept, and the variables keep their buffers, so the allocator's layout is
    what training would have). `warm_up=False` measures from the first step, for a process
    whose trace has already run (its graph optimised, its allocator in use): there a new
    size's first step peaks as high as its second. `warm_up_batch` (with `exact=False`) runs
    the warm-up step at that smaller size instead: the graph's optimisation without a full
    step's compute, after which the size's first step peaks as high as its second too.

    The step is the one training runs. `step_kind="fit"` (the default at one micro-batch):
    Keras' own train function, the one `model.fit` builds, fed the batch through a `tf.data`
    iterator as `model.fit` feeds a dataset (`Workload.fit_step`). `"memfit"` (the default
    at several): the step `memfit.fit` runs at `micro_batches` — gradients accumulated over
    the micro-batches, then one update.

    `continuous=True` runs the measured steps back to back, as `model.fit` runs them with no
    callback reading each step's results, and reads one peak over them all (`peaks_bytes`
    has that one value): there one step's memory can still be held when the next starts.
    MobileNetV2 64 px, batch 36, 20 steps of `model.fit` (one thread each pool): 254 MiB
    back to back, 236 MiB with a callback reading the allocator after every step.

    `explain=True` runs the measured steps (not the warm-up) under TensorFlow's profiler and
    sets `Measurement.explanation` from its allocator records: the tensors alive at the
    highest of their peaks, which is `peak_bytes` (see `memfit.measuring.explain`). The profiler's
    overhead is then in `step_seconds`.
    """
    tf = tfb.import_tf()
    model = workload.model
    stepped = getattr(workload, "is_step", False)
    if stepped:
        refuse_for_step(explain=explain)
    tfb.require_memory_stats(device)
    recorder = None
    if explain:
        recorder = AllocationRecorder(device)  # says now when there is no profiler
    if stepped:
        workload.build_optimizer()
    else:
        _build_optimizer(model)
    state = workload.state_variables()

    gc.collect()
    resident = tfb.memory_info(device)["current"]  # type: ignore[index]
    saved = [np.array(v.numpy(), copy=True) for v in state] if restore else None

    result = Measurement(
        batch_size=int(batch_size),
        device=device,
        oom=False,
        peak_bytes=None,
        resident_bytes=resident,
        step_seconds=None,
        budget=budget,
    )
    step_kind = step_kind or ("memfit" if micro_batches > 1 else "fit")
    if step_kind not in ("fit", "memfit"):
        raise ValueError(f"step_kind must be 'fit' or 'memfit', got {step_kind!r}")
    if step_kind == "memfit":
        # A step spec's micro-batches run its own step, as GuardedStep(step_fn=...) does.
        accumulating = (
            AccumulatingStep(
                model,
                optimizer=workload.optimizer,
                step_fn=workload.step_fn,
                metrics=workload.metrics,
            )
            if stepped
            else AccumulatingStep(model)
        )

        def step(data: Any) -> Any:
            accumulating.apply(accumulating.gradients(data, micro_batches))
            return accumulating.results()
    else:
        step = workload.fit_step(exact=exact)  # traced on its first step
    times: list[float] = []
    try:
        with tf.device(device):
            progress(f"batch {batch_size}: preparing inputs")
            # TensorFlow crashes (SIGSEGV) instead of raising when an eager tensor made from a
            # NumPy array does not fit the capped allocator: check synthesised inputs first.
            needed = workload.synthetic_batch_bytes(int(batch_size))
            if (
                budget is not None
                and needed is not None
                and resident + needed > budget.usable_bytes
            ):
                result.oom = True
                result.oom_message = (
                    f"the batch itself: its inputs and targets need {format_size(needed)} next "
                    f"to {format_size(resident)} resident, over the "
                    f"{format_size(budget.usable_bytes)} budget"
                )
                result.peak_bytes = resident + needed
                return result
            x, y = workload.batch(int(batch_size))
            result.input_shapes = [list(t.shape[1:]) for t in tf.nest.flatten(x)]
            data = (x, y)
            warm_data = data
            if warm_up and not exact and warm_up_batch and warm_up_batch < batch_size:
                warm_data = workload.batch(int(warm_up_batch))
            for index in range(0 if warm_up else 1, repeats + 1):
                progress(
                    f"batch {batch_size}: tracing and warm-up step"
                    if index == 0
                    else f"batch {batch_size}: step {index}/{repeats}"
                )
                last = index == repeats
                if recorder is not None and index == 1:
                    recorder.start()  # the measured steps are explained, not the warm-up
                if not continuous or index <= 1:
                    tfb.reset_peak(device)
                    start = time.perf_counter()
                try:
                    logs = step(warm_data if index == 0 else data)
                    if not continuous or index == 0 or last:
                        tf.nest.map_structure(
                            lambda t: t.numpy() if hasattr(t, "numpy") else t, logs
                        )
                    del logs
                except tf.errors.ResourceExhaustedError as exc:
                    tfb.clear_step_resources()  # for the next batch size measured here
                    result.oom = True
                    result.oom_message = tfb.oom_summary(exc)
                    info = tfb.memory_info(device) or {"peak": 0}
                    result.peak_bytes = max([info["peak"], *result.peaks_bytes])
                    del exc
                    break
                if continuous and index > 0 and not last:
                    continue
                elapsed = time.perf_counter() - start
                peak = tfb.memory_info(device)["peak"]  # type: ignore[index]
                if index == 0:
                    if result.trace_seconds is None:
                        result.trace_seconds = elapsed
                    continue
                # Back to back, the time and the peak are over all the measured steps.
                times.append(elapsed / (repeats if continuous else 1))
                result.peaks_bytes.append(peak)
            if recorder is not None and not result.oom:
                progress(f"batch {batch_size}: reading the profile to explain the peak")
                batches = [data] if warm_data is data else [data, warm_data]
                result.explanation = _explain(
                    workload, recorder.stop(), device, batch_size, result, batches
                )
            del data, warm_data, x, y
    finally:
        if recorder is not None:
            recorder.close()
        if saved is not None:
            _restore(state, saved)
        workload.release_fit_step()
        del saved, step
        gc.collect()
    if not result.oom:
        result.peak_bytes = max(result.peaks_bytes)
        result.step_seconds = statistics.median(times)
    after = tfb.memory_info(device)
    result.leaked_bytes = (after["current"] - resident) if after else 0
    return result


def _explain(
    workload: Workload,
    records: list[Any],
    device: str,
    batch_size: int,
    result: Measurement,
    batches: Any = (),
) -> Any:
    """What was alive at the measured steps' peak, from their allocator records.

    `batches`: the tensors the steps read, made before them (resident, as the variables).
    """

    tf = tfb.import_tf()
    info = step_info(workload)
    info.batch_bytes = sum(
        tensor_bytes(t.shape, t.dtype) for t in tf.nest.flatten(batches) if isinstance(t, tf.Tensor)
    )
    return explain_records(
        workload,
        records,
        info=info,
        device=device,
        batch_size=int(batch_size),
        measured_peak_bytes=max(result.peaks_bytes) if result.peaks_bytes else None,
    )


def _restore(variables: list[Any], values: list[np.ndarray]) -> None:
    """Write saved values back bit for bit with `assign` (see `tfb.assign_exact`).

    Not with `scatter_update`, which would keep each variable in its own buffer: a sparse
    update switches a resource variable to copy-on-read for good, after which every read of
    it copies the whole weight (a ResNet50 step run after such a restore peaked at 648 MiB
    instead of 337 MiB). `assign` gives the variable a new buffer on its device and frees the
    old one, so the bytes in use are the same up to the allocator's rounding; only their place
    in the allocator moves.
    """
    for var, value in zip(variables, values, strict=True):
        tfb.assign_exact(var, value)


def _build_optimizer(model: Any) -> None:
    """Create the optimizer's slots now, so resident bytes include them (as in training)."""
    optimizer = model.optimizer
    if optimizer is None:
        raise WorkloadError("the model has no optimizer; compile it or pass optimizer=")
    if not getattr(optimizer, "built", True):
        optimizer.build(model.trainable_variables)


def measure_many(
    model: Any,
    batch_sizes: list[int],
    **kwargs: Any,
) -> list[Measurement]:
    """Measure several batch sizes in ascending order (one warm-up each); see `measure`."""
    for size in batch_sizes:
        check_batch_size(size)
    return [measure(model, size, **kwargs) for size in sorted(batch_sizes)]


def _recomputing(workload: Workload, recompute: Any, run: Callable[..., Any]) -> Callable[..., Any]:
    """`run` with memfit's recompute applied to the workload's model while it runs."""

    if getattr(workload, "is_step", False):
        refuse_for_step(recompute=recompute)
        return run

    segmented = as_recompute(workload.model, recompute)
    if segmented is None:
        return run

    def with_recompute(*args: Any, **kwargs: Any) -> Any:
        with segmented:
            return run(*args, **kwargs)

    return with_recompute
