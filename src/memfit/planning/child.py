"""The planner's side of a child process: estimate each configuration's step (`open_estimator`).
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable
from typing import Any

from memfit.backend import tf as tfb
from memfit.estimation import estimate_workload
from memfit.recomputation.remat import remat_recompute
from memfit.workload.spec import WorkloadSpec


def open_estimator(workload: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    """Return `estimate(precision, remat, batch_size, micro_batches)` for `memfit.plan`.

    Each call predicts (with `memfit.estimate`, nothing run) the peak of the step
    `memfit.fit` runs for the workload (`WorkloadSpec.to_json`) built under `precision` and
    `remat`: the model's step at the micro-batch size, plus what a micro-batched step holds
    besides (the gradient sums and the rest of the batch). One model is alive at a time: a
    new configuration replaces the last. `estimate(what="device")` answers only the device
    the child trains on.
    """
    keras = tfb.import_keras()
    spec = WorkloadSpec.from_json(workload)
    dataset = spec.load_data()
    built: dict[tuple[str | None, str | None], Any] = {}

    def workload_for(precision: str | None, remat: str | None) -> Any:
        key = (precision, remat)
        if key not in built:
            built.clear()
            keras.backend.clear_session()
            gc.collect()
            variant = dataclasses.replace(
                spec, precision=precision, remat=remat, data=dataset, saved_data=None
            )
            built[key] = variant.workload()
        return built[key]

    def estimate(
        what: str = "estimate",
        precision: str | None = None,
        remat: str | None = None,
        batch_size: int = 1,
        micro_batches: int = 1,
    ) -> dict[str, Any]:
        device = tfb.default_device()
        if what == "device":
            return {"device": device}
        workload = workload_for(precision, remat)
        micro = math.ceil(batch_size / micro_batches)
        result = estimate_workload(workload, micro, recompute=remat_recompute(remat))
        extra = 0
        if micro_batches > 1:
            # Gradient sums, one per trainable variable, and the rest of the batch, which
            # stays in memory while its micro-batches are sliced from it.
            extra = sum(int(math.prod(v.shape)) * 4 for v in workload.model.trainable_variables)
            full, part = (workload.synthetic_batch_bytes(n) for n in (batch_size, micro))
            extra += (full - part) if full is not None and part is not None else 0
        return {
            "device": device,
            "peak_bytes": result.peak_bytes + extra,
            "step_peak_bytes": result.peak_bytes,
            "resident_bytes": result.resident_bytes,
            "extra_bytes": extra,
        }

    return estimate
