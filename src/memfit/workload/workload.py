"""Workload: what is trained — a compiled Keras model and where its samples come from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from memfit.backend import tf as tfb
from memfit.backend.tf_keras_compat import is_tf_keras
from memfit.errors import MemfitWarning, WorkloadError
from memfit.workload.models import not_keras3_message

InputShape = Sequence[int] | Sequence[Sequence[int]]

# A dataset that repeats for ever (`repeat()` with no count), or whose length TensorFlow cannot
# tell (`filter`, `from_generator`), is read up to this many samples: its largest samples are
# the largest among its first `SAMPLES_READ`, and it is never counted element by element.
SAMPLES_READ = 1000


def readable_samples(dataset: Any, limit: int = SAMPLES_READ) -> Any:
    """The part of `dataset` memfit reads: all of it when its length is known and finite, else
    its first `limit` samples (a bounded read: an infinite dataset never hangs memfit).

    Reads nothing: only the dataset's cardinality is looked at.

    Args:
        dataset: a `tf.data.Dataset`.
        limit: how many samples to read from a dataset of infinite or unknown length.

    Returns:
        `dataset` itself, or `dataset.take(limit)`.

    Example:
        >>> samples = readable_samples(tf.data.Dataset.range(3).repeat())
        >>> int(samples.cardinality())
        1000
    """
    tf = tfb.import_tf()
    if int(tf.data.experimental.cardinality(dataset)) >= 0:
        return dataset
    return dataset.take(limit)


def count_samples(dataset: Any, limit: int = SAMPLES_READ) -> int | None:
    """How many samples `dataset` yields, or None when it repeats for ever or has more than
    `limit` (a length TensorFlow cannot tell is counted by reading at most `limit + 1`).

    Args:
        dataset: a `tf.data.Dataset`.
        limit: the most samples read to count a dataset of unknown length.

    Returns:
        The number of samples, or None (infinite, or longer than `limit`).

    Example:
        >>> count_samples(tf.data.Dataset.range(5).filter(lambda i: i % 2 == 0))
        3
        >>> count_samples(tf.data.Dataset.range(5).repeat()) is None
        True
    """
    tf = tfb.import_tf()
    cardinality = int(tf.data.experimental.cardinality(dataset))
    if cardinality >= 0:
        return cardinality
    if cardinality == tf.data.INFINITE_CARDINALITY:
        return None
    # Unknown: count in the dataset's own graph (no sample reaches Python), at most limit + 1.
    counted = int(dataset.take(limit + 1).reduce(np.int64(0), lambda count, *_: count + 1))
    return counted if counted <= limit else None


class Workload:
    """A compiled Keras model plus the samples one training step is made of.

    Samples are synthesised from the model's input shapes (random images, say) with targets
    that suit its outputs and loss, or drawn from a `tf.data.Dataset` of unbatched `(x, y)`
    samples (needed for models with dict targets, such as detectors).

    A model that is not compiled (a factory that returns it so, or a model object) is
    compiled with Adam and a loss chosen from its output (`sparse_categorical_crossentropy`
    for a softmax over classes, `binary_crossentropy` for a sigmoid, else `mean_squared_error`),
    and a `MemfitWarning` says which were used; `compiled_with` records them. Built-in models
    (`keras.applications.Name`) get the same without a warning: they are never compiled.

    Args:
        model: a Keras model. Compiled models keep their optimizer and loss.
        optimizer: compile the model with this optimizer (default: the model's own; `"adam"`
            for a model that is not compiled).
        loss: compile the model with this loss (default: the model's own; chosen from the
            output for a model that is not compiled).
        input_shape: the shape of one sample (without batch), for models whose inputs have
            undefined dimensions; a list of shapes for several inputs.
        data: a `tf.data.Dataset` of unbatched `(x, y)` samples to take batches from.
        worst_case: build batches from the dataset's largest samples (most input elements —
            the largest images — then most target elements — the most objects) instead of
            the first ones, so a batch that fits holds for the whole dataset. A dataset that
            repeats for ever, or whose length is unknown, is read up to its first
            `SAMPLES_READ` (1000) samples: the largest among those.

    Example:
        >>> workload = Workload(model, input_shape=(160, 160, 3))
        >>> x, y = workload.batch(8)
    """

    def __init__(
        self,
        model: Any,
        *,
        optimizer: Any = None,
        loss: Any = None,
        input_shape: InputShape | None = None,
        data: Any = None,
        worst_case: bool = False,
    ) -> None:
        keras = tfb.import_keras()
        if not isinstance(model, (keras.Model, str)) and is_tf_keras(model):
            raise WorkloadError(not_keras3_message("the model", model))
        if not isinstance(model, keras.Model):
            raise WorkloadError(
                f"expected a keras.Model, got {type(model).__name__}; pass the model object "
                f"(or, on the command line, a .keras file, factory or built-in name)"
            )
        self.model = model
        self.data = data
        self.worst_case = worst_case
        self._ranked: list[int] | None = None
        self._keras_relaxed: Any = None
        self.input_shape = _normalise_shapes(input_shape)
        # What memfit compiled an uncompiled model with: {"optimizer": ..., "loss": ...}.
        self.compiled_with: dict[str, str] | None = None
        self._ensure_built()
        self._ensure_compiled(optimizer, loss)

    # -- preparation ------------------------------------------------------------------------
    def _ensure_built(self) -> None:
        if self.model.built and self._model_inputs() is not None:
            return
        if self.input_shape is None:
            if self.data is not None:
                return
            raise WorkloadError(
                f"model {self.model.name!r} has no known input shape; pass input_shape=(H, W, C) "
                f"(--input-shape H,W,C)"
            )
        shapes = [(None, *shape) for shape in self.input_shape]
        self.model.build(shapes[0] if len(shapes) == 1 else shapes)

    def _ensure_compiled(self, optimizer: Any, loss: Any) -> None:
        compiled = bool(getattr(self.model, "compiled", False)) and self.model.optimizer is not None
        if compiled and optimizer is None and loss is None:
            return
        chosen = {}
        if not compiled:
            if optimizer is None:
                chosen["optimizer"] = "adam"
            if loss is None:
                chosen["loss"] = self._default_loss()
        optimizer = optimizer or (self.model.optimizer if compiled else None) or "adam"
        loss = loss or (self.model.loss if compiled else None) or self._default_loss()
        self.model.compile(optimizer=optimizer, loss=loss)
        if chosen:
            self.compiled_with = {"optimizer": str(optimizer), "loss": str(loss)}
            if not getattr(self.model, "_memfit_builtin", False):
                _warn_uncompiled(self.model.name, chosen)

    def _default_loss(self) -> str:
        outputs = self._model_outputs()
        last = self.model.layers[-1] if getattr(self.model, "layers", None) else None
        activation = getattr(getattr(last, "activation", None), "__name__", "")
        if outputs and len(outputs) == 1:
            classes = outputs[0].shape[-1]
            if activation == "softmax" and classes and classes > 1:
                return "sparse_categorical_crossentropy"
            if activation == "sigmoid":
                return "binary_crossentropy"
        return "mean_squared_error"

    # -- shapes -----------------------------------------------------------------------------
    def _model_inputs(self) -> list[Any] | None:
        try:
            inputs = self.model.inputs
        except (AttributeError, ValueError):
            return None
        return list(inputs) if inputs else None

    def _model_outputs(self) -> list[Any] | None:
        try:
            outputs = self.model.outputs
        except (AttributeError, ValueError):
            return None
        return list(outputs) if outputs else None

    def sample_shapes(self) -> list[tuple[int, ...]]:
        """Shape of one sample per model input (batch dimension left out)."""
        if self.input_shape is not None:
            return [tuple(s) for s in self.input_shape]
        inputs = self._model_inputs()
        if not inputs:
            raise WorkloadError(
                f"model {self.model.name!r} has no known input shape; pass input_shape=(H, W, C)"
            )
        shapes = []
        for tensor in inputs:
            dims = tuple(tensor.shape[1:])
            if any(d is None for d in dims):
                name = getattr(tensor, "name", "input")
                raise WorkloadError(
                    f"model input {name!r} has undefined dimensions {tuple(tensor.shape)}; pass "
                    f"input_shape=(H, W, C) (--input-shape H,W,C) for the size you train at"
                )
            shapes.append(dims)
        return shapes

    # -- batches ----------------------------------------------------------------------------
    def batch(self, batch_size: int) -> tuple[Any, Any]:
        """One batch `(x, y)` of `batch_size` samples as TensorFlow tensors.

        Held where a GPU holds it: on a card emulated on the CPU, in the card's allocator
        (`tfb.hold_on_device`), so a step measured there counts the batch it reads.
        """
        if self.data is not None:
            return tfb.hold_on_device(self._batch_from_data(batch_size))
        return tfb.hold_on_device(self._synthetic_batch(batch_size))

    def synthetic_batch_bytes(self, batch_size: int) -> int | None:
        """Bytes of a synthesised batch's inputs and targets (None when data is given)."""
        if self.data is not None:
            return None
        inputs = self._model_inputs() or []
        total = 0
        for i, shape in enumerate(self.sample_shapes()):
            dtype = str(getattr(inputs[i], "dtype", "float32")) if i < len(inputs) else "float32"
            try:
                itemsize = np.dtype(dtype).itemsize
            except TypeError:  # bfloat16 and other dtypes NumPy does not name
                itemsize = 4
            total += batch_size * int(np.prod(shape)) * itemsize
        outputs = self._model_outputs() or []
        for output in outputs:
            dims = [d for d in output.shape[1:] if d is not None]
            total += batch_size * int(np.prod(dims)) * 4
        return total

    def _synthetic_batch(self, batch_size: int) -> tuple[Any, Any]:
        tf = tfb.import_tf()
        rng = np.random.default_rng(0)
        inputs = self._model_inputs() or []
        xs = []
        for i, shape in enumerate(self.sample_shapes()):
            dtype = str(getattr(inputs[i], "dtype", "float32")) if i < len(inputs) else "float32"
            full = (batch_size, *shape)
            if "int" in dtype:
                xs.append(tf.zeros(full, dtype=dtype))
            else:
                xs.append(tf.constant(rng.standard_normal(full, dtype=np.float32), dtype=dtype))
        x = xs[0] if len(xs) == 1 else xs
        y = self._synthetic_targets(batch_size, x)
        return x, y

    def _synthetic_targets(self, batch_size: int, x: Any) -> Any:
        tf = tfb.import_tf()
        outputs = self._model_outputs()
        if outputs:
            shapes = [tuple(o.shape[1:]) for o in outputs]
        else:
            sample = x[:1] if not isinstance(x, list) else [t[:1] for t in x]
            result = self.model(sample, training=False)
            flat = result if isinstance(result, (list, tuple)) else [result]
            shapes = [tuple(t.shape[1:]) for t in flat]
        losses = self._losses(len(shapes))
        rng = np.random.default_rng(1)
        ys = []
        for shape, loss in zip(shapes, losses, strict=True):
            if any(d is None for d in shape):
                raise WorkloadError(
                    f"cannot synthesise targets for an output of shape {shape}; give real "
                    f"samples with data= (--data package.module:dataset_fn)"
                )
            full = (batch_size, *shape)
            if "sparse" in loss:
                classes = shape[-1] if shape else 2
                ys.append(tf.constant(rng.integers(0, max(classes, 1), full[:-1]), dtype="int32"))
            elif "categorical" in loss or "kl" in loss:
                labels = rng.integers(0, shape[-1], full[:-1])
                ys.append(tf.one_hot(labels, shape[-1], dtype="float32"))
            elif "binary" in loss or "hinge" in loss:
                ys.append(tf.constant(rng.integers(0, 2, full).astype(np.float32)))
            else:
                ys.append(tf.constant(rng.random(full, dtype=np.float32)))
        return ys[0] if len(ys) == 1 else ys

    def _losses(self, count: int) -> list[str]:
        loss = getattr(self.model, "loss", None)
        if isinstance(loss, dict):
            names = list(getattr(self.model, "output_names", []) or loss.keys())
            items = [loss.get(name) for name in names]
        elif isinstance(loss, (list, tuple)):
            items = list(loss)
        else:
            items = [loss] * count
        items = (items + [None] * count)[:count]
        return [_loss_name(item) for item in items]

    def _batch_from_data(self, batch_size: int) -> tuple[Any, Any]:
        tf = tfb.import_tf()
        dataset = self._checked_data()
        if self.worst_case:
            ranked = self.ranked_samples()
            chosen = [ranked[i % len(ranked)] for i in range(batch_size)]
            wanted = tf.constant(sorted(set(chosen)), dtype=tf.int64)
            largest = (
                dataset.enumerate()
                .filter(lambda i, *_: tf.reduce_any(tf.equal(i, wanted)))
                .map(lambda _i, *sample: sample if len(sample) > 1 else sample[0])
            )
            dataset = largest
        spec = dataset.element_spec
        defined = all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec))
        dataset = dataset.repeat().take(batch_size)
        dataset = dataset.batch(batch_size) if defined else dataset.padded_batch(batch_size)
        batch = next(iter(dataset), None)  # `repeat()` of an empty dataset is empty too
        if batch is None:
            raise WorkloadError("data is empty: it yields no samples")
        return batch[0], batch[1]

    @property
    def samples_read(self) -> int | None:
        """How many samples are read from a dataset of infinite or unknown length (its first
        ones), or None when the whole dataset is read (or no dataset is given)."""
        if self.data is None:
            return None
        tf = tfb.import_tf()
        if int(tf.data.experimental.cardinality(self._checked_data(bounded=False))) >= 0:
            return None
        return SAMPLES_READ

    def _checked_data(self, bounded: bool = True) -> Any:
        """The dataset, checked to yield `(x, y)` samples; `bounded`: the part of it that is
        read (`readable_samples`: never an infinite dataset)."""
        tf = tfb.import_tf()
        dataset = self.data
        if not isinstance(dataset, tf.data.Dataset):
            raise WorkloadError(
                f"data must be a tf.data.Dataset of (x, y) samples, got {type(dataset).__name__}"
            )
        spec = dataset.element_spec
        if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
            raise WorkloadError(
                f"data must yield (x, y) or (x, y, sample_weight) samples; it yields {spec!r}"
            )
        return readable_samples(dataset) if bounded else dataset

    def ranked_samples(self) -> list[int]:
        """Dataset indices, largest sample first (input elements, then target elements).

        Reads the dataset once (the result is kept); used for worst-case batches. A dataset
        that repeats for ever, or whose length is unknown, is read up to its first
        `SAMPLES_READ` samples.
        """
        if self._ranked is None:
            tf = tfb.import_tf()
            keys = []
            for index, sample in enumerate(self._checked_data()):
                x_size = sum(int(tf.size(t)) for t in tf.nest.flatten(sample[0]))
                y_size = sum(int(tf.size(t)) for t in tf.nest.flatten(sample[1]))
                keys.append((-x_size, -y_size, index))
            if not keys:
                raise WorkloadError("data is empty: it yields no samples")
            self._ranked = [index for _x, _y, index in sorted(keys)]
        return self._ranked

    def largest_sample(self) -> dict[str, Any]:
        """Shapes of the largest sample's inputs and targets (for reports)."""
        tf = tfb.import_tf()
        index = self.ranked_samples()[0]
        sample = next(iter(self._checked_data().skip(index).take(1)))
        return {
            "index": index,
            "input_shapes": [list(t.shape) for t in tf.nest.flatten(sample[0])],
            "target_shapes": [list(t.shape) for t in tf.nest.flatten(sample[1])],
        }

    def fit_dataset(self, data: Any) -> Any:
        """A `tf.data.Dataset` that yields the batch `data` again and again, as `model.fit`'s
        input does: with the batch dimension undefined in its element spec.

        `model.fit` on arrays, or on a dataset batched without `drop_remainder`, traces its
        train function for batches of any size; a graph traced for one fixed size is
        optimised differently and peaks elsewhere. No copy is made: each element is `data`
        itself, its static batch size hidden.
        """
        tf = tfb.import_tf()

        def relax(*tensors: Any) -> Any:
            return tf.nest.map_structure(
                lambda t: tf.compat.v1.placeholder_with_default(t, [None, *t.shape[1:]]),
                tensors,
            )

        return tf.data.Dataset.from_tensors(data).repeat().map(relax)

    def fit_step(self, exact: bool = True) -> Any:
        """One training step as `model.fit` runs it: `step(data)` runs Keras' train function.

        The function is the one `model.fit` builds (`model.make_train_function`: the iterator
        read inside the step, Keras' relaxed retracing, its XLA setting), fed `data` through
        a distributed iterator over `fit_dataset(data)`, as `model.fit` feeds a dataset.
        `exact=True` makes a new train function (traced on its first step); `exact=False`
        reuses one across calls and batch sizes, as a process that trains several sizes
        does. Call `release_fit_step()` afterwards to give the model back its own train
        function.
        """
        model = self.model
        if not hasattr(self, "_user_train_function"):
            self._user_train_function = model.train_function
        if exact or self._keras_relaxed is None:
            model.train_function = None
            model.make_train_function(force=True)
            function = model.train_function
            if not exact:
                self._keras_relaxed = function
        else:
            function = self._keras_relaxed
        model.train_function = function
        iterators: dict[int, Any] = {}

        def step(data: Any) -> Any:
            key = id(data)
            if key not in iterators:
                dataset = self.fit_dataset(data)
                distributed = model.distribute_strategy.experimental_distribute_dataset(dataset)
                iterators[key] = iter(distributed)
            return function(iterators[key])

        return step

    def release_fit_step(self) -> None:
        """Give the model back the train function it had before `fit_step`."""
        if hasattr(self, "_user_train_function"):
            self.model.train_function = self._user_train_function
            del self._user_train_function

    def warm_relaxed(self) -> None:
        """Trace the shared train function now (Python only: nothing runs or is allocated).

        A later `fit_step(exact=False)` step then pays only TensorFlow's optimisation of the
        graph (on the function's first run) and the step itself; the allocator is left as
        fresh as it was. The trace is for any batch size (the batch dimension is undefined,
        as in `model.fit`), so one trace serves every size.
        """
        x, y = self.batch(1)
        data = (x, y)
        self.fit_step(exact=False)
        try:
            dataset = self.fit_dataset(data)
            iterator = iter(self.model.distribute_strategy.experimental_distribute_dataset(dataset))
            # The function that reads the iterator (Keras' `multi_step_on_iterator`); tracing
            # it traces the step inside. The step's own function takes a batch, not this.
            for function in tfb.traced_functions(self._keras_relaxed):
                if getattr(function, "__name__", "") == "multi_step_on_iterator":
                    function.get_concrete_function(iterator)
        finally:
            self.release_fit_step()
        del x, y, data

    def state_variables(self) -> list[Any]:
        """Every variable a training step can change: weights, optimizer, metrics, RNG."""
        seen: set[int] = set()
        result = []
        groups = [
            list(self.model.variables),
            list(getattr(self.model.optimizer, "variables", []) or []),
            list(getattr(self.model, "metrics_variables", []) or []),
        ]
        for group in groups:
            for var in group:
                if id(var) not in seen:
                    seen.add(id(var))
                    result.append(var)
        return result


