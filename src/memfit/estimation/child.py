"""The what-ifs' helper process: estimate `memfit.estimate`'s variants beside the parent.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend.tf_grappler import describe_as
from memfit.backend.tf_kernels import assume_threads
from memfit.estimation.what_ifs import estimate_variant
from memfit.workload.spec import WorkloadSpec


def open_what_if_estimator(
    workload: dict[str, Any],
    batch_size: int,
    threads: list[int],
    gpus: bool = False,
    path: list[str] | None = None,
) -> Callable[..., dict[str, Any]]:
    """Return `estimate(**variant)` for `memfit.estimate`'s what-ifs (see its `helper`).

    Each call builds the workload (`WorkloadSpec.to_json`) with the variant's fields
    replaced (`precision`, `remat`, `optimizer`, `input_shape`), traces and replays its step
    at `batch_size` as the parent would, under the parent's thread counts (`threads`:
    inter-op, intra-op) and grappler passes (`gpus`: whether the parent sees a GPU; this
    process runs with them hidden), and returns the what-if row's figures
    (`estimation.what_if_figures`). `path`: the parent's `sys.path`, so that a factory
    importable there is importable here.
    """
    for entry in path or []:
        if entry not in sys.path:
            sys.path.append(entry)

    describe_as(gpus=gpus)
    tfb.import_keras()  # now, while the parent traces its own step
    spec = WorkloadSpec.from_json(workload)
    inter, intra = threads

    def estimate(**variant: Any) -> dict[str, Any]:
        with assume_threads(inter, intra):
            return estimate_variant(spec, int(batch_size), variant)

    return estimate
