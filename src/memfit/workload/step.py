"""StepWorkload: a training step that is not `model.train_step` — a step spec, built.

Where `memfit.workload.workload.Workload` trains a compiled Keras 3 model through its own
`train_step`, a `StepWorkload` holds a model (Keras 3 or tf_keras), its optimizer, a step
function `step_fn(data, optimizer) -> logs` (the contract of `memfit.GuardedStep`'s
`step_fn`) and where its batches come from: a callable `batches(batch_size) -> data`. A TF
Model Garden task is one (`StepWorkload.from_task`): its `task.train_step`, a batch of its
`task.build_inputs`. `memfit.measure` and `memfit.estimate` take it where they take a
`Workload`: they measure and trace `tf.function` of the step function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend import tf_keras_compat
from memfit.errors import WorkloadError


class StepWorkload:
    """A model, its optimizer, a step function and where its batches come from.

    Args:
        model: a Keras 3 or tf_keras model, built.
        optimizer: the optimizer `step_fn` updates.
        step_fn: `step_fn(data, optimizer) -> logs`: one whole training step over `data` (its
            forward, loss, gradients and `optimizer.apply_gradients`).
        batches: `batches(batch_size) -> data`, one batch as `step_fn` takes it.
        metrics: metric objects the step updates (their state is put back after a
            measurement, as the weights are).
        name: what the workload is called in reports.

    Example:
        ```python
        workload = StepWorkload(model, optimizer, step_fn=my_step,
                                batches=lambda n: next(iter(dataset.batch(n))))
        memfit.measuring.measurer.measure_built(workload, 4)
        ```
    """

    is_step = True

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        step_fn: Callable[[Any, Any], Any],
        batches: Callable[[int], Any],
        *,
        metrics: list[Any] | None = None,
        name: str | None = None,
    ) -> None:
        if not tf_keras_compat.is_model(model):
            raise WorkloadError(
                f"a step spec's model must be a Keras 3 or tf_keras model, got "
                f"{type(model).__name__}"
            )
        if optimizer is None or not callable(step_fn) or not callable(batches):
            raise WorkloadError(
                "a step spec needs optimizer=, step_fn(data, optimizer) and data (a callable "
                "batch_size -> batch, or an unbatched tf.data.Dataset)"
            )
        self.model = model
        self.optimizer = optimizer
        self.step_fn = step_fn
        self.batches = batches
        self.metrics = list(metrics or [])
        self.name = name or getattr(model, "name", "model")
        self.data = None  # batches come from `batches`, not a dataset of samples
        self.input_shape = None
        self.compiled_with = None
        self.task: Any = None  # the Model Garden task, when built by `from_task`

    @classmethod
    def from_task(cls, built: Any, name: str) -> StepWorkload:
        """The step spec of a built Model Garden task (`memfit.backend.tf_garden.GardenTask`)."""
        workload = cls(
            built.model,
            built.optimizer,
            built.step_fn,
            built.batch,
            metrics=built.metrics,
            name=name,
        )
        workload.task = built
        return workload

    @classmethod
    def from_data(
        cls, model: Any, optimizer: Any, step_fn: Callable[[Any, Any], Any], data: Any
    ) -> StepWorkload:
        """A step spec whose batches come from `data`: a callable `batch_size -> batch`, or an
        unbatched `tf.data.Dataset` (batched with `drop_remainder=True`, first batch taken)."""
        tf = tfb.import_tf()
        if isinstance(data, tf.data.Dataset):
            dataset = data

            def batches(batch_size: int) -> Any:
                batch = next(iter(dataset.batch(batch_size, drop_remainder=True).take(1)), None)
                if batch is None:
                    raise WorkloadError(f"data holds fewer than {batch_size} samples")
                return batch
        elif callable(data):
            batches = data
        else:
            raise WorkloadError(
                "with step_fn=, data must be a callable batch_size -> batch or an unbatched "
                f"tf.data.Dataset, got {type(data).__name__}"
            )
        return cls(model, optimizer, step_fn, batches)

    # -- what the measurement and the trace read ------------------------------------------
    def batch(self, batch_size: int) -> Any:
        """One batch of `batch_size` as the step takes it, held where a GPU holds it."""
        return tfb.hold_on_device(self.batches(int(batch_size)))

    def synthetic_batch_bytes(self, batch_size: int) -> None:
        """None: the batches are the step spec's own, never synthesised."""
        return None

    def sample_shapes(self) -> list[tuple[int, ...]]:
        """The first input's sample shape (from a batch of one is not assumed: unknown)."""
        raise WorkloadError("a step spec's sample shape is its data's")

    def build_optimizer(self) -> None:
        """Create the optimizer's slots now, so resident bytes hold them (as in training)."""
        with self.model.distribute_strategy.scope():
            tf_keras_compat.build_optimizer(self.optimizer, self.model.trainable_variables)

    def traced_function(self) -> Any:
        """`tf.function` of the step (`step(data) -> logs`), as a training loop compiles it."""
        tf = tfb.import_tf()
        optimizer, step_fn = self.optimizer, self.step_fn
        return tf.function(lambda data: step_fn(data, optimizer), jit_compile=False)

    def fit_step(self, exact: bool = True) -> Any:
        """The step as training runs it: `tf.function` of `step_fn` (traced on first call)."""
        return self.traced_function()

    def warm_relaxed(self) -> None:
        """Nothing to trace ahead: each size traces the step anew (`fit_step`), as a task's
        step may need a static batch size (the Model Garden's Mask R-CNN samplers do)."""

    def release_fit_step(self) -> None:
        """Nothing to give back: the model's own train function is never replaced."""

    def optimizer_variables(self) -> list[Any]:
        """The optimizer's variables (its iteration count, slots, loss-scale state)."""
        return tf_keras_compat.optimizer_variables(self.optimizer)

    def state_variables(self) -> list[Any]:
        """Every variable a step can change: weights, optimizer, metrics."""
        seen: set[int] = set()
        result = []
        metric_vars = [v for m in self.metrics for v in getattr(m, "variables", [])]
        for var in [*self.model.variables, *self.optimizer_variables(), *metric_vars]:
            if id(var) not in seen:
                seen.add(id(var))
                result.append(var)
        return result


def refuse_for_step(*, explain: bool = False, recompute: Any = None) -> None:
    """Refuse, in one line, what a step spec (a Model Garden task) cannot be measured with.

    Raises:
        WorkloadError: `explain` or recompute asked for a step spec.
    """
    asked = [
        name
        for name, value in (
            ("explain (--explain)", explain),
            ("recompute (--recompute)", recompute),
        )
        if value
    ]
    if asked:
        raise WorkloadError(
            f"{' and '.join(asked)} cannot apply to a step spec (a Model Garden task's "
            f"train_step): measure the step as it is, or in micro-batches (--micro-batches K)"
        )