def shape_list(shape: Any) -> list[Any]:
    """One sample's shape, or a list of shapes (one per input), as a list of shapes.

    `(224, 224, 3)` gives `[[224, 224, 3]]`; `[(8,), (4, 4)]` gives `[(8,), (4, 4)]`. Nothing
    is converted or checked (see `Workload` for that).
    """
    items = list(shape)
    return items if items and isinstance(items[0], (list, tuple)) else [items]


def _normalise_shapes(shape: InputShape | None) -> list[tuple[int, ...]] | None:
    if shape is None:
        return None
    shapes = [tuple(int(d) for d in s) for s in shape_list(shape)]
    for s in shapes:
        if not s or any(d <= 0 for d in s):
            raise WorkloadError(f"input shape {s} must be positive dimensions, e.g. 224,224,3")
    return shapes


def _loss_name(loss: Any) -> str:
    if loss is None:
        return ""
    if isinstance(loss, str):
        return loss.lower()
    name = getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__
    return str(name).lower()


def _warn_uncompiled(name: str, chosen: dict[str, str]) -> None:
    """Say which optimizer and loss memfit chose for a model that came uncompiled."""
    import warnings

    what = " and ".join(f"{kind} {value!r}" for kind, value in chosen.items())
    warnings.warn(
        f"model {name!r} is not compiled: memfit compiled it with {what}, which it chose "
        f"(memory depends on them: an optimizer's slots, a loss's temporaries); compile "
        f"the model (in its factory), or pass --optimizer/--loss (optimizer=, loss=)",
        MemfitWarning,
        stacklevel=4,
    )
