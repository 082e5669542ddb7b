"""Fit: `model.fit` that keeps the effective batch, splits steps that do not fit, survives OOM."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from memfit.accumulate import AccumulatingStep
from memfit.backend import tf as tfb
from memfit.backup import Backup
from memfit.budget import as_budget, emulated_budget
from memfit.checks import check_batch_size, check_positive_int
from memfit.distributed import (
    CANNOT_GO_ON,
    OUT_OF_MEMORY,
    WENT_THROUGH,
    Agreement,
    fix_keras_multi_worker_build,
)
from memfit.errors import MemfitError
from memfit.sizes import format_size

logger = logging.getLogger("memfit")

# Guard the optimizer update (snapshot the state it changes) while its own peak leaves less
# than this share of the budget free, or is not known yet.
APPLY_GUARD_HEADROOM = 0.2


@dataclass
class Recovery:
    """One out-of-memory error a step recovered from.

    Attributes:
        update: the optimizer update being computed (its iteration count before the step).
        epoch: the epoch (from 0), when known.
        input_shapes: shapes of the batch's inputs.
        phase: `"gradients"` (forward/backward) or `"apply"` (the optimizer update).
        old_micro_batches, new_micro_batches: K before and after.
        peak_bytes: the device's peak when the error struck, when known.
        seconds: from the error to the step completed with the new K.
        trace_seconds: of `seconds`, the time spent tracing the step for the new K.
        message: TensorFlow's error, first line.
        elsewhere: another worker (of a multi-worker strategy) ran out of memory, and this
            one retried with it.
    """

    update: int
    epoch: int | None
    input_shapes: list[list[int]]
    phase: str
    old_micro_batches: int
    new_micro_batches: int
    peak_bytes: int | None
    seconds: float = 0.0
    trace_seconds: float = 0.0
    message: str = ""
    elsewhere: bool = False

    def __str__(self) -> str:
        where = f"epoch {self.epoch + 1}, " if self.epoch is not None else ""
        peak = f", peak {format_size(self.peak_bytes)}" if self.peak_bytes else ""
        whose = " on another worker" if self.elsewhere else ""
        return (
            f"out of memory{whose} in the {self.phase} of update {self.update + 1} ({where}batch "
            f"{'x'.join(map(str, self.input_shapes[0]))}{peak}): retried with "
            f"{self.new_micro_batches} micro-batches (was {self.old_micro_batches}), "
            f"{self.seconds:.1f} s"
        )


@dataclass
class FitSummary:
    """What `memfit.fit` did: micro-batches per input shape, recoveries, updates."""

    micro_batches: dict[str, int] = field(default_factory=dict)
    recoveries: list[Recovery] = field(default_factory=list)
    updates: int = 0
    guarded_updates: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "micro_batches": dict(self.micro_batches),
            "recoveries": [asdict(r) for r in self.recoveries],
            "updates": self.updates,
            "guarded_updates": self.guarded_updates,
        }


class GuardedStep:
    """One training step that splits into micro-batches and recovers from OOM.

    Call it with a batch; it computes the gradients of the whole batch in K micro-batches,
    applies them in one optimizer update, and returns the model's metrics. On
    `ResourceExhaustedError` it puts back every variable the failed attempt changed
    (metrics; weights and optimizer slots when the error struck in the update) and retries
    the same batch with twice the micro-batches, until a micro-batch is one sample (an error
    in the update is retried once as it was first: its memory does not depend on K). K is kept
    per input shape, so a shard of larger images does not slow the rest down.

    Used by `memfit.fit`; use it directly in a custom (GradientTape) training loop: give it
    your optimizer and a `loss_fn(x, y)` that calls the model and returns the mean loss of
    the samples it gets, and call it once per batch instead of your tape-and-apply code.

    Args:
        model: a Keras model: compiled, with Keras' standard `train_step`; or any model when
            `optimizer` and `loss_fn` are given.
        optimizer: the optimizer of a custom loop (default: the model's).
        loss_fn: `loss_fn(x, y) -> scalar` of a custom loop: the mean loss over the samples of
            `x` (it is called per micro-batch and weighted by its share of the batch).
        micro_batches: K to start with for every input shape.
        guard_update: snapshot the state the optimizer update changes before it runs:
            `"auto"` while the update's own peak is unknown or leaves under 20% of the budget
            free, `True` always, `False` never (then an OOM inside the update is an error).
        on_recovery: called with each `Recovery`.
        verbose: log each recovery (through the `memfit` logger and to the terminal).
        budget: the budget the update's headroom is judged against (default: the emulated
            one); without one, `"auto"` guards every update.
        recompute: train with memfit's recompute (gradient checkpointing): a
            `segments=` policy of `memfit.recompute` (`"sqrt"`, a count, a size, layer
            names; True means `"sqrt"`) or a `memfit.Recompute` of `model`.

    Example:
        ```python
        loss = keras.losses.SparseCategoricalCrossentropy()
        step = memfit.GuardedStep(
            model, optimizer=keras.optimizers.Adam(1e-3),
            loss_fn=lambda x, y: loss(y, model(x, training=True)),
        )
        for x, y in dataset:                       # batches of the effective size
            logs = step((x, y))                    # {"loss": ...}
        print(step.summary.recoveries)
        ```
    """

    def __init__(
        self,
        model: Any,
        micro_batches: int = 1,
        *,
        optimizer: Any = None,
        loss_fn: Callable[[Any, Any], Any] | None = None,
        guard_update: bool | str = "auto",
        on_recovery: Callable[[Recovery], None] | None = None,
        verbose: bool = True,
        budget: Any = None,
        recompute: Any = None,
    ) -> None:
        if (optimizer is None) != (loss_fn is None):
            raise MemfitError(
                "a custom training loop gives GuardedStep both optimizer= and loss_fn=; a "
                "compiled model gives neither"
            )
        _check_model(model, custom_loop=loss_fn is not None)
        if loss_fn is not None and not callable(loss_fn):
            raise MemfitError(f"loss_fn must be a function loss_fn(x, y), got {loss_fn!r}")
        if guard_update not in (True, False, "auto"):
            raise MemfitError(f"guard_update must be True, False or 'auto', got {guard_update!r}")
        self.model = model
        self.micro_batches = check_positive_int(micro_batches, "micro_batches")
        self.guard_update = guard_update
        self.on_recovery = on_recovery
        self.verbose = verbose
        self.epoch: int | None = None
        self.summary = FitSummary()
        from memfit.recompute import as_recompute

        self.recompute = as_recompute(model, recompute)
        self._step = AccumulatingStep(
            model, optimizer=optimizer, loss_fn=loss_fn, recompute=self.recompute
        )
        self._agreement = Agreement(model.distribute_strategy)
        self.optimizer = self._step.optimizer
        self._k: dict[str, int] = {}
        self._traced: set[tuple[str, int]] = set()
        self._update_peak: int | None = None
        # The device's peak over the last call (gradients and update), for memfit.Watch.
        self.last_peak_bytes: int | None = None
        self._gradients_peak: int | None = None
        self._device = tfb.default_device()
        self._stats = tfb.memory_info(self._device) is not None
        resolved = as_budget(budget) or emulated_budget()
        self._limit = resolved.usable_bytes if resolved is not None else None

    # -- the step ---------------------------------------------------------------------------
    def __call__(self, data: Any) -> dict[str, Any]:
        """Train one batch `(x, y)` / `(x, y, sample_weight)`; returns the logs."""
        if not self.optimizer.built:
            # Built before the first step, so a guarded update has all its state to save.
            with self.model.distribute_strategy.scope():
                self.optimizer.build(self.model.trainable_variables)
        if self._step.loss_tracker is not None:
            self._step.loss_tracker.reset_state()  # a custom loop gets this batch's loss
        key, shapes, batch = _signature(data)
        k = min(self._k.get(key, self.micro_batches), batch)
        update = self._iterations()
        failed_at: float | None = None
        pending: Recovery | None = None
        apply_failures = 0
        while True:
            if (key, k) not in self._traced:
                # Traced apart from running, so a recovery can say what the retrace cost.
                started = time.perf_counter()
                self._step.trace(data, k)
                self._traced.add((key, k))
                if pending is not None:
                    pending.trace_seconds += time.perf_counter() - started
            saved_metrics = self._step.save_metrics()
            failure: Exception | None = None
            try:
                self._reset_peak()  # each attempt's own peak: a failed one's is not kept
                grads = self._step.gradients(data, k)
                self._gradients_peak = self._peak()
            except Exception as exc:
                if not tfb.is_oom(exc):
                    self._agreement.abandon()
                    raise
                failure = exc
            # Every worker of a multi-worker strategy takes the same decision (one process: its own)
            recovery, guard = self._settle(failure, "gradients", k, batch, shapes, update)
            if recovery is not None:
                grads = None  # went through here but not on another worker: retried with it
                self._step.restore_metrics(saved_metrics)
                failed_at = failed_at or time.perf_counter()
                pending, k = recovery, recovery.new_micro_batches
                continue
            reduced = self._agreement.active
            if reduced:  # the all-reduce alone, so an OOM in the update strikes outside it
                try:
                    grads = self._step.reduce(grads)
                except Exception as exc:
                    failed = self._agreement.collective_failed(exc, "the gradient all-reduce")
                    raise failed from None
            snapshot = self._snapshot() if guard else None
            try:
                self._reset_peak()
                self._step.apply(grads, reduced=reduced)
                self._update_peak = self._peak()
            except Exception as exc:
                if not tfb.is_oom(exc):
                    self._agreement.abandon()
                    raise
                failure = exc
            del grads
            unguarded = None
            if failure is not None and snapshot is None:
                unguarded = MemfitError(
                    f"out of memory inside the optimizer update ({tfb.oom_summary(failure)}), "
                    f"which was not guarded (guard_update=False): weights and optimizer "
                    f"slots may be partly updated. Reload your last checkpoint and run "
                    f"with guard_update='auto'"
                )
            # The update's memory does not depend on K: retry it as it was once (the error may
            # have been passing), then with more micro-batches.
            recovery, _ = self._settle(
                failure, "apply", k, batch, shapes, update, apply_failures > 0, unguarded
            )
            if recovery is None:
                break
            if snapshot is not None:
                self._restore(snapshot)
            self._step.restore_metrics(saved_metrics)
            self._update_peak = None
            failed_at = failed_at or time.perf_counter()
            apply_failures += 1
            pending, k = recovery, recovery.new_micro_batches
        self._k[key] = k
        peaks = [p for p in (self._gradients_peak, self._update_peak) if p is not None]
        self.last_peak_bytes = max(peaks) if peaks else None
        self.summary.micro_batches[key] = k
        self.summary.updates += 1
        self.summary.guarded_updates += snapshot is not None
        if pending is not None and failed_at is not None:
            self._finish_recoveries(update, time.perf_counter() - failed_at)
        return self._step.results()

    # -- recovery ---------------------------------------------------------------------------
    def _recover(
        self,
        exc: Exception,
        phase: str,
        k: int,
        batch: int,
        shapes: list[list[int]],
        update: int,
        escalate: bool = True,
    ) -> Recovery:
        peak = self._peak()
        gc.collect()
        if escalate and k >= batch:
            raise MemfitError(
                f"even one sample per micro-batch does not fit: the {phase} of a step on "
                f"{'x'.join(map(str, shapes[0]))} inputs ran out of memory with micro-batches "
                f"of 1 ({tfb.oom_summary(exc)}"
                + (f"; peak {format_size(peak)}" if peak else "")
                + "). Use mixed precision or recompute (`memfit plan` with a model factory "
                "shows what each saves), smaller inputs, or a card with more memory"
            ) from None
        new_k = min(batch, k * 2) if escalate else k
        recovery = Recovery(
            update=update,
            epoch=self.epoch,
            input_shapes=shapes,
            phase=phase,
            old_micro_batches=k,
            new_micro_batches=new_k,
            peak_bytes=peak,
            message=tfb.oom_summary(exc),
        )
        self.summary.recoveries.append(recovery)
        return recovery

    def _settle(
        self,
        failure: Exception | None,
        phase: str,
        k: int,
        batch: int,
        shapes: list[list[int]],
        update: int,
        escalate: bool = True,
        fatal: MemfitError | None = None,
    ) -> tuple[Recovery | None, bool]:
        """The attempt's outcome, agreed by every worker: the Recovery to retry with (or None
        to go on), and whether to guard the update. Raises where this or another worker stops.
        """
        recovery = None
        if failure is not None and fatal is None:
            try:
                recovery = self._recover(failure, phase, k, batch, shapes, update, escalate)
            except MemfitError as error:
                fatal = error
        outcome = CANNOT_GO_ON if fatal else OUT_OF_MEMORY if recovery else WENT_THROUGH
        wanted = recovery.new_micro_batches if recovery is not None else k
        verdict = self._agreement.agree(outcome, wanted, phase == "gradients" and self._guarding())
        if fatal is not None:
            raise fatal
        if verdict.outcome == CANNOT_GO_ON:
            raise self._agreement.stopped_elsewhere(phase)
        if not verdict.retry:
            return None, verdict.guard
        if recovery is None:  # another worker ran out of memory: this one retries with it
            recovery = Recovery(update, self.epoch, shapes, phase, k, k, None, elsewhere=True)
            self.summary.recoveries.append(recovery)
        recovery.new_micro_batches = min(batch, verdict.micro_batches)
        return recovery, verdict.guard

    def _finish_recoveries(self, update: int, seconds: float) -> None:
        for recovery in self.summary.recoveries:
            if recovery.update == update and recovery.seconds == 0.0:
                recovery.seconds = seconds
                text = f"memfit: {recovery}"
                logger.info(text)
                if self.verbose:
                    print(text, flush=True)
                if self.on_recovery is not None:
                    self.on_recovery(recovery)

    # -- the update's guard -----------------------------------------------------------------
    def _guarding(self) -> bool:
        if self.guard_update != "auto":
            return bool(self.guard_update)
        if not self._stats:
            return False  # no allocator statistics: no budget an OOM could be caught against
        if self._update_peak is None or not self._limit:
            return True
        return self._update_peak > (1 - APPLY_GUARD_HEADROOM) * self._limit

    def _state_variables(self) -> list[Any]:
        seen: set[int] = set()
        out = []
        for v in [*self.model.trainable_variables, *self.optimizer.variables]:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out

    def _snapshot(self) -> list[np.ndarray]:
        # Host copies: they take no device memory, and restoring them is bit for bit.
        return [np.array(v.numpy(), copy=True) for v in self._state_variables()]

    def _restore(self, snapshot: list[np.ndarray]) -> None:
        for v, value in zip(self._state_variables(), snapshot, strict=True):
            tfb.assign_exact(v, value)

    def resume_micro_batches(self, micro_batches: dict[str, int]) -> None:
        """Start input shapes at the K an earlier run settled on (its `summary.micro_batches`).

        Args:
            micro_batches: K per input-shape key, as in `FitSummary.micro_batches`.
        """
        for key, k in micro_batches.items():
            self._k[str(key)] = check_positive_int(k, "micro_batches")

    @property
    def trace_count(self) -> int:
        """How many step functions were traced (one per input shape and K)."""
        return len(self._traced)

    def _reset_peak(self) -> None:
        if self._stats:
            tfb.reset_peak(self._device)

    def _peak(self) -> int | None:
        info = tfb.memory_info(self._device) if self._stats else None
        return None if info is None else info.get("peak")

    def _iterations(self) -> int:
        return int(self.optimizer.iterations.numpy())


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
    micro_batches: int | Any = None,
    guard_update: bool | str = "auto",
    on_recovery: Callable[[Recovery], None] | None = None,
    budget: Any = None,
    recompute: Any = None,
    backup_dir: str | os.PathLike[str] | None = None,
    save_freq: str | int = "epoch",
    keep_backup: bool = False,
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
        model: a compiled Keras model with Keras' standard `train_step`.
        x, y, ..., validation_freq: as `model.fit`. A `tf.data.Dataset` yields batches (as in
            Keras), and they are the effective batches; a `batch_size` larger than them
            re-batches the dataset to it, a smaller one is an error.
        micro_batches: K to start with (an int, or a `memfit.Plan`); default 1 — memfit
            splits only when a step runs out of memory. A plan holds only for a model built
            with its precision and recompute (`Plan.build_scope()`); any other model is
            refused with a `MemfitError` that says how to build it (see `check_plan`).
        guard_update: see `GuardedStep` (default `"auto"`).
        on_recovery: called with each `Recovery` as it happens.
        budget: the budget to train in (default: the emulated one, else the device's); it
            judges the update's headroom. To cap memory, emulate it first (`memfit.emulate`).
        recompute: train with memfit's recompute (see `memfit.recompute`): `"sqrt"`, a
            count, a size, layer names, True (`"sqrt"`) or a `memfit.Recompute`.
        backup_dir: make the run preemption-safe (see `memfit.backup`): keep a checkpoint
            here (weights, optimizer state, K per input shape, the data position, a
            `memfit.Watch`'s log), written atomically at each epoch's end (`save_freq`) and
            on SIGTERM, after which the process exits with status 143. The next `fit` with
            the same `backup_dir` resumes at the same update; a completed run removes it.
            Exact resume needs epochs in the same order in every run (`shuffle=False` for
            arrays, an unshuffled or fixed-seed dataset) and no `steps_per_epoch`.
        save_freq: with `backup_dir`: `"epoch"` (default) or N, a checkpoint every N updates.
        keep_backup: with `backup_dir`: keep the checkpoint after the run completes.

    Returns:
        The `keras.callbacks.History`, with `history.memfit` added.

    Example:
        ```python
        memfit.emulate("T4")                 # or on the real card: nothing to set
        history = memfit.fit(model, train_ds, epochs=10, validation_data=val_ds)
        for recovery in history.memfit.recoveries:
            print(recovery)

        # Preemption-safe: SIGTERM writes a checkpoint and exits 143; run it again to resume.
        memfit.fit(model, x, y, batch_size=64, epochs=10, shuffle=False,
                   backup_dir="/mnt/disk/backup")
        ```
    """
    _check_model(model)
    tf = tfb.import_tf()
    if batch_size is not None:
        batch_size = check_batch_size(batch_size)
    if getattr(model, "steps_per_execution", 1) != 1:
        raise MemfitError(
            "memfit.fit needs steps_per_execution=1 (it guards each step on its own); "
            "compile the model without steps_per_execution"
        )
    if isinstance(x, tf.data.Dataset):
        x = _rebatched(x, batch_size)
        batch_size = None
    if hasattr(micro_batches, "precision") and hasattr(micro_batches, "remat"):
        check_plan(model, micro_batches)
        from memfit.recompute import remat_recompute

        # A plan for memfit's recompute wraps the model's forward: no rebuild needed.
        recompute = recompute or remat_recompute(micro_batches.remat)
    k = getattr(micro_batches, "micro_batches", micro_batches) or 1
    step = GuardedStep(
        model,
        micro_batches=k,
        guard_update=guard_update,
        on_recovery=on_recovery,
        verbose=verbose != 0,
        budget=budget,
        recompute=recompute,
    )
    tracker = _epoch_tracker(step)
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
        return step(next(iterator))

    train_function.guarded_step = step  # type: ignore[attr-defined]  # read by memfit.Watch
    model.train_function = train_function
    keras_build = fix_keras_multi_worker_build(model)
    try:
        with backup.handling_signals() if backup is not None else contextlib.nullcontext():
            history = model.fit(
                x,
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


def model_precision(model: Any) -> str:
    """The dtype policy a built Keras model computes in, e.g. `"float32"`, `"mixed_float16"`.

    The policy most of the model's layers with weights were built under (a mixed-precision
    model often keeps its last layer in float32); the model's own policy if no layer has
    weights.

    Args:
        model: a built `keras.Model`.

    Returns:
        The policy's name.

    Example:
        >>> from memfit.fit import model_precision
        >>> keras.mixed_precision.set_dtype_policy("mixed_float16")
        >>> model_precision(keras.applications.MobileNetV2(weights=None))
        'mixed_float16'
    """
    counts: dict[str, int] = {}
    for layer in model._flatten_layers(include_self=False):
        leaf = not any(True for _ in layer._flatten_layers(include_self=False))
        if leaf and layer.weights:
            name = layer.dtype_policy.name
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        return str(model.dtype_policy.name)
    return max(counts, key=lambda name: counts[name])


def model_remat(model: Any) -> set[str]:
    """The `keras.RematScope` modes a built Keras model's layers were built under.

    Args:
        model: a built `keras.Model`.

    Returns:
        The modes (`"larger_than"`, `"activations"`, ...); empty when built without recompute.

    Example:
        >>> from memfit.fit import model_remat
        >>> with keras.RematScope(mode="larger_than"):
        ...     model = keras.applications.MobileNetV2(weights=None)
        >>> model_remat(model)
        {'larger_than'}
    """
    return {
        layer._remat_mode.mode
        for layer in model._flatten_layers(include_self=True)
        if getattr(layer, "_remat_mode", None) is not None
    }


def check_plan(model: Any, plan: Any) -> None:
    """Refuse a plan made for another build of the model: its precision or recompute differs.

    A plan's peak was measured on the model built under its dtype policy and recompute
    (`keras.RematScope`) mode, and a built model cannot change either, so K alone would not
    make its step fit.

    Args:
        model: the built `keras.Model` to train.
        plan: a `memfit.Plan` (its `precision` and `remat`).

    Raises:
        MemfitError: what the plan assumed, what the model was built with, and what to do.

    Example:
        ```python
        plan = memfit.plan("mypkg.models:build", 256, "T4")
        with plan.build_scope():                   # the plan's precision and recompute
            model = mypkg.models.build()
        memfit.fit(model, x, y, batch_size=256, micro_batches=plan)
        ```
    """
    precision = model_precision(model)
    planned = plan.precision or "float32"
    if precision != planned:
        raise MemfitError(
            f"the plan is for precision {planned}, but the model was built with "
            f"{precision}, and a built model cannot change precision: build it after "
            f'keras.mixed_precision.set_dtype_policy("{planned}") (or inside '
            f'`with plan.build_scope():`), or plan with precisions=["{precision}"] '
            f"(--precision {precision})"
        )
    modes = model_remat(model)
    if plan.remat == "memfit":  # memfit's recompute: memfit.fit applies it to any build
        if modes:
            raise MemfitError(
                f"the plan is for memfit's recompute, but the model was built with remat "
                f"{', '.join(sorted(modes))}: build it outside keras.RematScope"
            )
    elif plan.remat is not None and plan.remat not in modes:
        raise MemfitError(
            f"the plan is for recompute (remat) {plan.remat!r}, but the model was built "
            + (f"with remat {', '.join(sorted(modes))}" if modes else "without it")
            + f': build it inside `with keras.RematScope(mode="{plan.remat}"):` (or '
            f"`with plan.build_scope():`), or plan with remat_modes=[None] (--remat none)"
        )
    if plan.remat is None and modes:
        raise MemfitError(
            f"the plan is for no recompute (remat), but the model was built with remat "
            f"{', '.join(sorted(modes))}, whose memory the plan did not measure: build it "
            f"outside keras.RematScope, or plan with remat_modes=[{sorted(modes)[0]!r}]"
        )


def _epoch_tracker(step: GuardedStep) -> Any:
    """A Keras callback that tells `step` which epoch runs (for its recovery records)."""
    keras = tfb.import_keras()

    class EpochTracker(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            step.epoch = epoch

    return EpochTracker()


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


def _check_model(model: Any, custom_loop: bool = False) -> None:
    keras = tfb.import_keras()
    if not isinstance(model, keras.Model):
        raise MemfitError(
            f"expected a keras.Model, got {type(model).__name__}: pass the model object"
        )
    if custom_loop:
        return
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise MemfitError(
            f"model {model.name!r} was never compiled: call model.compile(optimizer=..., "
            f"loss=...) first"
        )
    base = keras.Model.train_step
    own = type(model).train_step
    if own is not base and getattr(own, "__qualname__", "").split(".")[0] not in (
        "TensorFlowTrainer",
        "Trainer",
    ):
        raise MemfitError(
            f"{type(model).__name__} overrides train_step, which memfit cannot split into "
            f"micro-batches; use memfit.GuardedStep with a compiled model that keeps Keras' "
            f"train_step, or train it with model.fit"
        )


def _signature(data: Any) -> tuple[str, list[list[int]], int]:
    """A key for the batch's input shapes, the shapes, and the (per-replica) batch size."""
    tf = tfb.import_tf()
    leaves = []
    for leaf in tf.nest.flatten(data, expand_composites=False):
        values = getattr(leaf, "values", None)
        if isinstance(values, tuple):  # PerReplica: one value per replica
            leaf = values[0]
        if hasattr(leaf, "shape"):
            leaves.append(leaf)
    if not leaves:
        raise MemfitError("a training batch without tensors: check what your dataset yields")
    shapes = [list(leaf.shape) for leaf in leaves]
    batch = shapes[0][0] if shapes[0] else 1
    if batch is None:
        batch = int(tf.shape(leaves[0])[0])
    return "|".join("x".join(map(str, s)) for s in shapes), shapes, max(1, int(batch))
