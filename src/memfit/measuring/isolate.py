"""Measure in a fresh child process: the measurement side of memfit's child processes.

`memfit.process.runner` starts, feeds and reads the child; this module says what travels to it for
a measurement (a `WorkloadSpec` whose model is a MODEL string or a saved copy; a recompute
policy) and turns what comes back into a `Measurement`.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

from memfit.budget.budget import Budget
from memfit.errors import WorkloadError
from memfit.measuring.child import measure_spec
from memfit.measuring.explain import Explanation
from memfit.measuring.measurement import Measurement
from memfit.process.runner import run_in_child
from memfit.workload.spec import WorkloadSpec


def measure_in_child(
    workload: WorkloadSpec,
    batch_size: int,
    *,
    repeats: int,
    budget: Budget | None,
    model: Any = None,
    micro_batches: int = 1,
    recompute: Any = None,
    explain: bool = False,
) -> Measurement:
    """`memfit.measure` isolated (`Options(isolated=True)`): measured in a fresh child process.

    Args:
        workload: what the child builds and trains, whole (precision, remat, classes,
            safe mode and worst-case sampling included).
        batch_size: samples in the step.
        repeats: measured steps after the warm-up.
        budget: the budget the child emulates.
        model: a Keras model to measure instead of `workload.model` (saved for the child).
        micro_batches, recompute, explain: as in `memfit.measure`.
    """
    with tempfile.TemporaryDirectory(prefix="memfit-model-") as tmp:
        result = run_in_child(
            measure_spec,
            {
                "workload": child_spec(workload, model, tmp).to_json(),
                "batch_size": int(batch_size),
                "repeats": repeats,
                "micro_batches": micro_batches,
                **({"recompute": _recompute_option(recompute)} if recompute else {}),
                "explain": bool(explain),
            },
            budget=budget,
        )
    return measurement_from_child(result, int(batch_size), budget)


def child_spec(workload: WorkloadSpec, model: Any, folder: str) -> WorkloadSpec:
    """The workload as a child process takes it: a Keras `model` given beside it (None: the
    workload's MODEL string) is saved in `folder`, and the spec names the saved file.

    Raises:
        WorkloadError: the model cannot be saved, or the optimizer, loss or data are objects
            a child cannot rebuild.
    """
    if model is not None:
        workload.check_named()  # before the model is saved for nothing
        workload = dataclasses.replace(workload, model=save_for_child(model, folder))
    return workload.for_child()


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
