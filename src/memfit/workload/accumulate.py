"""Accumulate: one training step split into K micro-batches, gradients summed, applied once.

The step is two compiled functions, so that an out-of-memory error can be recovered from:

- `gradients(data, k)`: forward and backward over `k` micro-batches of the batch, one after
  the other (a `tf.while_loop` with `parallel_iterations=1`, so only one micro-batch's
  activations are alive at a time), each micro-batch's loss weighted by its share of the
  batch so the sum is the gradient of the whole batch's loss. Updates the loss tracker and
  compiled metrics per micro-batch (their running means come out as for the whole batch).
  Changes no weight and no optimizer variable.
- `apply(grads)`: `optimizer.apply_gradients` once — the iteration count and learning-rate
  schedules advance once per effective batch, and a `LossScaleOptimizer` sees the sum of the
  micro-batches' scaled gradients, so one non-finite micro-batch makes the whole update skip
  (it cannot silently drop out of it).

Each input shape and each K is traced concretely (no shape relaxation): detectors such as
keras-hub's RetinaNet build anchors from the static image size. Where the micro-batches are
all of one size (K divides the batch into equal parts), each is traced with that static batch
size, so models that need one (the Model Garden's Mask R-CNN samplers) can be split.

The gradients of a micro-batch come from one of three places: Keras' own `train_step`
(a compiled Keras 3 or tf_keras model), a `loss_fn(x, y)` (a custom loop), or the user's own
whole training step, `step_fn(data, optimizer)` (a Model Garden task's `train_step`), run
per micro-batch with its `optimizer.apply_gradients` call captured instead of applied.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend import tf_keras_compat as compat
from memfit.errors import MemfitError


class AccumulatingStep:
    """The compiled pieces of a micro-batched training step for one compiled Keras model.

    Args:
        model: a Keras model; compiled and using Keras' standard `train_step`, unless
            `loss_fn` and `optimizer` are given.
        optimizer: the optimizer to apply with (default: the model's).
        loss_fn: `loss_fn(x, y) -> scalar`, the mean loss of a (micro-)batch, for custom
            training loops; it calls the model itself. Default: the model's compiled loss
            and metrics.
        recompute: a `memfit.Recompute` of `model`: its training forward is traced
            segmented (gradient checkpointing); None: the model's own.
        step_fn: `step_fn(data, optimizer) -> logs`, a whole training step of your own (it
            computes the gradients of `data` and calls `optimizer.apply_gradients` once), run
            per micro-batch with that call captured; `logs` is the loss or a dict with a
            `"loss"`. Given with `optimizer`, instead of `loss_fn`.
        metrics: metric objects your `step_fn` updates, put back with the loss tracker
            after an out-of-memory error.

    Example:
        ```python
        step = AccumulatingStep(model)
        grads = step.gradients(batch, k=4)   # metrics updated, weights untouched
        step.apply(grads)                    # one optimizer update
        ```
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        loss_fn: Any = None,
        recompute: Any = None,
        step_fn: Any = None,
        metrics: Any = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self.loss_fn = loss_fn
        self.step_fn = step_fn
        self.metrics = list(metrics or [])
        self.recompute = recompute
        self.tf_keras = compat.is_tf_keras(model)
        self.loss_tracker: Any = None
        if loss_fn is not None or step_fn is not None:
            keras = tfb.import_keras()
            with model.distribute_strategy.scope():
                self.loss_tracker = keras.metrics.Mean(name="loss")
        # One function per input shapes and K: each holds its instantiated graph's buffers.
        self._gradient_fns: dict[tuple[Any, int], Callable[..., Any]] = {}
        self._apply_fn: Callable[..., Any] | None = None
        self._apply_reduced_fn: Callable[..., Any] | None = None
        self._reduce_fn: Callable[..., Any] | None = None
        # Positions in trainable_variables that get a gradient (known once traced).
        self.connected: list[int] | None = None

    # -- gradients --------------------------------------------------------------------------
    def gradients(self, data: Any, k: int) -> list[Any]:
        """Gradients of the batch's loss from `k` micro-batches (per replica under a strategy).

        Returns the gradients of the variables at `self.connected` (those that get one);
        under a strategy, per-replica values for `apply`.
        """
        fn = self._gradient_fn(data, k)
        with self._recomputing():
            return fn(data)

    def trace(self, data: Any, k: int) -> None:
        """Trace the gradients function for this batch's shapes and `k` without running it."""
        fn = self._gradient_fn(data, k)
        with self._recomputing():
            try:
                fn.get_concrete_function(data)
            except Exception as exc:
                unsplittable = _needs_static_batch(exc, data, k)
                if unsplittable is None:
                    raise
                raise unsplittable from exc

    def release(self, data: Any, k: int) -> None:
        """Drop the gradients function for this batch's shapes and `k` (after it ran out of
        memory: that K is not tried again for these shapes).

        An instantiated step keeps buffers for as long as it lives (on the Model Garden's
        RetinaNet, 128 px, 20-50 MiB each, with or without grappler); a function that failed
        would hold them for nothing.

        Example:
            ```python
            step.release(batch, k=1)   # K=1 ran out of memory on this batch's shapes
            ```
        """
        self._gradient_fns.pop((_shapes(data), k), None)

    def _gradient_fn(self, data: Any, k: int) -> Callable[..., Any]:
        key = (_shapes(data), k)
        fn = self._gradient_fns.get(key)
        if fn is None:
            fn = self._gradient_fns[key] = self._make_gradient_fn(k)
        return fn

    def _recomputing(self) -> Any:
        """The model's forward segmented while a step is traced (see `memfit.recompute`)."""
        return self.recompute if self.recompute is not None else contextlib.nullcontext()

    def _make_gradient_fn(self, k: int) -> Callable[..., Any]:
        tf = tfb.import_tf()
        model = self.model
        variables = list(model.trainable_variables)
        unconnected: set[int] = set()

        def replica_step(data: Any) -> list[Any]:
            x, y, sample_weight = _unpack(data)
            total = tf.shape(tf.nest.flatten(x)[0])[0]
            micro = (total + k - 1) // k
            count = (total + micro - 1) // micro
            accumulators = [tf.zeros_like(v) for v in variables]

            static = tf.nest.flatten(x)[0].shape[0]
            # Micro-batches all of one size (K divides the batch): traced with that size.
            size = -(-static // k) if static is not None else None
            even = (static, size) if size is not None and static % size == 0 else None

            def body(i: Any, acc: list[Any]) -> tuple[Any, list[Any]]:
                start = i * micro
                end = tf.minimum(start + micro, total)
                share = tf.cast(end - start, tf.float32) / tf.cast(total, tf.float32)
                if self.step_fn is not None:
                    grads = self._step_gradients(variables, _slice(data, start, end, even), share)
                else:
                    part = _slice((x, y, sample_weight), start, end, even)
                    grads = self._micro_gradients(variables, *part, share)
                out = []
                for index, (a, g) in enumerate(zip(acc, grads, strict=True)):
                    if g is None:
                        unconnected.add(index)
                        out.append(a)
                    else:
                        if isinstance(g, tf.IndexedSlices):
                            g = tf.convert_to_tensor(g)
                        out.append(a + tf.cast(g, a.dtype))
                return i + 1, out

            _, summed = tf.while_loop(
                lambda i, _acc: i < count,
                body,
                (tf.constant(0), accumulators),
                parallel_iterations=1,
            )
            self.connected = [i for i in range(len(variables)) if i not in unconnected]
            if not self.connected:
                raise MemfitError(
                    f"no trainable variable of model {model.name!r} gets a gradient from the loss"
                )
            return [summed[i] for i in self.connected]

        def step(data: Any) -> Any:
            return model.distribute_strategy.run(replica_step, args=(data,))

        return tf.function(step, autograph=False)

    # -- reduce and apply -------------------------------------------------------------------
    def reduce(self, grads: list[Any]) -> list[Any]:
        """Sum the gradients over every replica: the strategy's all-reduce, alone.

        Only needed where the all-reduce must run apart from the update (across workers, see
        `memfit.training.distributed`); then `apply(reduced, reduced=True)` updates with no
        collective.
        """
        if self._reduce_fn is None:
            self._reduce_fn = self._make_reduce_fn()
        return self._reduce_fn(grads)

    def apply(self, grads: list[Any], reduced: bool = False) -> None:
        """One optimizer update with the accumulated gradients.

        Args:
            grads: what `gradients` returned, or what `reduce` made of it.
            reduced: the gradients are already summed over the replicas (`reduce`): the
                optimizer's own all-reduce is skipped, so the update has no collective.
        """
        if reduced:
            if self._apply_reduced_fn is None:
                self._apply_reduced_fn = self._make_apply_fn()
            with self._summed_already():
                self._apply_reduced_fn(grads)
            return
        if self._apply_fn is None:
            self._apply_fn = self._make_apply_fn()
        self._apply_fn(grads)

    def _make_apply_fn(self) -> Callable[..., Any]:
        tf = tfb.import_tf()
        model = self.model
        variables = list(model.trainable_variables)

        def replica_apply(grads: list[Any]) -> None:
            assert self.connected is not None
            self.optimizer.apply_gradients(
                zip(grads, [variables[i] for i in self.connected], strict=True)
            )

        def apply(grads: list[Any]) -> None:
            model.distribute_strategy.run(replica_apply, args=(grads,))

        return tf.function(apply, autograph=False)

    def _make_reduce_fn(self) -> Callable[..., Any]:
        tf = tfb.import_tf()
        strategy = self.model.distribute_strategy

        def replica_reduce(grads: list[Any]) -> list[Any]:
            context = tf.distribute.get_replica_context()
            # On the replica's device (an argument has none, and the all-reduce needs one).
            grads = [tf.identity(g) for g in grads]
            return context.all_reduce(tf.distribute.ReduceOp.SUM, grads)

        def reduce(grads: list[Any]) -> Any:
            return strategy.run(replica_reduce, args=(grads,))

        return tf.function(reduce, autograph=False)

    @contextlib.contextmanager
    def _summed_already(self) -> Any:
        """Keras' optimizer without its all-reduce (the gradients come summed) while it runs.

        Keras 3 sums the gradients over the replicas in `_all_reduce_sum_gradients`, inside
        `apply_gradients`; a `LossScaleOptimizer` does it in its inner optimizer.
        """
        optimizers = [self.optimizer, getattr(self.optimizer, "inner_optimizer", None)]
        optimizers = [o for o in optimizers if o is not None]
        for optimizer in optimizers:
            if not hasattr(optimizer, "_all_reduce_sum_gradients"):
                raise MemfitError(
                    f"{type(optimizer).__name__} has no _all_reduce_sum_gradients (Keras 3's "
                    f"hook): memfit cannot update apart from the gradient all-reduce with "
                    f"this Keras version; train with one worker"
                )
            optimizer._all_reduce_sum_gradients = _as_summed
        try:
            yield
        finally:
            for optimizer in optimizers:
                del optimizer._all_reduce_sum_gradients

    # -- metric state -----------------------------------------------------------------------
    def save_metrics(self) -> Any:
        """Copies of the metric variables (per replica), for `restore_metrics` after an OOM."""
        if not hasattr(self, "_save_fn"):
            tf = tfb.import_tf()
            model = self.model
            self._metric_vars = self.metric_variables()

            def read() -> list[Any]:
                return [tf.identity(v) for v in self._metric_vars]

            def write(values: list[Any]) -> None:
                for v, value in zip(self._metric_vars, values, strict=True):
                    v.assign(value)

            self._save_fn = tf.function(lambda: model.distribute_strategy.run(read))
            self._restore_fn = tf.function(
                lambda values: model.distribute_strategy.run(write, args=(values,))
            )
        return self._save_fn() if self._metric_vars else []

    def restore_metrics(self, saved: Any) -> None:
        """Put the metric variables back as `save_metrics` found them."""
        if self._metric_vars:
            self._restore_fn(saved)

    def save_forward_state(self) -> list[Any]:
        """Copies of what a training forward pass writes besides metrics: BatchNorm's moving
        statistics and Keras' dropout seeds, for `restore_forward_state` after an OOM.

        A try that runs out of memory has often run the forward pass already (the OOM strikes
        in the backward pass); without this the retry would move the statistics again.
        Saved and restored outside the replicas: a mirrored variable's copies agree.
        """
        if not hasattr(self, "_forward_vars"):
            tf = tfb.import_tf()
            self._forward_vars = forward_state_variables(self.model)
            variables = self._forward_vars

            def write(values: list[Any]) -> None:
                for v, value in zip(variables, values, strict=True):
                    v.assign(value)

            self._save_forward_fn = tf.function(lambda: [tf.identity(v) for v in variables])
            self._restore_forward_fn = tf.function(write)
        return self._save_forward_fn() if self._forward_vars else []

    def restore_forward_state(self, saved: list[Any]) -> None:
        """Put BatchNorm's moving statistics and the dropout seeds back as saved."""
        if self._forward_vars:
            self._restore_forward_fn(saved)

    def _micro_gradients(
        self, variables: list[Any], x: Any, y: Any, sample_weight: Any, share: Any
    ) -> list[Any]:
        """Keras' `train_step` for one micro-batch, its loss weighted by `share`, no update."""
        tf = tfb.import_tf()
        model = self.model
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        count = tf.shape(tf.nest.flatten(x)[0])[0]
        with tf.GradientTape() as tape:
            if self.loss_fn is not None:
                loss = self.loss_fn(x, y)
                y_pred = None
                self.loss_tracker.update_state(loss, sample_weight=count)
                loss = loss / replicas if replicas > 1 else loss
            elif self.tf_keras:
                # tf_keras' compiled loss tracks itself and comes scaled for the replicas.
                y_pred = model(x, training=True)
                loss = model.compute_loss(x, y, y_pred, sample_weight)
            else:
                y_pred = model(x, training=True) if model._call_has_training_arg else model(x)
                loss = model._compute_loss(
                    x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
                )
                # The replica's unscaled loss, weighted by its samples (as Keras does).
                unscaled = loss * tf.cast(replicas, loss.dtype) if replicas > 1 else loss
                model._loss_tracker.update_state(unscaled, sample_weight=count)
            scaled = compat.scale_loss(self.optimizer, loss) * tf.cast(share, loss.dtype)
        grads = compat.unscale_gradients(self.optimizer, tape.gradient(scaled, variables))
        if self.loss_fn is None:
            model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        return grads

    def _step_gradients(self, variables: list[Any], data: Any, share: Any) -> list[Any]:
        """The user's `step_fn` for one micro-batch, its update captured: the gradients it
        would have applied (per variable of `variables`, None where it gave none), weighted
        by `share`."""
        tf = tfb.import_tf()
        captured: list[Any] = []

        def capture(grads_and_vars: Any, *args: Any, **kwargs: Any) -> None:
            captured.append(list(grads_and_vars))

        optimizer = self.optimizer
        optimizer.apply_gradients = capture  # the instance's, for this trace only
        try:
            logs = self.step_fn(data, optimizer)
        finally:
            del optimizer.apply_gradients
        if len(captured) != 1:
            raise MemfitError(
                f"step_fn called optimizer.apply_gradients {len(captured)} times for one "
                f"batch; memfit needs exactly one call (the update of the whole batch)"
            )
        loss = logs.get("loss") if isinstance(logs, dict) else logs
        if loss is None or not hasattr(loss, "dtype") or loss.shape.rank not in (0, None):
            keys = f" (its keys: {', '.join(map(str, logs))})" if isinstance(logs, dict) else ""
            raise MemfitError(
                f"step_fn returned no loss{keys}: return the batch's mean loss, or logs "
                f"with a 'loss' entry"
            )
        self.loss_tracker.update_state(loss, sample_weight=tf.shape(tf.nest.flatten(data)[0])[0])
        by_variable = {id(v): g for g, v in captured[0]}
        grads = []
        for v in variables:
            g = by_variable.get(id(v))
            if g is not None:
                if isinstance(g, tf.IndexedSlices):
                    g = tf.convert_to_tensor(g)
                g = g * tf.cast(share, g.dtype)
            grads.append(g)
        return grads

    def metric_variables(self) -> list[Any]:
        """The variables the gradients phase updates (metrics, loss trackers)."""
        extra = [v for metric in self.metrics for v in metric.variables]
        if self.loss_tracker is not None:
            return [*self.loss_tracker.variables, *extra]
        if self.tf_keras:
            return [v for metric in self.model.metrics for v in metric.variables]
        return list(self.model.metrics_variables)

    def results(self) -> dict[str, Any]:
        """The step's logs: the model's metric results, or `{"loss": ...}` with a `loss_fn`
        or `step_fn`."""
        if self.loss_tracker is not None:
            return {"loss": self.loss_tracker.result()}
        return self.model.get_metrics_result()


def forward_state_variables(model: Any) -> list[Any]:
    """The variables a training forward pass of `model` writes, besides its metrics.

    BatchNorm's `moving_mean` / `moving_variance` (Keras 3 and tf_keras, the Model Garden's
    synchronised BatchNorm included) and the state of Keras 3's seed generators (dropout,
    noise layers). Frozen weights, also non-trainable, are left out: nothing writes them.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization()])
        >>> [v.name for v in forward_state_variables(model)]
        ['moving_mean', 'moving_variance']
    """
    found: dict[int, Any] = {}
    flatten = getattr(model, "_flatten_layers", None)
    layers = list(flatten()) if callable(flatten) else [model]
    for layer in layers:
        for name in ("moving_mean", "moving_variance"):
            variable = getattr(layer, name, None)
            if variable is not None and hasattr(variable, "assign"):
                found.setdefault(id(variable), variable)
        for generator in getattr(layer, "_seed_generators", None) or []:
            state = getattr(generator, "state", None)
            if state is not None and hasattr(state, "assign"):
                found.setdefault(id(state), state)
    return list(found.values())


def _as_summed(grads_and_vars: Any) -> list[Any]:
    """Keras' gradient all-reduce where the gradients come summed already: nothing to do."""
    return list(grads_and_vars)


_LAYER_ERROR = re.compile(
    r"Exception encountered when calling (?:layer '(?P<name>[^']+)' \(type (?P<type>\w+)\)"
    r"|(?P<display>[\w.()]+?))\.?\n+(?:\x1b\[1m)?(?P<message>[^\n\x1b]*)"
)


def _needs_static_batch(exc: Exception, data: Any, k: int) -> MemfitError | None:
    """The error to raise where tracing `k` micro-batches of unequal size failed in a layer.

    Micro-batches of unequal size (K does not divide the batch) are traced without a static
    batch size; a layer that needs one (the Model Garden's Mask R-CNN samplers loop over the
    batch in Python) then fails while tracing. Returns None where the micro-batches are of
    one size, or the error does not come from a Keras layer: that error is the model's own.
    """
    x, _, _ = _unpack(data)
    leaves = [leaf for leaf in _flatten(x) if getattr(leaf, "shape", None) is not None]
    batch = leaves[0].shape[0] if leaves and leaves[0].shape.rank else None
    if k < 2 or batch is None:
        return None
    micro = -(-batch // k)
    if batch % micro == 0:
        return None
    match = _LAYER_ERROR.search(str(exc))
    if match is None:
        return None
    layer = (
        f"layer {match['name']!r} ({match['type']})"
        if match["name"]
        else f"layer {match['display'].removesuffix('.call()')}"
    )
    sizes = [min(micro, batch - start) for start in range(0, batch, micro)]
    divisible = [n for n in range(2, batch + 1) if batch % n == 0]
    fix = f"micro_batches={divisible[0]} (one that divides {batch})" if divisible else ""
    even = k * micro
    reason = f" ({match['message'].strip()})" if match["message"].strip() else ""
    return MemfitError(
        f"cannot split the batch of {batch} into {k} micro-batches: as "
        f"{' + '.join(map(str, sizes))} samples they have no static batch size, and "
        f"{layer} needs one{reason}. Use a batch size that {k} "
        f"divides (e.g. {even}){' or ' + fix if fix else ''}"
    )


def _shapes(data: Any) -> tuple[Any, ...]:
    """The static shapes of a batch's tensors (per replica value under a strategy)."""
    out = []
    for leaf in _flatten(data):
        values = getattr(leaf, "values", None)
        if isinstance(values, tuple):  # PerReplica: one value per replica
            leaf = values[0]
        shape = getattr(leaf, "shape", None)  # a NumPy array's is a plain tuple
        shape = None if shape is None else tfb.import_tf().TensorShape(shape)
        out.append(tuple(shape.as_list()) if shape is not None and shape.rank is not None else None)
    return tuple(out)


def _flatten(structure: Any) -> list[Any]:
    return tfb.import_tf().nest.flatten(structure)


def _unpack(data: Any) -> tuple[Any, Any, Any]:
    if isinstance(data, (list, tuple)):
        items = list(data) + [None] * (3 - len(data))
        if len(data) in (1, 2, 3):
            return items[0], items[1], items[2]
    return data, None, None


def _slice(structure: Any, start: Any, end: Any, even: tuple[int, int] | None = None) -> Any:
    """Samples `start:end` of every tensor. With `even = (batch, micro)` (every micro-batch
    has `micro` samples), a tensor whose first dimension is `batch` gets `micro` as its
    static first dimension, as a batch of that size would have."""
    tf = tfb.import_tf()

    def cut(t: Any) -> Any:
        if t is None:
            return None
        part = t[start:end]
        if even is not None and t.shape.rank and t.shape[0] == even[0]:
            part.set_shape([even[1], *t.shape[1:]])
        return part

    return tf.nest.map_structure(cut, structure)
