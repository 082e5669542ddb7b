"""Training: `memfit.fit`, the `model.fit` that keeps the effective batch and survives OOM.

`fit` checks its arguments, installs a `GuardedStep` as the model's train function (and, with
`backup_dir`, a `memfit.training.backup.Backup`), runs Keras' own `model.fit` and puts the model's
train function back. The step itself is in `memfit.training.guarded_step`, what it did in
`memfit.training.recovery`, the check of a `memfit.Plan` against the model in
`memfit.training.plan_check`.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend import tf_keras_compat as compat
from memfit.budget.budget import ENV_EMULATED_ON, emulated_budget
from memfit.checks import check_batch_size
from memfit.data.service import (
    DataService,
    check_servable,
    python_ops_in,
    resolve,
    serving,
)
from memfit.errors import DataError, MemfitError
from memfit.recomputation.remat import remat_recompute
from memfit.training.backup import Backup
from memfit.training.distributed import fix_keras_multi_worker_build
from memfit.training.guarded_step import GuardedStep, check_trainable_model
from memfit.training.plan import Plan
from memfit.training.plan_check import check_plan
from memfit.training.recovery import Recovery


def fit(
    model: Any,
    x: Any = None,
    y: Any = None,
    batch_size: int | None = None,
    epochs: int = 1,
    verbose: str | int = "auto",
    callbacks: list[Any] | None = None,
    validation_split: float = 0.0,
    validation_data: Any = None,
    shuffle: bool = True,
    class_weight: dict[int, float] | None = None,
    sample_weight: Any = None,
    initial_epoch: int = 0,
    steps_per_epoch: int | None = None,
    validation_steps: int | None = None,
    validation_batch_size: int | None = None,
    validation_freq: int = 1,
    *,
    micro_batches: int | None = None,
    guard_update: bool | str = "auto",
    on_recovery: Callable[[Recovery], None] | None = None,
    budget: Any = None,
    recompute: Any = None,
    backup_dir: str | os.PathLike[str] | None = None,
    save_freq: str | int = "epoch",
    keep_backup: bool = False,
    data_service: Any = "auto",
    plan: Any = None,
) -> Any:
    """`model.fit` that trains at the batch you ask for and survives out-of-memory errors.

    Takes what `model.fit` takes and returns its `History`. `batch_size` is the effective
    batch: every optimizer update sees exactly that many samples. A batch that does not fit
    is split inside the step into K micro-batches whose gradients are summed and applied
    once, so no sample is skipped or seen twice, the optimizer's iteration count and
    learning-rate schedules advance once per batch, and losses and metrics cover the whole
    batch. On `ResourceExhaustedError` the same batch is retried with twice the
    micro-batches, with every variable as it was before the failed attempt (also when the
    error struck inside the optimizer update). K is kept per input shape.

    `history.memfit` holds a `FitSummary`: K per input shape, each `Recovery`, the updates.

    Args:
        model: a compiled Keras 3 or tf_keras (Keras 2) model with Keras' standard
            `train_step` (a step of your own: `memfit.GuardedStep` with `step_fn`).
        x, y, ..., validation_freq: as `model.fit`. A `tf.data.Dataset` yields batches (as in
            Keras), and they are the effective batches; a `batch_size` larger than them
            re-batches the dataset to it, a smaller one is an error. A dataset that repeats
            for ever needs `steps_per_epoch` (else its first epoch would never end).
        micro_batches: K to start with; default 1 — memfit splits only when a step runs
            out of memory.
        guard_update: see `GuardedStep` (default `"auto"`).
        on_recovery: called with each `Recovery` as it happens.
        budget: the budget to train in (default: the emulated one, else the device's); it
            judges the update's headroom. To cap memory, emulate it first (`memfit.emulate`).
        recompute: train with memfit's recompute (see `memfit.recompute`): `"sqrt"`, a
            count, a size, layer names, True (`"sqrt"`) or a `memfit.Recompute`.
        backup_dir: make the run preemption-safe (see `memfit.training.backup`): keep a checkpoint
            here (weights, optimizer state, K per input shape, the data position, a
            `memfit.Watch`'s log), written atomically at each epoch's end (`save_freq`) and
            on SIGTERM, after which the process exits with status 143. The next `fit` with
            the same `backup_dir` resumes at the same update; a completed run removes it.
            Exact resume needs epochs in the same order in every run (`shuffle=False` for
            arrays, an unshuffled or fixed-seed dataset) and no `steps_per_epoch`.
        save_freq: with `backup_dir`: `"epoch"` (default) or N, a checkpoint every N updates.
        keep_backup: with `backup_dir`: keep the checkpoint after the run completes.
        data_service: run a `tf.data.Dataset`'s pipeline on tf.data service workers (see
            `memfit.data.DataService`): N local worker processes, a dispatcher's address
            (`"grpc://host:5050"`), a `DataService`, or None. Default `"auto"`: one local
            worker under a CPU-emulated card, where the pipeline's buffers would otherwise
            count against the card (a GPU keeps them in host memory); none elsewhere, and
            none for a pipeline that calls Python (`from_generator`, `tf.py_function`).
        plan: a `memfit.Plan` (from `memfit.plan`) to train by: its K, and its recompute. A
            plan holds only for a model built with its precision and recompute
            (`Plan.build_scope()`); any other model is refused with a `MemfitError` that says
            how to build it (see `check_plan`). (A plan passed as `micro_batches` still
            works, with a `DeprecationWarning`.)

    Returns:
        The `keras.callbacks.History`, with `history.memfit` added.

    Example:
        ```python
        memfit.emulate("1GiB")               # or device="T4"; on the real card: nothing to set
        history = memfit.fit(model, train_ds, epochs=10, validation_data=val_ds)
        for recovery in history.memfit.recoveries:
            print(recovery)

        # Preemption-safe: SIGTERM writes a checkpoint and exits 143; run it again to resume.
        memfit.fit(model, x, y, batch_size=64, epochs=10, shuffle=False,
                   backup_dir="checkpoints/run1")
        ```
    """
    check_trainable_model(model)
    tf = tfb.import_tf()
    tf_keras = compat.is_tf_keras(model)
    if batch_size is not None:
        batch_size = check_batch_size(batch_size)
    if tf_keras and backup_dir is not None:
        raise MemfitError(
            "backup_dir works with Keras 3 models; for a tf_keras model keep checkpoints with "
            "tf_keras.callbacks.BackupAndRestore (or the Model Garden's own checkpointing)"
        )
    if tf_keras:
        executions = getattr(model, "_steps_per_execution", None)
        executions = 1 if executions is None else int(executions.numpy())
    else:
        executions = getattr(model, "steps_per_execution", 1)
    if executions != 1:
        raise MemfitError(
            "memfit.fit needs steps_per_execution=1 (it guards each step on its own); "
            "compile the model without steps_per_execution"
        )
    service = None
    if isinstance(x, tf.data.Dataset):
        _check_epoch_ends(tf, x, steps_per_epoch)
        x = _rebatched(x, batch_size)
        batch_size = None
        service = _data_service(model, x, data_service)
        batches = int(tf.data.experimental.cardinality(x))
        if service is not None and steps_per_epoch is None and backup_dir is None and batches > 0:
            # One service job for the whole fit, so the pipeline's epochs follow each other as
            # in this process (a shuffle reshuffles each epoch); a job an epoch would start
            # every epoch from the pipeline's first state.
            x, steps_per_epoch = x.repeat(), batches
    elif _arrays(x) and backup_dir is None and not tf_keras:
        service = _data_service(model, None, data_service)
        try:
            # Keras' own pipeline for the arrays (its shuffling, class and sample weights),
            # served; the validation split is taken first, as Keras takes it.
            served = service and _arrays_dataset(
                x, y, sample_weight, batch_size, shuffle, class_weight, steps_per_epoch,
                validation_split, validation_data,
            )
        except ImportError:  # a Keras that moved its (private) adapter: arrays stay here
            served = service = None
        if served:
            x, validation_data, steps_per_epoch = served
            y = sample_weight = class_weight = batch_size = None
            validation_split, shuffle = 0.0, False  # both done in the dataset
    elif data_service not in ("auto", None, 0):
        raise DataError(
            "data_service runs a tf.data.Dataset's pipeline, or Keras' pipeline for arrays "
            "(not with backup_dir or a tf_keras model); pass the input as a tf.data.Dataset, "
            "or leave data_service out"
        )
    # Elements that come from outside TensorFlow's allocator (tf.data service, a generator)
    # are copied onto an emulated card for the step, as a GPU copies the batch it reads.
    outside = service is not None or not (isinstance(x, tf.data.Dataset) or _arrays(x))
    if isinstance(micro_batches, Plan):
        warnings.warn(
            "memfit.fit(micro_batches=plan) is deprecated: pass the plan as plan=plan",
            DeprecationWarning,
            stacklevel=2,
        )
        plan, micro_batches = micro_batches, None
    if plan is not None:
        if not isinstance(plan, Plan):
            raise MemfitError(
                f"plan= takes a memfit.Plan (from memfit.plan), got {type(plan).__name__}"
            )
        check_plan(model, plan)
        # A plan for memfit's recompute wraps the model's forward: no rebuild needed.
        recompute = recompute or remat_recompute(plan.remat)
        micro_batches = micro_batches or plan.micro_batches
    k = micro_batches or 1
    step = GuardedStep(
        model,
        micro_batches=k,
        guard_update=guard_update,
        on_recovery=on_recovery,
        verbose=verbose != 0,
        budget=budget,
        recompute=recompute,
    )
    tracker = _epoch_tracker(step, tf_keras)
    backup = None
    if backup_dir is not None:
        backup = Backup(backup_dir, save_freq=save_freq, keep=keep_backup)
        initial_epoch = backup.prepare(
            model,
            step,
            x=x,
            shuffle=shuffle,
            steps_per_epoch=steps_per_epoch,
            callbacks=callbacks,
            initial_epoch=initial_epoch,
        )
    previous = model.train_function

    def train_function(iterator: Any) -> dict[str, Any]:
        batch = next(iterator)
        if outside:
            batch = tfb.hold_on_device(batch)
        return step(batch)

    train_function.guarded_step = step  # type: ignore[attr-defined]  # read by memfit.Watch
    model.train_function = train_function
    keras_build = (lambda: None) if tf_keras else fix_keras_multi_worker_build(model)
    try:
        with (
            backup.handling_signals() if backup is not None else contextlib.nullcontext(),
            serving(service),
        ):
            history = model.fit(
                service.serve(x) if service is not None else x,
                y,
                batch_size=batch_size,
                epochs=epochs,
                verbose=verbose,
                callbacks=[tracker, *(callbacks or []), *([backup.callback()] if backup else [])],
                validation_split=validation_split,
                validation_data=validation_data,
                shuffle=shuffle,
                class_weight=class_weight,
                sample_weight=sample_weight,
                initial_epoch=initial_epoch,
                steps_per_epoch=steps_per_epoch,
                validation_steps=validation_steps,
                validation_batch_size=validation_batch_size,
                validation_freq=validation_freq,
            )
    finally:
        model.train_function = previous
        keras_build()
    history.memfit = step.summary
    return history


def _data_service(model: Any, dataset: Any, data_service: Any) -> DataService | None:
    """The tf.data service to run `dataset` on, for `fit`'s `data_service=` (see there)."""
    if data_service != "auto":
        service = resolve(data_service)
        if service is not None and dataset is not None:
            check_servable(dataset)  # before any worker starts
        return service
    if os.environ.get(ENV_EMULATED_ON) != "CPU" or emulated_budget() is None:
        return None
    default = tfb.import_tf().distribute.get_strategy()
    if type(getattr(model, "distribute_strategy", default)) is not type(default):
        return None  # a strategy distributes the dataset itself, shard by shard
    try:
        if dataset is not None and python_ops_in(dataset):
            return None  # elements made by Python already live outside the emulated card
    except Exception:  # noqa: BLE001 - a graph that cannot be serialised is not served
        return None
    return DataService(workers=1, verbose=True)


def _arrays_dataset(
    x: Any,
    y: Any,
    sample_weight: Any,
    batch_size: int | None,
    shuffle: bool | str,
    class_weight: Any,
    steps_per_epoch: int | None,
    validation_split: float,
    validation_data: Any,
) -> tuple[Any, Any, int | None]:
    """The `tf.data.Dataset` Keras' `fit` makes of arrays, its validation data and steps."""
    from keras.src.trainers.data_adapters import array_slicing  # Keras 3's own, private
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    if validation_split and validation_data is None:
        (x, y, sample_weight), validation_data = array_slicing.train_validation_split(
            (x, y, sample_weight), validation_split=validation_split
        )
    adapter = ArrayDataAdapter(
        x,
        y,
        sample_weight=sample_weight,
        class_weight=class_weight,
        shuffle=shuffle,
        batch_size=batch_size or 32,
        steps=steps_per_epoch,
    )
    dataset = adapter.get_tf_dataset()
    if steps_per_epoch is None and adapter.num_batches:
        # One service job for the fit: its epochs reshuffle as Keras' own do (see `fit`).
        return dataset.repeat(), validation_data, adapter.num_batches
    return dataset, validation_data, steps_per_epoch


def _arrays(x: Any) -> bool:
    """Whether `x` is what Keras batches itself with TensorFlow ops (arrays, tensors)."""
    return hasattr(x, "shape") or (
        isinstance(x, (list, tuple, dict))
        and all(hasattr(v, "shape") for v in (x.values() if isinstance(x, dict) else x))
    )


def _epoch_tracker(step: GuardedStep, tf_keras: bool = False) -> Any:
    """A Keras callback that tells `step` which epoch runs (for its recovery records); a
    tf_keras one for a tf_keras model's `fit`."""
    if tf_keras:
        import tf_keras as keras  # present: the model is one of its own
    else:
        keras = tfb.import_keras()

    class EpochTracker(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            step.epoch = epoch

    return EpochTracker()


def _check_epoch_ends(tf: Any, dataset: Any, steps_per_epoch: int | None) -> None:
    """Refuse a dataset that repeats for ever without `steps_per_epoch`: Keras 3 would train
    its first epoch for ever, without a word."""
    infinite = int(tf.data.experimental.cardinality(dataset)) == tf.data.INFINITE_CARDINALITY
    if infinite and steps_per_epoch is None:
        raise DataError(
            "the dataset repeats for ever (repeat() with no count) and steps_per_epoch is not "
            "given: its first epoch would never end; pass steps_per_epoch=N (batches an "
            "epoch), or drop repeat()"
        )


def _rebatched(dataset: Any, batch_size: int | None) -> Any:
    """A dataset's batches are the effective batches (as in Keras); check them."""
    if batch_size is None:
        return dataset
    tf = tfb.import_tf()
    first = tf.nest.flatten(dataset.element_spec)[0]
    size = first.shape[0] if first.shape.rank else None
    if size is None:
        # Not known statically (drop_remainder=False): look at the first batch.
        for batch in dataset.take(1):
            size = int(tf.shape(tf.nest.flatten(batch)[0])[0])
    if size is None:
        raise MemfitError("the dataset is empty: it yields no batches")
    if size > batch_size:
        raise MemfitError(
            f"the dataset is already batched by {size}, more than batch_size={batch_size}: "
            f"batch it by {batch_size}, or leave batch_size out to train at {size}"
        )
    return dataset.rebatch(batch_size) if size < batch_size else dataset
