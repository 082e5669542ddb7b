"""Importing TensorFlow and Keras: clear errors when missing, quiet start-up, versions.

TensorFlow itself is imported lazily, so that `import memfit` and the CLI's argument checks work
(and fail clearly) without it.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from types import ModuleType

from memfit.errors import BackendMissingError

INSTALL_HINT = (
    'install memfit with TensorFlow: pip install "memfit[cpu]" on a CPU-only machine, '
    'or pip install "memfit[gpu]" on a machine with an NVIDIA GPU'
)


def _quiet_logs() -> None:
    # TensorFlow prints several lines of C++ INFO logs on import; keep warnings and errors.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")


# Lines TensorFlow's C++ libraries print on import before their logging reads
# TF_CPP_MIN_LOG_LEVEL (absl's notice, once per library, and oneDNN's INFO line): seen with
# TF 2.21 on an AVX-512 CPU, where they came before every one-line error of the CLI.
_IMPORT_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|\] oneDNN custom operations are on\."
)


def import_tf() -> ModuleType:
    """Import TensorFlow, or raise a `BackendMissingError` that says what to install.

    The first import drops the INFO lines TensorFlow prints before its logging reads
    `TF_CPP_MIN_LOG_LEVEL` (when that hides INFO, memfit's default); other output passes.
    """
    _quiet_logs()
    try:
        if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") == "0":
            import tensorflow as tf
        else:
            tf = _import_filtering_noise()
    except ImportError as exc:
        raise BackendMissingError(f"TensorFlow is not installed ({exc}); {INSTALL_HINT}") from None
    return tf


def _import_filtering_noise() -> ModuleType:
    """`import tensorflow` with file descriptor 2 captured, and written back without the
    known import-time INFO lines."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (embedded interpreters)
        import tensorflow as tf

        return tf
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow as tf
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            kept = [line for line in text.splitlines(True) if not _IMPORT_NOISE.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
    return tf


def import_keras() -> ModuleType:
    """Import Keras 3 on the TensorFlow backend, or raise a `BackendMissingError`."""
    import_tf()
    try:
        import keras
    except ImportError as exc:
        raise BackendMissingError(f"Keras is not installed ({exc}); {INSTALL_HINT}") from None
    if not hasattr(keras, "RematScope") and not keras.__version__.startswith("3"):
        raise BackendMissingError(
            f"memfit needs Keras 3, found Keras {keras.__version__}; pip install -U keras"
        )
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise BackendMissingError(
            f"Keras is using the {backend!r} backend; memfit measures TensorFlow. "
            f"Set KERAS_BACKEND=tensorflow before importing keras"
        )
    return keras


def is_imported() -> bool:
    """Whether TensorFlow has been imported in this process."""
    return "tensorflow" in sys.modules


def is_initialized() -> bool:
    """Whether TensorFlow has created its runtime devices (after which limits are fixed)."""
    if not is_imported():
        return False
    try:
        from tensorflow.python.eager import context
    except ImportError:  # pragma: no cover - a TensorFlow without this module
        return False
    ctx = context.context()
    return bool(getattr(ctx, "_initialized", False) or getattr(ctx, "_context_handle", None))


def versions() -> dict[str, str | None]:
    """TensorFlow, Keras, and the CUDA/cuDNN versions TensorFlow was built with."""
    result: dict[str, str | None] = {"tensorflow": None, "keras": None, "cuda": None, "cudnn": None}
    try:
        tf = import_tf()
    except BackendMissingError:
        return result
    result["tensorflow"] = tf.__version__
    try:
        import keras

        result["keras"] = keras.__version__
    except ImportError:
        pass
    try:
        build = tf.sysconfig.get_build_info()
    except Exception:  # noqa: BLE001 - build info is optional metadata
        build = {}
    result["cuda"] = build.get("cuda_version") or None
    result["cudnn"] = build.get("cudnn_version") or None
    return result
