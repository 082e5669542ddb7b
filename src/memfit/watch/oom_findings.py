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

import os
from collections.abc import Sequence
from typing import Any

import memfit.watch.detectors as detectors
from memfit.backend import tf as tfb
from memfit.watch.findings import WatchFinding


def others_on_gpu(device: str) -> int | None:
    """Bytes other processes hold on `device`'s GPU (NVML), or None off GPU / without NVML.

    Args:
        device: a TensorFlow device name (`"GPU:0"`, `"CPU:0"`).
    """
    if not device.startswith("GPU"):
        return None
    from memfit import devices

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
    """
    diagnosis = detectors.diagnose_oom(
        steps,
        input_shape=input_shape,
        batch_size=input_shape[0] if input_shape else None,
        budget_bytes=budget_bytes,
        start_budget_bytes=start_budget_bytes,
        guarded=guarded,
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
) -> WatchFinding:
    """The `oom_recovery` finding of an out-of-memory error `memfit.fit` recovered from.

    Args:
        recovery: the recovery, as `memfit.fit`'s step summary records it (`phase`,
            `input_shapes`, `old_micro_batches`, `new_micro_batches`, ...).
        steps: the fit's step records before the step that recovered.
        step: the step that recovered.
        budget_bytes: the budget now.
        start_budget_bytes: the budget when the fit began.
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
    return WatchFinding(
        kind="oom_recovery",
        step=step,
        epoch=None,
        message=f"memfit.fit recovered from an out-of-memory error: {recovery}",
        cause=(
            f"the {recovery.phase} of a step with {recovery.old_micro_batches} "
            f"micro-batch(es) needed more memory than the device had: {diagnosis.text}"
        ),
        fix=diagnosis.fix,
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
