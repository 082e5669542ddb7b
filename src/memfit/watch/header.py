"""The header line of a watched fit: its device, budget and configuration, as the log keeps it.

`memfit.Watch` writes one at the start of each fit (see `memfit.watch.log` for the format);
the report shows it as the run's configuration.

Example:
    ```python
    header = run_header(model, params={"epochs": 5, "steps": 100}, run=0, device="GPU:0",
                        memory_stats=True, budget=None, budget_bytes=None)
    ```
"""

from __future__ import annotations

import importlib.metadata
import time
from typing import Any

from memfit.backend import tf as tfb
from memfit.errors import MemfitError
from memfit.watch.log import LOG_FORMAT, TOOL


def estimate_peak_bytes(estimate: Any) -> int | None:
    """The estimated peak a header logs, from `Watch(estimate=...)`; a `MemfitError` if none.

    Args:
        estimate: bytes, or any object with `peak_bytes` (an estimate, a
            `memfit.Measurement`), or None.
    """
    if estimate is None:
        return None
    value = getattr(estimate, "peak_bytes", estimate)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise MemfitError(
            f"estimate must be a number of bytes or have peak_bytes, got {estimate!r}"
        )
    return int(value)


def is_tf_keras(model: Any) -> bool:
    """Whether `model` is a tf_keras (Keras 2) model: a class of its comes from `tf_keras`.

    Args:
        model: any object; nothing is imported to answer.

    Example:
        >>> is_tf_keras(keras.Model())
        False
    """
    return any(c.__module__.split(".")[0] == "tf_keras" for c in type(model).__mro__)


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_header(
    model: Any,
    *,
    params: dict[str, Any],
    run: int,
    device: str,
    memory_stats: bool,
    budget: Any,
    budget_bytes: int | None,
    name: str | None = None,
    estimate_peak_bytes: int | None = None,
    input_wait_measured: bool = False,
    warmup_steps: int = 5,
    steps_per_execution: int = 1,
    guarded: Any = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `header` record of a fit (a dict ready for the log).

    Args:
        model: the Keras model being fitted.
        params: Keras' `callback.params` (`epochs`, `steps`).
        run: which fit of the `Watch` this is (0 for the first).
        device: the device trained on.
        memory_stats: the device gives allocator statistics.
        budget: the `Budget` judged against (its name is logged), or None.
        budget_bytes: the budget in bytes, or None.
        name: the run's name (default: the model's name).
        estimate_peak_bytes: an estimated peak to compare with the measured one.
        input_wait_measured: the train function is wrapped to time the input wait.
        warmup_steps: steps the detectors ignore at the start.
        steps_per_execution: the model's `steps_per_execution`.
        guarded: `memfit.fit`'s step (`train_function.guarded_step`), or None.
        config: more configuration (the learning rate, `Watch(config=...)`); overrides the
            rest of the header's `config`.
    """
    keras = tfb.import_keras()
    versions = tfb.versions()
    legacy = is_tf_keras(model)
    try:
        # tf_keras has a global policy of its own; the model holds it.
        holder = model.dtype_policy if legacy else keras.mixed_precision.dtype_policy()
        policy = holder.name
    except Exception:  # noqa: BLE001
        policy = None
    optimizer = getattr(model, "optimizer", None)
    run_config: dict[str, Any] = {
        "epochs": params.get("epochs"),
        "steps_per_epoch": params.get("steps"),
        "steps_per_execution": steps_per_execution,
        "precision": policy,
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "micro_batches": getattr(guarded, "micro_batches", None),
        "memfit_fit": guarded is not None,
        "parameters": int(model.count_params()) if model.built else None,
    }
    run_config.update(config or {})
    return {
        "type": "header",
        "format": LOG_FORMAT,
        "tool": TOOL,
        "run": run,
        "name": name or getattr(model, "name", None) or "run",
        "model": getattr(model, "name", None),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": device,
        "memory_stats": memory_stats,
        "budget_bytes": budget_bytes,
        "budget_name": str(budget) if budget is not None else None,
        "estimate_peak_bytes": estimate_peak_bytes,
        "input_wait_measured": input_wait_measured,
        "warmup_steps": warmup_steps,
        "tensorflow": versions.get("tensorflow"),
        "keras": versions.get("keras"),
        "tf_keras": _distribution_version("tf_keras") if legacy else None,
        "config": run_config,
    }
