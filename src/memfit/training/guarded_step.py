"""The guarded step: one training step that splits into micro-batches and survives OOM.

`GuardedStep` is the step `memfit.fit` installs as the model's train function, and the step a
custom (GradientTape) loop calls once per batch. It computes a batch's gradients in K
micro-batches (`memfit.workload.accumulate`), applies them in one optimizer update, and on
`ResourceExhaustedError` puts back what the failed attempt changed and retries with twice the
micro-batches. Under a multi-worker strategy every worker takes each decision together
(`memfit.training.distributed`).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from memfit.backend import tf as tfb
from memfit.backend import tf_keras_compat as compat
from memfit.budget.budget import as_budget, emulated_budget
from memfit.checks import check_positive_int
from memfit.errors import MemfitError
from memfit.recomputation.remat import as_recompute
from memfit.sizes import format_size
from memfit.training.distributed import CANNOT_GO_ON, OUT_OF_MEMORY, WENT_THROUGH, Agreement
from memfit.training.recovery import FitSummary, Recovery
from memfit.workload.accumulate import AccumulatingStep

logger = logging.getLogger("memfit")


# Guard the optimizer update (snapshot the state it changes) while its own peak leaves less
# than this share of the budget free, or is not known yet.
APPLY_GUARD_HEADROOM = 0.2


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
    the samples it gets, and call it once per batch instead of your tape-and-apply code. A
    training step of your own that computes the gradients and applies them (a TF Model
    Garden task's `train_step`, see `GuardedStep.from_task`) is given whole as `step_fn`.
    Keras 3 and tf_keras (Keras 2) models and optimizers both work, legacy tf_keras
    optimizers and loss-scale optimizers included.

    Args:
        model: a Keras 3 or tf_keras model: compiled, with Keras' standard `train_step`; or
            any model when `optimizer` and `loss_fn` (or `step_fn`) are given.
        optimizer: the optimizer of a custom loop (default: the model's).
        loss_fn: `loss_fn(x, y) -> scalar` of a custom loop: the mean loss over the samples of
            `x` (it is called per micro-batch and weighted by its share of the batch).
        step_fn: `step_fn(data, optimizer) -> logs`, your whole training step for one batch:
            it computes the gradients of `data`'s mean loss and calls
            `optimizer.apply_gradients` once, and returns the loss (or a dict with
            `"loss"`). memfit runs it per micro-batch with that call captured, and applies
            the summed gradients once. Instead of `loss_fn`.
        metrics: metric objects `step_fn` updates: put back as they were after a failed try.
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
        step_fn: Callable[[Any, Any], Any] | None = None,
        metrics: list[Any] | None = None,
        guard_update: bool | str = "auto",
        on_recovery: Callable[[Recovery], None] | None = None,
        verbose: bool = True,
        budget: Any = None,
        recompute: Any = None,
    ) -> None:
        if loss_fn is not None and step_fn is not None:
            raise MemfitError("give GuardedStep loss_fn= or step_fn=, not both")
        custom = loss_fn if loss_fn is not None else step_fn
        if (optimizer is None) != (custom is None):
            raise MemfitError(
                "a custom training loop gives GuardedStep both optimizer= and loss_fn= (or "
                "step_fn=); a compiled model gives neither"
            )
        check_trainable_model(model, custom_loop=custom is not None)
        if loss_fn is not None and not callable(loss_fn):
            raise MemfitError(f"loss_fn must be a function loss_fn(x, y), got {loss_fn!r}")
        if step_fn is not None and not callable(step_fn):
            raise MemfitError(
                f"step_fn must be a function step_fn(data, optimizer), got {step_fn!r}"
            )
        if guard_update not in (True, False, "auto"):
            raise MemfitError(f"guard_update must be True, False or 'auto', got {guard_update!r}")
        self.model = model
        self.micro_batches = check_positive_int(micro_batches, "micro_batches")
        self.guard_update = guard_update
        self.on_recovery = on_recovery
        self.verbose = verbose
        self.epoch: int | None = None
        self.summary = FitSummary()

        self.recompute = as_recompute(model, recompute)
        self._step = AccumulatingStep(
            model,
            optimizer=optimizer,
            loss_fn=loss_fn,
            recompute=self.recompute,
            step_fn=step_fn,
            metrics=metrics,
        )
        self._agreement = Agreement(model.distribute_strategy)
        self.optimizer = self._step.optimizer
        self._built = False
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
        if not self._built:
            # Built before the first step, so a guarded update has all its state to save.
            with self.model.distribute_strategy.scope():
                compat.build_optimizer(self.optimizer, self.model.trainable_variables)
            self._built = True
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
            saved_forward = self._step.save_forward_state()
            grads, failure = self._attempt(self._gradients, data, k)
            # Every worker of a multi-worker strategy takes the same decision (one process: its own)
            recovery, guard = self._settle(failure, "gradients", k, batch, shapes, update)
            if recovery is not None:
                grads = None  # went through here but not on another worker: retried with it
                self._step.restore_metrics(saved_metrics)
                self._step.restore_forward_state(saved_forward)
                if recovery.new_micro_batches != k:  # this K is not tried again on these shapes
                    self._step.release(data, k)
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
            _, failure = self._attempt(self._apply, grads, reduced)
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
            self._step.restore_forward_state(saved_forward)
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

    def _attempt(self, phase: Callable[..., Any], *args: Any) -> tuple[Any, Exception | None]:
        """Run one phase of the step: its result, or the OOM it raised (as the second item).

        Any other error is this worker's end: the others are told before it propagates.
        """
        try:
            return phase(*args), None
        except Exception as exc:
            if not tfb.is_oom(exc):
                self._agreement.abandon()
                raise
            return None, exc

    def _gradients(self, data: Any, k: int) -> Any:
        self._reset_peak()  # each attempt's own peak: a failed one's is not kept
        grads = self._step.gradients(data, k)
        self._gradients_peak = self._peak()
        return grads

    def _apply(self, grads: Any, reduced: bool) -> None:
        self._reset_peak()
        self._step.apply(grads, reduced=reduced)
        self._update_peak = self._peak()

    # -- recovery ---------------------------------------------------------------------------
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
            peak = self._peak()
            gc.collect()
            tfb.clear_step_resources()  # what the failed step left in TensorFlow (see there)
            if escalate and k >= batch:
                fatal = _one_sample_too_big(failure, phase, shapes, peak)
            else:
                recovery = Recovery(
                    update=update,
                    epoch=self.epoch,
                    input_shapes=shapes,
                    phase=phase,
                    old_micro_batches=k,
                    new_micro_batches=min(batch, k * 2) if escalate else k,
                    peak_bytes=peak,
                    message=tfb.oom_summary(failure),
                )
                self.summary.recoveries.append(recovery)
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
        for v in [*self.model.trainable_variables, *compat.optimizer_variables(self.optimizer)]:
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

    @classmethod
    def from_task(
        cls,
        task: Any,
        model: Any,
        optimizer: Any,
        *,
        metrics: list[Any] | None = None,
        **kwargs: Any,
    ) -> GuardedStep:
        """A guarded step that trains with a TF Model Garden task's own `train_step`.

        The task's step (its forward, its losses, its loss scaling) runs per micro-batch as
        `task.train_step(data, model, optimizer, metrics)`; memfit captures the update it
        would make, sums the micro-batches' gradients and applies them once. Each
        micro-batch's loss is normalised by that micro-batch alone (RetinaNet divides by its
        positive anchors): with K > 1 the update is close to the whole batch's, not equal
        (see docs/fit.md).

        Args:
            task: an `official.core.base_task.Task` (e.g. `task_factory.get_task(config.task)`).
            model: the task's model (`task.build_model()`).
            optimizer: the optimizer to train with (`task.create_optimizer(...)`).
            metrics: the metrics the task's step updates (default:
                `task.build_metrics(training=True)`).
            **kwargs: as `GuardedStep` (`micro_batches`, `guard_update`, `budget`, ...).

        Returns:
            The `GuardedStep`: call it with each batch of `task.build_inputs(...)`. (The
            example needs the Model Garden's environment; the docs' checks skip it.)

        Example:
            >>> task = task_factory.get_task(config.task)  # doctest: +SKIP
            >>> model = task.build_model()  # doctest: +SKIP
            >>> optimizer = task.create_optimizer(config.trainer.optimizer_config)  # doctest: +SKIP
            >>> step = memfit.GuardedStep.from_task(task, model, optimizer)  # doctest: +SKIP
            >>> logs = step(next(iter(task.build_inputs(config.task.train_data))))  # doctest: +SKIP
        """
        train_step = getattr(task, "train_step", None)
        if not callable(train_step) or not callable(getattr(task, "build_model", None)):
            raise MemfitError(
                f"expected a TF Model Garden task (official.core.base_task.Task, with "
                f"build_model and train_step), got {type(task).__name__}"
            )
        if metrics is None:
            metrics = list(task.build_metrics(training=True) or [])

        def step_fn(data: Any, step_optimizer: Any) -> Any:
            return train_step(data, model, step_optimizer, metrics)

        return cls(model, optimizer=optimizer, step_fn=step_fn, metrics=metrics, **kwargs)

    def resume_micro_batches(self, micro_batches: dict[str, int]) -> None:
        """Start input shapes at the K an earlier run settled on (its `summary.micro_batches`).

        Args:
            micro_batches: K per input-shape key, as in `FitSummary.micro_batches`.

        Example:
            ```python
            step = memfit.GuardedStep(model)
            step.resume_micro_batches({"32x32x32x3|32": 2})  # an earlier run's summary
            ```
        """
        for key, k in micro_batches.items():
            self._k[str(key)] = check_positive_int(k, "micro_batches")

    @property
    def trace_count(self) -> int:
        """How many step functions were traced (one per input shape and K).

        Example:
            ```python
            step = memfit.GuardedStep(model)
            for batch in dataset.take(2):
                step(batch)
            print(step.trace_count)  # 1: one input shape, one K
            ```
        """
        return len(self._traced)

    def _reset_peak(self) -> None:
        if self._stats:
            tfb.reset_peak(self._device)

    def _peak(self) -> int | None:
        info = tfb.memory_info(self._device) if self._stats else None
        return None if info is None else info.get("peak")

    def _iterations(self) -> int:
        return int(self.optimizer.iterations.numpy())


def check_trainable_model(model: Any, custom_loop: bool = False) -> None:
    """Refuse a model `GuardedStep` cannot train: not a Keras model, uncompiled, own train_step.

    Keras 3 models and tf_keras (Keras 2) models are both accepted.

    Args:
        model: what the user passed as the model.
        custom_loop: the model is trained by a custom loop (its optimizer and loss or step
            are given apart): only checks that it is a Keras 3 or tf_keras model.

    Raises:
        MemfitError: what is wrong with the model and what to do.

    Example:
        ```python
        check_trainable_model(model)            # before memfit.fit installs its step
        ```
    """
    keras = tfb.import_keras()
    if not compat.is_model(model):
        raise MemfitError(
            f"expected a Keras model (keras.Model or tf_keras.Model), got "
            f"{type(model).__name__}: pass the model object"
        )
    if custom_loop:
        return
    compiled = getattr(model, "compiled", None)
    if compiled is None:  # tf_keras: compiled once it has a compiled loss
        compiled = getattr(model, "compiled_loss", None) is not None
    if getattr(model, "optimizer", None) is None or not compiled:
        raise MemfitError(
            f"model {model.name!r} was never compiled: call model.compile(optimizer=..., "
            f"loss=...) first"
        )
    base = keras.Model.train_step
    if compat.is_tf_keras(model):
        import tf_keras  # present: the model is one of its own

        base = tf_keras.Model.train_step
    own = type(model).train_step
    if own is not base and getattr(own, "__qualname__", "").split(".")[0] not in (
        "TensorFlowTrainer",
        "Trainer",
    ):
        raise MemfitError(
            f"{type(model).__name__} overrides train_step, which memfit cannot split into "
            f"micro-batches; give that step to memfit.GuardedStep(model, optimizer=..., "
            f"step_fn=...) (a TF Model Garden task: GuardedStep.from_task), or train it with "
            f"model.fit"
        )


def _one_sample_too_big(
    exc: Exception, phase: str, shapes: list[list[int]], peak: int | None
) -> MemfitError:
    """The error when a phase runs out of memory with one sample per micro-batch."""
    return MemfitError(
        f"even one sample per micro-batch does not fit: the {phase} of a step on "
        f"{'x'.join(map(str, shapes[0]))} inputs ran out of memory with micro-batches "
        f"of 1 ({tfb.oom_summary(exc)}"
        + (f"; peak {format_size(peak)}" if peak else "")
        + "). Use mixed precision or recompute (`memfit plan` with a model factory "
        "shows what each saves), smaller inputs, or a card with more memory"
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
