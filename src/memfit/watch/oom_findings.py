"""Out-of-memory findings of `memfit.Watch`: a step that ran out, or one `memfit.fit` recovered.

`detectors.diagnose_oom` says why (what changed from the steps before) and the fix in
numbers; this module turns its diagnosis into the `oom` or `oom_recovery` finding, and
measures how much of the budget other processes took from the GPU since the fit began.

Example:
    ```python
    finding = oom_finding(exc, watch.steps, step, input_shape=[32, 224, 224, 3],
                          budget_bytes=budget, start_budget_bytes=budget, guarded=False)
    ```
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import memfit.watch.detectors as detectors
from memfit.backend import tf as tfb
from memfit.budget import devices
from memfit.errors import one_line
from memfit.estimation import largest_batch
from memfit.watch.findings import WatchFinding


def others_on_gpu(device: str) -> int | None:
    """Bytes other processes hold on `device`'s GPU (NVML), or None off GPU / without NVML.

    Args:
        device: a TensorFlow device name (`"GPU:0"`, `"CPU:0"`).
    """
    if not device.startswith("GPU"):
        return None

    gpus, problem = devices.nvml_gpus()
    index = int(device.split(":")[-1] or 0)
    if problem or index >= len(gpus):
        return None
    mine = os.getpid()
    return sum(p.used_bytes or 0 for p in gpus[index].processes if p.pid != mine)


def budget_left(budget_bytes: int | None, device: str, others_at_start: int | None) -> int | None:
    """The budget less what other processes took on the GPU since the fit began.

    Args:
        budget_bytes: the budget at the start of the fit.
        device: the fit's device.
        others_at_start: `others_on_gpu(device)` when the fit began.
    """
    others = others_on_gpu(device)
    if budget_bytes and others is not None and others_at_start is not None:
        return max(0, budget_bytes - max(0, others - others_at_start))
    return budget_bytes


def estimated_fit(
    model: Any,
    batch: Any,
    batch_size: int,
    budget_bytes: int,
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The largest batch that fits, estimated, for a step that ran out of memory at once.

    With no step before to scale from, the number comes from `memfit.estimate`'s trace of
    the model's step at the failing batch (`memfit.estimation.largest_batch`: its high bound
    against the budget). Nothing is allocated and the model is left as it was.

    Args:
        model: the compiled Keras model whose step ran out of memory.
        batch: the failing batch, as Keras' iterator gave it (its samples give the shapes
            and targets the estimate traces with).
        batch_size: its batch size.
        budget_bytes: the budget to fit.
        on_progress: called with a short text at each phase.

    Returns:
        `{"estimated_batch_size", "estimated_high_bytes", "estimate_seconds"}` (the size 0
        when one sample does not fit), or `{"estimate_error": "..."}` when the step cannot
        be estimated.
    """
    import tensorflow as tf  # heavy, and loaded already: the step that failed ran in it

    started = time.perf_counter()
    try:
        samples = tuple(batch) if isinstance(batch, list) else batch
        data = tf.data.Dataset.from_tensor_slices(samples)
        est = largest_batch(model, batch_size, budget_bytes, data=data, on_progress=on_progress)
    except Exception as exc:  # noqa: BLE001 - no number, then: the finding says why
        return {"estimate_error": one_line(exc)[:300]}
    return {
        "estimated_batch_size": est.batch_size if est is not None else 0,
        "estimated_high_bytes": est.high_bytes if est is not None else None,
        "estimate_seconds": round(time.perf_counter() - started, 2),
    }


def oom_finding(
    exc: BaseException,
    steps: Sequence[dict[str, Any]],
    step: int,
    *,
    input_shape: list[int | None] | None,
    budget_bytes: int | None,
    start_budget_bytes: int | None,
    guarded: bool,
    peak_bytes: int | None = None,
    estimated: dict[str, Any] | None = None,
) -> WatchFinding:
    """The `oom` finding of a step that ran out of memory (and was not recovered).

    Args:
        exc: TensorFlow's out-of-memory error.
        steps: the fit's step records before the failed step.
        step: the failed step.
        input_shape: the shape of its batch's first input.
        budget_bytes: the budget when it failed.
        start_budget_bytes: the budget when the fit began.
        guarded: the step was `memfit.fit`'s (it could not split the batch further).
        peak_bytes: the device's peak when it failed, if measured.
        estimated: for a first step, what fits by the estimate (`estimated_fit`).
    """
    diagnosis = detectors.diagnose_oom(
        steps,
        input_shape=input_shape,
        batch_size=input_shape[0] if input_shape else None,
        budget_bytes=budget_bytes,
        start_budget_bytes=start_budget_bytes,
        guarded=guarded,
        estimated=estimated,
    )
    where = (
        "memfit.fit could not split the step further (one sample per micro-batch)"
        if guarded
        else "the step"
    )
    return WatchFinding(
        kind="oom",
        step=step,
        epoch=None,
        message=(
            f"{where} ran out of memory on a {detectors.shape_text(input_shape)} batch "
            f"({tfb.oom_summary(exc)})"
        ),
        cause=diagnosis.text,
        fix=diagnosis.fix,
        evidence={**diagnosis.evidence, "peak_bytes": peak_bytes},
        severity="problem",
    )


def recovery_finding(
    recovery: Any,
    steps: Sequence[dict[str, Any]],
    step: int,
    *,
    budget_bytes: int | None,
    start_budget_bytes: int | None,
    fitted_micro_batches: int | None = None,
) -> WatchFinding:
    """The `oom_recovery` finding of an out-of-memory error `memfit.fit` recovered from.

    Args:
        recovery: the recovery, as `memfit.fit`'s step summary records it (`phase`,
            `input_shapes`, `old_micro_batches`, `new_micro_batches`, ...).
        steps: the fit's step records before the step that recovered.
        step: the step that recovered.
        budget_bytes: the budget now.
        start_budget_bytes: the budget when the fit began.
        fitted_micro_batches: the micro-batches the step then completed with (its last
            recovery's; default: this one's).
    """
    shape = list(recovery.input_shapes[0]) if recovery.input_shapes else None
    diagnosis = detectors.diagnose_oom(
        steps,
        input_shape=shape,
        batch_size=shape[0] if shape else None,
        budget_bytes=budget_bytes,
        start_budget_bytes=start_budget_bytes,
        guarded=True,
    )
    fix = diagnosis.fix
    new = fitted_micro_batches or recovery.new_micro_batches
    if not steps and new and shape and isinstance(shape[0], int):
        # No step before to scale from: the retry itself measured what fits.
        fix = (
            f"nothing is lost: memfit.fit went on with {new} micro-batches of "
            f"{math.ceil(shape[0] / new)}, which fit; pass micro_batches={new} to start "
            f"there without the retry"
        )
    return WatchFinding(
        kind="oom_recovery",
        step=step,
        epoch=None,
        message=f"memfit.fit recovered from an out-of-memory error: {recovery}",
        cause=(
            f"the {recovery.phase} of a step with {recovery.old_micro_batches} "
            f"micro-batch(es) needed more memory than the device had: {diagnosis.text}"
        ),
        fix=fix,
        evidence={
            **diagnosis.evidence,
            "update": recovery.update,
            "phase": recovery.phase,
            "old_micro_batches": recovery.old_micro_batches,
            "new_micro_batches": recovery.new_micro_batches,
            "peak_bytes": recovery.peak_bytes,
            "recovery_seconds": round(recovery.seconds, 4),
        },
    )
