"""Measure in a fresh child process: the measurement side of memfit's child processes.

`memfit._runner` starts, feeds and reads the child; this module says what travels to it for
a measurement (named optimizer, loss and data; a saved model; a recompute policy) and turns
what comes back into a `Measurement`.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from memfit._runner import run_in_child
from memfit.budget import Budget
from memfit.errors import WorkloadError
from memfit.measurement import Measurement


def measure_in_child(
    model: Any,
    batch_size: int,
    *,
    data: Any,
    input_shape: Any,
    optimizer: Any,
    loss: Any,
    repeats: int,
    budget: Budget | None,
    worst_case: bool = False,
    micro_batches: int = 1,
    precision: str | None = None,
    remat: str | None = None,
    classes: int | None = None,
    safe_mode: bool = True,
    recompute: Any = None,
    explain: bool = False,
) -> Measurement:
    """`memfit.measure(..., isolated=True)`: the measurement made in a fresh child process.

    `precision` (a Keras dtype policy) and `remat` (a `keras.RematScope` mode) are set in the
    child before the model is built, for MODEL strings that build it (factories, built-ins).
    `classes` (a built-in's classes) and `safe_mode` (False loads a trusted `.keras` file
    with Lambda layers) reach the child's `load_model`.
    """
    from memfit.workload import shape_list

    check_child_arguments(optimizer, loss, data)
    with tempfile.TemporaryDirectory(prefix="memfit-model-") as tmp:
        spec = model if isinstance(model, str) else save_for_child(model, tmp)
        result = run_in_child(
            "memfit._child:measure_spec",
            {
                "spec": spec,
                "batch_size": int(batch_size),
                "data": data,
                "input_shape": [list(s) for s in shape_list(input_shape)] if input_shape else None,
                "optimizer": optimizer,
                "loss": loss,
                "repeats": repeats,
                "worst_case": worst_case,
                "micro_batches": micro_batches,
                "precision": precision,
                "remat": remat,
                "classes": classes,
                "safe_mode": bool(safe_mode),
                **({"recompute": _recompute_option(recompute)} if recompute else {}),
                "explain": bool(explain),
            },
            budget=budget,
        )
    return measurement_from_child(result, int(batch_size), budget)


def check_child_arguments(optimizer: Any, loss: Any, data: Any) -> None:
    """What travels to a child process must be named: optimizer, loss and data as strings."""
    for name, value in (("optimizer", optimizer), ("loss", loss)):
        if value is not None and not isinstance(value, str):
            raise WorkloadError(f"with isolated=True, {name} must be given by name (a string)")
    if data is not None and not isinstance(data, str):
        raise WorkloadError(
            "with isolated=True, data must be a 'package.module:dataset_fn' string that the "
            "child process can import"
        )


def measurement_from_child(
    result: dict[str, Any], batch_size: int, budget: Budget | None
) -> Measurement:
    """A `Measurement` from what a child returned (or from its log, when it hung after OOM)."""
    if result.get("hung_after_oom"):
        return Measurement(
            batch_size=int(batch_size),
            device="GPU:0" if os.environ.get("MEMFIT_EMULATED_ON") == "GPU" else "CPU:0",
            oom=True,
            peak_bytes=result["max_in_use_bytes"],
            resident_bytes=result["resident_bytes"] or 0,
            step_seconds=None,
            oom_message=(result["oom_message"] or "OOM")
            + (
                " (TensorFlow would raise the OOM after its 10 s allocator retry; the child "
                "answered at once)"
                if result.get("allocator_stall")
                else " (TensorFlow kept retrying refused allocations, 10 s each; the child "
                "process was stopped)"
            ),
            budget=budget,
        )
    budget_data = result.pop("budget", None)
    for key in list(result):
        if key not in Measurement.__dataclass_fields__:
            result.pop(key)
    measurement = Measurement(**result)
    if measurement.explanation is not None:
        from memfit.explain import Explanation

        measurement.explanation = Explanation.from_dict(measurement.explanation)
    measurement.budget = (
        Budget(**{**budget_data, "notes": tuple(budget_data["notes"])}) if budget_data else budget
    )
    return measurement


def save_for_child(model: Any, folder: str) -> str:
    """Save a Keras model in `folder` for a child process to load; the `.keras` file's path."""
    path = os.path.join(folder, "model.keras")
    try:
        model.save(path)
    except Exception as exc:  # noqa: BLE001 - any save failure means "cannot isolate this"
        raise WorkloadError(
            f"isolated=True needs a model the child process can rebuild, but saving it failed "
            f"({type(exc).__name__}: {exc}); give a MODEL string (.keras file or "
            f"package.module:factory) instead"
        ) from None
    return path


def _recompute_option(recompute: Any) -> Any:
    """A `recompute=` policy a child process can take: a name, count, size or layer names."""
    if recompute is True:
        return "sqrt"
    if isinstance(recompute, (str, int)):
        return recompute
    if isinstance(recompute, (list, tuple)) and all(isinstance(n, str) for n in recompute):
        return list(recompute)
    raise WorkloadError(
        "with isolated=True, recompute must be a policy ('sqrt', a count, a size or layer "
        "names), not a Recompute object"
    )
