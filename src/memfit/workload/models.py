"""Turn a MODEL argument into a Keras model: a `.keras` file, a factory, or a built-in name."""

from __future__ import annotations

import difflib
import os
import zipfile
from collections.abc import Sequence
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend import tf_garden, tf_keras_compat
from memfit.backend.factories import call_factory, first_line
from memfit.errors import ModelLoadError

MODEL_FORMS = (
    "a .keras file, package.module:factory (a callable returning a model), "
    "or a built-in name such as keras.applications.MobileNetV2"
)
_FILE_SUFFIXES = (".keras", ".h5", ".hdf5")
_BUILTIN_PREFIXES = ("keras.applications.", "applications.")


def is_file_spec(spec: str) -> bool:
    """Whether a MODEL argument names a file (rather than a factory or built-in)."""
    return spec.lower().endswith(_FILE_SUFFIXES) or os.sep in spec or os.path.isfile(spec)


def check_model_spec(spec: str) -> None:
    """Cheap checks of a MODEL argument that need no TensorFlow (file exists, format, form).

    Raises:
        ModelLoadError: the file is missing or not a Keras model file, or the form is unknown.
    """
    if not spec or not spec.strip():
        raise ModelLoadError(f"MODEL is empty; give {MODEL_FORMS}")
    if spec.startswith("garden:"):
        name = spec[len("garden:") :]
        module, colon, attr = name.partition(":")
        if (
            not name
            or not all(p.isidentifier() for p in module.split("."))
            or (colon and not attr.isidentifier())
        ):
            raise ModelLoadError(
                f"{spec!r} is not a Model Garden task; give garden:EXPERIMENT (e.g. "
                f"garden:retinanet_resnetfpn_coco) or garden:package.module:callable"
            )
        return
    if is_file_spec(spec):
        if not os.path.exists(spec):
            raise ModelLoadError(f"model file {spec!r} does not exist; give {MODEL_FORMS}")
        if os.path.isdir(spec):
            raise ModelLoadError(
                f"{spec!r} is a directory; memfit loads .keras files (model.save('m.keras')). "
                f"For a TensorFlow SavedModel, load it in a factory: package.module:factory"
            )
        lower = spec.lower()
        if lower.endswith(".keras") and not zipfile.is_zipfile(spec):
            raise ModelLoadError(
                f"{spec!r} is not a Keras model file: a .keras file is a zip archive written "
                f"by model.save(); re-save the model or give {MODEL_FORMS}"
            )
        if not lower.endswith(_FILE_SUFFIXES):
            raise ModelLoadError(
                f"{spec!r} is not a Keras model file (expected .keras, or legacy .h5); "
                f"give {MODEL_FORMS}"
            )
        if lower.endswith((".h5", ".hdf5")):
            with open(spec, "rb") as handle:
                if handle.read(8) != b"\x89HDF\r\n\x1a\n":
                    raise ModelLoadError(f"{spec!r} is not an HDF5 Keras model file")
        return
    if ":" in spec:
        module, _, attr = spec.partition(":")
        if not module or not attr or not all(p.isidentifier() for p in module.split(".")):
            raise ModelLoadError(f"{spec!r} is not of the form package.module:factory")
        return
    if "." not in spec and not spec[:1].isupper():
        raise ModelLoadError(f"{spec!r} is not a MODEL; give {MODEL_FORMS}")


