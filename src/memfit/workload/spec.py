"""WorkloadSpec: what is trained, as one frozen value every analysis and child process takes.

A `WorkloadSpec` names a workload: the MODEL (a `.keras` file, `package.module:factory` or a
built-in), one sample's shape, where samples come from, the optimizer and loss, the precision
policy and recompute mode the model is built under, a built-in's classes, whether a `.keras`
file may run Python code (`safe_mode`), and whether batches are made of the dataset's largest
samples (`worst_case`). The CLI builds one from its options, the Python API from its
keywords, and it travels whole to `measure`, `estimate`, `search`, `plan` and the child
processes (as JSON, `to_json` / `from_json`), so no option is dropped on the way. Variants
are `dataclasses.replace(spec, precision=..., remat=...)`.

`memfit.workload.workload.Workload` is its in-process counterpart: a built, compiled model and the
samples of a step (`WorkloadSpec.workload` builds one). A spec whose optimizer, loss and
data are names pickles and crosses to a child process; in-process analyses may hold a
`tf.data.Dataset` or optimizer object there, which `to_json` refuses with the reason.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend import tf_garden
from memfit.checks import check_positive_int, check_whole_number
from memfit.errors import WorkloadError
from memfit.recomputation.remat import remat_scope
from memfit.workload.models import call_factory, check_model_spec, load_model
from memfit.workload.step import StepWorkload
from memfit.workload.workload import Workload

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
"""Keras dtype policies a model can be built under."""
KERAS_REMAT_MODES = ("full", "activations", "larger_than", "list_of_layers")
"""`keras.RematScope`'s modes (the estimate replays a model built with each)."""
REMAT_MODES = ("memfit", *KERAS_REMAT_MODES)
"""Recompute a model can be built with: memfit's own, or a `keras.RematScope` mode."""

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class WorkloadSpec:
    """What is trained, by name: the one argument of memfit's analyses and child processes.

    Attributes:
        model: a MODEL string (`.keras` file, `package.module:factory`,
            `keras.applications.Name`, or the path of a saved copy); None when the model is a
            Keras model given beside the spec.
        input_shape: one sample's shape, or one per input (stored as a tuple of shapes).
        data: `package.module:dataset_fn` of unbatched `(x, y)` samples (in process, a
            `tf.data.Dataset` may stand here); None: synthesised samples.
        optimizer: optimizer to compile with, by name (default: the model's own, else Adam).
        loss: loss to compile with, by name (default: the model's own, else from its output).
        precision: Keras dtype policy to build the model under (None: the current one).
        remat: recompute to build the model with (`"memfit"` or a `keras.RematScope` mode).
        classes: classes of a built-in model.
        safe_mode: False loads a trusted `.keras` file that runs Python code (Lambda layers).
        worst_case: with data, batches are made of the dataset's largest samples.
        saved_data: a folder written by `tf.data.Dataset.save` (samples a parent process
            chose), used instead of `data`.
        imports: packages to import before the model is loaded (their layers registered).
        overrides: for a Model Garden task (`model="garden:NAME"`), `key.path=value` strings
            applied to its experiment config (the CLI's `--set`).
        params: for a Model Garden task, YAML/JSON files or texts applied to its experiment
            config before `overrides` (the CLI's `--params`, as the Model Garden's own
            `--params_override` takes them).

    Raises:
        WorkloadError: a field that cannot be right, with what to give instead.

    Example:
        ```python
        import dataclasses
        spec = WorkloadSpec("keras.applications.MobileNetV2", input_shape=(96, 96, 3))
        mixed = dataclasses.replace(spec, precision="mixed_float16")
        assert WorkloadSpec.from_json(mixed.to_json()) == mixed
        ```
    """

    model: str | None = None
    input_shape: Any = None
    data: Any = None
    optimizer: Any = None
    loss: Any = None
    precision: str | None = None
    remat: str | None = None
    classes: int | None = None
    safe_mode: bool = True
    worst_case: bool = False
    saved_data: str | None = None
    imports: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Each field is checked here, once, with one error text (see `memfit.checks`).
        if self.model is not None:
            if not isinstance(self.model, str):
                raise WorkloadError(
                    f"the spec's model must be a MODEL string, got a {type(self.model).__name__}; "
                    f"give a Keras model beside the spec instead"
                )

            check_model_spec(self.model)
        _set(self, "input_shape", _shapes(self.input_shape))
        for name, choices in (("precision", PRECISIONS), ("remat", REMAT_MODES)):
            value = getattr(self, name)
            if value is not None and value not in choices:
                raise WorkloadError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")
        if self.classes is not None:
            _set(self, "classes", check_positive_int(self.classes, "classes"))
        _set(self, "safe_mode", bool(self.safe_mode))
        _set(self, "worst_case", bool(self.worst_case))
        _set(self, "imports", tuple(str(name) for name in self.imports))
        for name in ("overrides", "params"):
            value = getattr(self, name)
            _set(self, name, (value,) if isinstance(value, str) else tuple(map(str, value)))
        if (self.overrides or self.params) and not self.is_task:
            raise WorkloadError(
                "overrides (--set) and params (--params) change a Model Garden experiment's "
                "config: give the model as garden:EXPERIMENT or garden:package.module:callable"
            )
        if self.is_task:
            given = [
                n
                for n in (
                    "input_shape",
                    "data",
                    "optimizer",
                    "loss",
                    "precision",
                    "remat",
                    "classes",
                )
                if getattr(self, n) is not None
            ]
            if given:
                raise WorkloadError(
                    f"a Model Garden task takes its {', '.join(given)} from its experiment "
                    f"config: change them with --set task.KEY=VALUE (e.g. "
                    f"task.model.input_size=[640,640,3]) instead"
                )

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> tuple[WorkloadSpec, Any]:
        """The spec of a public function's arguments, and the Keras model given beside it.

        Every argument named as a field is taken (none can be left behind); `model` becomes
        the spec's model when it is a MODEL string, else it is returned beside the spec.

        Args:
            arguments: the function's arguments by name (its `locals()` on entry).

        Returns:
            `(spec, model)`: `model` is the Keras model given, or None for a MODEL string.

        Example:
            ```python
            spec, model = WorkloadSpec.from_arguments({"model": "pkg.models:build", "loss": "mse"})
            ```
        """
        model = arguments.get("model")
        named = isinstance(model, str)
        fields = {f.name: arguments[f.name] for f in dataclasses.fields(cls) if f.name in arguments}
        return cls(**{**fields, "model": model if named else None}), None if named else model

    @property
    def is_task(self) -> bool:
        """Whether the model is a Model Garden task (`garden:NAME`): a step spec whose step
        is the task's own `train_step`, not `model.train_step`."""
        return isinstance(self.model, str) and self.model.startswith("garden:")

    @property
    def task_name(self) -> str:
        """The task's experiment name or `package.module:callable` (after `garden:`)."""
        return str(self.model)[len("garden:") :] if self.is_task else ""

    @property
    def sample_shape(self) -> Any:
        """One sample's shape as `load_model` and `Workload` take it: a tuple, or a list of
        them (one per input), or None."""
        if self.input_shape is None:
            return None
        return self.input_shape[0] if len(self.input_shape) == 1 else list(self.input_shape)

    @property
    def rebuildable(self) -> bool:
        """Whether precision and recompute can apply: a MODEL string that builds the model (a
        factory or a built-in), not a file or a model object."""
        return (
            isinstance(self.model, str)
            and not self.model.endswith((".keras", ".h5"))
            and not self.is_task
        )

    def check_named(self) -> None:
        """Check that the optimizer, loss and data are names a child process can rebuild.

        Raises:
            WorkloadError: one of them is an object.
        """
        for name in ("optimizer", "loss"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise WorkloadError(f"with isolated=True, {name} must be given by name (a string)")
        if self.data is not None and not isinstance(self.data, str):
            raise WorkloadError(
                "with isolated=True, data must be a 'package.module:dataset_fn' string that the "
                "child process can import"
            )

    def for_child(self) -> WorkloadSpec:
        """This spec, checked to cross to a child process: the model, optimizer, loss and data
        by name (see `check_named`).

        Raises:
            WorkloadError: a field holds an object a child process cannot rebuild.
        """
        self.check_named()
        if self.model is None:
            raise WorkloadError("a child process needs the model as a MODEL string or saved file")
        return self

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON-ready values, for a child process (`from_json` reads it back).

        Raises:
            WorkloadError: as `for_child`.
        """
        self.for_child()
        payload = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        shapes = self.input_shape
        payload["input_shape"] = [list(s) for s in shapes] if shapes is not None else None
        payload["imports"] = list(self.imports)
        payload["overrides"] = list(self.overrides)
        payload["params"] = list(self.params)
        return payload

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> WorkloadSpec:
        """The spec `to_json` wrote (in the child process)."""
        return cls(**payload)

    def build_model(self, *, keep_policy: bool = False) -> Any:
        """Build or load the model, under the spec's precision policy and recompute scope.

        Args:
            keep_policy: leave the dtype policy set afterwards (a throwaway process), instead
                of restoring the one set before.

        Returns:
            A `keras.Model` (see `memfit.load_model`).
        """
        for name in self.imports:
            importlib.import_module(name)

        if self.model is None:
            raise WorkloadError("no MODEL string to build the model from")
        if self.is_task:
            return self.workload().model
        keras = tfb.import_keras()
        previous = keras.mixed_precision.dtype_policy()
        if self.precision:
            keras.mixed_precision.set_dtype_policy(self.precision)
        try:
            with remat_scope(self.remat):  # "memfit" recompute wraps the built model's forward
                return load_model(
                    self.model,
                    input_shape=self.sample_shape,
                    classes=self.classes,
                    safe_mode=self.safe_mode,
                )
        finally:
            if not keep_policy:
                keras.mixed_precision.set_dtype_policy(previous)

    def load_data(self) -> Any:
        """The samples' `tf.data.Dataset` (saved samples, or the dataset function's), or None."""
        if self.saved_data:
            return tfb.import_tf().data.Dataset.load(self.saved_data)
        if isinstance(self.data, str):
            return call_factory(self.data)
        return self.data

    def workload(self, model: Any = None) -> Any:
        """The in-process `Workload` of `model` (default: the model the spec builds).

        Example:
            ```python
            spec = WorkloadSpec("keras.applications.MobileNet", input_shape=(32, 32, 3))
            workload = spec.workload()  # the model built, compiled, and its samples
            ```
        """
        if self.is_task and model is None:
            return self.task_workload()

        return Workload(
            self.build_model() if model is None else model,
            optimizer=self.optimizer,
            loss=self.loss,
            input_shape=self.sample_shape,
            data=self.load_data(),
            worst_case=self.worst_case,
        )

    def task_workload(self) -> Any:
        """The `StepWorkload` of a Model Garden task: its model, optimizer, `train_step` and
        a batch of its `build_inputs` (see `memfit.backend.tf_garden`).

        Raises:
            WorkloadError: the spec is not a task, the Model Garden is not installed, or the
                task cannot be built (unknown experiment, an override that does not apply).
        """
        if not self.is_task:
            raise WorkloadError(f"{self.model!r} is not a Model Garden task (garden:NAME)")
        for name in self.imports:
            importlib.import_module(name)

        built = tf_garden.build_task(self.task_name, self.overrides, self.params)
        return StepWorkload.from_task(built, str(self.model))


def _set(spec: WorkloadSpec, name: str, value: Any) -> None:
    object.__setattr__(spec, name, value)  # a frozen dataclass's normalised field


def _shapes(value: Any) -> Shapes | None:
    """One sample's shape, or one per input, as a tuple of shapes of whole numbers >= 1."""
    if value is None:
        return None
    try:
        items = list(value)
        groups = items if items and isinstance(items[0], (list, tuple)) else [items]
        shapes = tuple(
            tuple(check_whole_number(d, "an input_shape dimension") for d in group)
            for group in groups
        )
    except (TypeError, WorkloadError):
        shapes = ()
    if not shapes or not all(shapes):
        raise WorkloadError(
            f"input_shape must be one sample's shape, e.g. (224, 224, 3), or a list of them "
            f"(one per input), each of whole numbers of at least 1; got {value!r}"
        )
    return shapes
