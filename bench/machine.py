"""What a benchmark ran on: recorded in every benchmark's JSON beside its figures."""

from __future__ import annotations

import os
import platform
from typing import Any

ALLOCATOR_VARIABLES = (
    "TF_CPU_ALLOCATOR_USE_BFC",
    "TF_CPU_BFC_MEM_LIMIT_IN_MB",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "MEMFIT_MEMORY",
)


def describe(allocator: str | None = None) -> dict[str, Any]:
    """This machine, Python, TensorFlow/Keras versions and the allocator settings.

    Args:
        allocator: how the benchmark sets the allocator up where its children do it (the
            environment variables of this process are recorded as well).

    Example:
        >>> describe("CPU BFC capped at the budget")["cpus"] >= 1
        True
    """
    from memfit.backend import tf as tfb

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "python": platform.python_version(),
        **tfb.versions(),
        "allocator": allocator,
        "allocator_environment": {k: os.environ.get(k) for k in ALLOCATOR_VARIABLES},
    }