def load_model(
    spec: str,
    *,
    input_shape: Sequence[int] | None = None,
    classes: int | None = None,
    safe_mode: bool = True,
) -> Any:
    """Build or load the Keras model a MODEL argument names.

    Args:
        spec: a `.keras` (or legacy `.h5`) file; `package.module:factory`, a callable taking
            no arguments and returning a model (the current directory is importable); or a
            built-in such as `keras.applications.ResNet50`, built with `weights=None`.
        input_shape: input shape (without batch) for a built-in model.
        classes: number of classes for a built-in model (default 1000).
        safe_mode: load `.keras` files with Keras' safe mode, which refuses files that
            would run arbitrary Python code (Lambda layers) when loaded.

    Returns:
        A `keras.Model`. Files keep the optimizer and loss they were saved with.

    Raises:
        ModelLoadError: with what went wrong and what to do.

    Example:
        >>> model = load_model("keras.applications.MobileNetV2", input_shape=(96, 96, 3))
    """
    check_model_spec(spec)

    keras = tfb.import_keras()
    if is_file_spec(spec):
        model = _load_file(keras, spec, safe_mode)
    elif ":" in spec:
        model = call_factory(spec)
    else:
        model = _build_builtin(keras, spec, input_shape, classes)
    if not isinstance(model, keras.Model):
        raise ModelLoadError(not_keras3_message(spec, model))
    return model


def not_keras3_message(spec: str, model: Any) -> str:
    """Why a MODEL's object cannot train as a Keras 3 model, and what to use instead.

    A tf_keras (Keras 2) model and a Model Garden experiment config each get their own
    answer: the task spec (`garden:...`) and `memfit.GuardedStep` take them.
    """

    kind = type(model).__name__
    if tf_garden.is_experiment_config(model):
        return (
            f"{spec!r} returned a Model Garden ExperimentConfig: name it as a task, "
            f"garden:{spec}, and memfit measures the task's own train_step"
        )
    if tf_keras_compat.is_tf_keras(model):
        return (
            f"{spec!r} gave a tf_keras (Keras 2) {kind}; this command trains Keras 3 models "
            f"through model.train_step. For a Model Garden model name its task "
            f"(garden:EXPERIMENT or garden:package.module:callable); for your own tf_keras "
            f"step use memfit.measure/estimate(model, batch_size, optimizer=..., "
            f"step_fn=..., data=...) or memfit.GuardedStep"
        )
    return f"{spec!r} gave a {kind}, not a keras.Model; a factory must return a Keras model"


def _load_file(keras: Any, path: str, safe_mode: bool) -> Any:
    try:
        return keras.saving.load_model(path, safe_mode=safe_mode)
    except ValueError as exc:
        text = str(exc)
        if "safe_mode" in text or "unsafe" in text.lower() or "lambda" in text.lower():
            raise ModelLoadError(
                f"{path!r} needs unsafe deserialisation (it stores Python code, such as a "
                f"Lambda layer, that runs when loaded); if you trust the file, pass --unsafe "
                f"(safe_mode=False)"
            ) from None
        raise ModelLoadError(f"could not load {path!r}: {first_line(text)}") from None
    except (TypeError, KeyError, OSError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(
            f"could not load {path!r} as a Keras model ({type(exc).__name__}: "
            f"{first_line(str(exc))}); if it uses custom layers, load it in a factory "
            f"(package.module:factory) that imports them"
        ) from None


def _build_builtin(
    keras: Any, spec: str, input_shape: Sequence[int] | None, classes: int | None
) -> Any:
    name = spec
    for prefix in _BUILTIN_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    available = sorted(n for n in dir(keras.applications) if n[:1].isupper())
    builder = getattr(keras.applications, name, None) if "." not in name else None
    if builder is None or not callable(builder):
        close = difflib.get_close_matches(name, available, n=3)
        hint = (
            f" Did you mean {', '.join('keras.applications.' + c for c in close)}?" if close else ""
        )
        raise ModelLoadError(f"unknown built-in model {spec!r}.{hint} Give {MODEL_FORMS}")
    kwargs: dict[str, Any] = {"weights": None}
    if input_shape is not None:
        kwargs["input_shape"] = tuple(input_shape)
    if classes is not None:
        kwargs["classes"] = classes
    try:
        model = builder(**kwargs)
    except ValueError as exc:
        raise ModelLoadError(
            f"keras.applications.{name} cannot be built with {kwargs}: {first_line(str(exc))}"
        ) from None
    # A built-in is never compiled: memfit's choice of optimizer and loss goes without a
    # warning (see Workload).
    model._memfit_builtin = True
    return model
