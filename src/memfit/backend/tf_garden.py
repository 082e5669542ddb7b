"""The TF Model Garden (`tf-models-official`) behind memfit's task specs. Imported lazily.

A task spec names a Model Garden experiment (`garden:retinanet_resnetfpn_coco`) or a callable
that returns one (`garden:mypkg.tasks:experiment`), plus override strings (`--set
task.model.input_size=[128,128,3]`) and YAML/JSON files or texts (`--params`), as the Model
Garden's own `--params_override` takes them. This module turns that into what a training
step needs: the task, its model and optimizer, its metrics, one batch of `task.build_inputs`
at a batch size, and the step itself (`task.train_step`). Nothing here is imported where
the Model Garden is not installed: `require_garden` says so in one line first.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memfit.backend.factories import call_factory
from memfit.errors import WorkloadError

PREFIX = "garden:"
"""How a MODEL argument names a Model Garden task."""

_REGISTRIES = ("official.vision",)  # imported to register their experiments (cheap: lazily)


def available() -> bool:
    """Whether `tf-models-official` is importable here (nothing is imported)."""
    try:
        return importlib.util.find_spec("official") is not None
    except (ImportError, ValueError):
        return False


def require_garden(name: str = "") -> None:
    """Raise one clear line when the Model Garden is not installed in this environment.

    Args:
        name: the task spec asked for, for the message.

    Raises:
        WorkloadError: `tf-models-official` is not importable.

    Example:
        ```python
        require_garden("garden:retinanet_resnetfpn_coco")
        ```
    """
    if available():
        return
    what = f"{name!r} names a TF Model Garden task, but" if name else "the TF Model Garden:"
    raise WorkloadError(
        f"{what} tf-models-official is not installed in this Python environment; it pins its "
        f"own tensorflow, so use a second environment: `make` creates .venv-garden (or pip "
        f"install tf-models-official in a fresh venv beside memfit) and run memfit from there"
    )


def experiment_names() -> list[str]:
    """The experiments the Model Garden registers (after importing its vision package)."""
    from official.core import exp_factory

    _register()
    registered = getattr(exp_factory, "_REGISTERED_CONFIGS", {})
    return sorted(registered) if isinstance(registered, dict) else []


def _register() -> None:
    for module in _REGISTRIES:
        importlib.import_module(module)


def experiment_config(name: str, overrides: Sequence[str] = (), params: Sequence[str] = ()) -> Any:
    """The Model Garden `ExperimentConfig` a task spec names, its overrides applied.

    Args:
        name: an experiment name registered with `exp_factory` (`retinanet_resnetfpn_coco`),
            or `package.module:callable`, a callable taking no arguments that returns an
            `ExperimentConfig`.
        overrides: `key.path=value` strings (`task.model.input_size=[128,128,3]`), applied
            in order, strictly (a key that does not exist is an error).
        params: YAML/JSON files or texts, applied first, as `--params_override` takes them.

    Returns:
        The experiment config (a copy: the registry's own is never changed).

    Raises:
        WorkloadError: an unknown experiment (with close names), a callable that does not
            return an experiment config, an override that does not apply.

    Example:
        ```python
        config = experiment_config("retinanet_resnetfpn_coco",
                                   ["task.model.backbone.resnet.model_id=18"])
        ```
    """
    require_garden(PREFIX + name)
    from official.core import config_definitions, exp_factory
    from official.modeling.hyperparams import params_dict

    _register()
    if ":" in name:
        config = call_factory(name)
        if not isinstance(config, config_definitions.ExperimentConfig):
            raise WorkloadError(
                f"{PREFIX}{name} returned a {type(config).__name__}, not a Model Garden "
                f"ExperimentConfig; the callable must return one (e.g. "
                f"exp_factory.get_exp_config('retinanet_resnetfpn_coco'), changed as you need)"
            )
        config = copy.deepcopy(config)
    else:
        names = experiment_names()
        if name not in names:
            close = difflib.get_close_matches(name, names, n=4, cutoff=0.4)
            hint = f"; close names: {', '.join(close)}" if close else ""
            raise WorkloadError(
                f"no Model Garden experiment named {name!r}{hint} ({len(names)} registered by "
                f"official.vision; or give garden:package.module:callable)"
            )
        config = exp_factory.get_exp_config(name)
    for text in params:
        _override(params_dict, config, text, "--params")
    for text in overrides:
        if "=" not in text:
            raise WorkloadError(f"override {text!r} is not of the form key.path=value")
        _override(params_dict, config, text, "--set")
    return config


def _override(params_dict: Any, config: Any, text: str, option: str) -> None:
    try:
        params_dict.override_params_dict(config, text, is_strict=True)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        message = str(exc.args[0]) if exc.args else str(exc)
        first = next((line.strip() for line in message.splitlines() if line.strip()), "")
        raise WorkloadError(
            f"{option} {text!r} does not apply to the experiment: {first[:300]}"
        ) from None


@dataclass
class GardenTask:
    """A built Model Garden task: its config, model, optimizer and metrics.

    Attributes:
        config: the experiment config (overrides applied).
        task: the `official.core.base_task.Task`.
        model: the task's tf_keras model, built.
        optimizer: `task.create_optimizer(config.trainer.optimizer_config, config.runtime)`.
        metrics: `task.build_metrics(training=True)`.
    """

    config: Any
    task: Any
    model: Any
    optimizer: Any
    metrics: list[Any]

    def batch(self, batch_size: int) -> Any:
        """One batch of `task.build_inputs` at `batch_size` (`global_batch_size` set to it)."""
        config = copy.deepcopy(self.config.task.train_data)
        config.global_batch_size = int(batch_size)
        try:
            dataset = self.task.build_inputs(config)
            return next(iter(dataset.take(1)))
        except Exception as exc:  # noqa: BLE001 - the user's data: say what failed, one line
            raise WorkloadError(
                f"the task's input pipeline (task.build_inputs of task.train_data, input_path "
                f"{getattr(config, 'input_path', '')!r}) failed: {type(exc).__name__}: "
                f"{_first_line(exc)}"
            ) from None

    def step_fn(self, data: Any, optimizer: Any) -> Any:
        """The task's own training step: `task.train_step(data, model, optimizer, metrics)`."""
        return self.task.train_step(data, self.model, optimizer, self.metrics)


def build_task(name: str, overrides: Sequence[str] = (), params: Sequence[str] = ()) -> GardenTask:
    """Build the task a task spec names: config, task, model, optimizer and metrics.

    Args:
        name, overrides, params: as `experiment_config`.

    Returns:
        A `GardenTask`.

    Raises:
        WorkloadError: as `experiment_config`, or the task, model or optimizer could not be
            built from the config (a value of the wrong kind, say).

    Example:
        ```python
        built = build_task("retinanet_resnetfpn_coco", ["task.init_checkpoint=null"])
        logs = built.step_fn(built.batch(2), built.optimizer)
        ```
    """
    config = experiment_config(name, overrides, params)
    from official.core import task_factory

    try:
        task = task_factory.get_task(config.task)
        model = task.build_model()
        optimizer = task.create_optimizer(config.trainer.optimizer_config, config.runtime)
        metrics = list(task.build_metrics(training=True) or [])
    except Exception as exc:  # noqa: BLE001 - a config the task cannot build: one line
        raise WorkloadError(
            f"the Model Garden could not build {PREFIX}{name} from its config "
            f"({type(exc).__name__}: {_first_line(exc)}); check the --set/--params values"
        ) from None
    return GardenTask(config, task, model, optimizer, metrics)


def is_experiment_config(obj: Any) -> bool:
    """Whether `obj` is a Model Garden `ExperimentConfig` (False where it is not installed)."""
    return any(
        cls.__name__ == "ExperimentConfig"
        and (getattr(cls, "__module__", "") or "").startswith("official.")
        for cls in type(obj).__mro__
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if exc.args else str(exc)
    return next((line.strip() for line in text.splitlines() if line.strip()), text)[:300]
