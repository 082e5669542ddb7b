"""An input-bound pipeline: waiting for the next batch takes a large share of each step."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from memfit.watch.findings import PIPELINE_FIX, WatchFinding

# Waiting less than this per step is not worth a finding (taking a batch eagerly costs
# ~0.3-1 ms of Python even from a prefetched pipeline).
MIN_INPUT_WAIT_SECONDS = 0.005


def input_bound(
    steps: Sequence[dict[str, Any]],
    step: int,
    *,
    warmup_steps: int = 5,
    fraction: float = 0.25,
    min_wait_seconds: float = MIN_INPUT_WAIT_SECONDS,
) -> WatchFinding | None:
    """`input_bound` when waiting for the next batch takes `fraction` of recent steps.

    Steps that traced the train function again are left out (slow for another reason).

    Args:
        steps: the step records so far.
        step: the current step.
        warmup_steps: steps at the start to leave out.
        fraction: share of step time spent waiting that makes a finding.
        min_wait_seconds: and at least this wait a step.
    """
    recent = [
        s
        for s in steps[-60:]
        if s["step"] >= warmup_steps and s.get("input_wait_seconds") is not None
    ]
    recent = [
        s
        for i, s in enumerate(recent)
        if i == 0 or s.get("traces") is None or s["traces"] == recent[i - 1].get("traces")
    ]
    if len(recent) < 20:
        return None
    wait = sum(s["input_wait_seconds"] for s in recent)
    total = sum(s["step_seconds"] for s in recent)
    if total <= 0:
        return None
    share = wait / total
    mean_wait = wait / len(recent)
    if share < fraction or mean_wait < min_wait_seconds:
        return None
    # The pipeline makes a batch a step (wait + compute); N workers make N in that time, so
    # N = step / compute of them keep up with the model.
    workers = max(2, math.ceil(1 / max(1 - share, 1e-6) - 1e-9))
    return WatchFinding(
        "input_bound",
        step,
        None,
        f"{100 * share:.0f}% of each step is spent waiting for the next batch "
        f"({1000 * mean_wait:.1f} ms of {1000 * total / len(recent):.1f} ms); the device "
        f"idles meanwhile",
        cause=(
            "the input pipeline produces batches slower than the model consumes them: a "
            "`map` without `num_parallel_calls`, no `prefetch`, Python in the pipeline, "
            "or data read from slow storage on every epoch"
        ),
        fix=(
            f"{PIPELINE_FIX}; or run the pipeline on {workers} tf.data service workers "
            f"(`memfit.fit(..., data_service={workers})`, or a dispatcher's address for "
            f"workers on other machines): a step takes {1000 * total / len(recent):.1f} ms "
            f"with its wait, {1000 * (total - wait) / len(recent):.1f} ms without"
        ),
        evidence={
            "data_service_workers": workers,
            "input_wait_fraction": round(share, 4),
            "input_wait_seconds": round(mean_wait, 6),
            "step_seconds": round(total / len(recent), 6),
            "steps": len(recent),
        },
    )
