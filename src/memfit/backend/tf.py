"""TensorFlow internals: import checks, device setup, allocator limits and statistics.

The one name the rest of memfit uses for TensorFlow (`from memfit.backend import tf as tfb`,
then `tfb.import_tf()`, `tfb.memory_info(device)`, ...). The helpers live in a module per
concept and are re-exported here:

- `memfit.backend.tf_import`: importing TensorFlow and Keras, versions;
- `memfit.backend.tf_devices`: devices, allocator limits, memory statistics;
- `memfit.backend.tf_oom`: the out-of-memory error, a step stalled in allocator retry, the
  per-step resources a failed step leaves;
- `memfit.backend.tf_introspect`: a train function's `tf.function`s, a dataset's graph;
- `memfit.backend.tf_summary`: TensorBoard scalars.

Together with the other `memfit.backend.tf_*` modules these are the only memfit modules that
call TensorFlow's private or device-level APIs. TensorFlow itself is imported lazily, so that
`import memfit` and the CLI's argument checks work (and fail clearly) without it.
"""

from __future__ import annotations

from memfit.backend.tf_devices import (
    ENV_CPU_BFC,
    ENV_CPU_BFC_LIMIT_MB,
    ENV_GROWTH,
    ENV_ONEDNN,
    MIB,
    assign_exact,
    cpu_allocator_limit,
    cpu_bfc_enabled,
    default_device,
    device_memory_limit,
    gpu_count,
    gpu_settings,
    hold_on_device,
    memory_info,
    min_system_memory,
    onednn_enabled,
    physical_devices,
    require_memory_stats,
    reserve_cpu_region,
    reset_peak,
    set_cpu_allocator_limit,
    set_gpu_memory_limit,
)
from memfit.backend.tf_import import (
    INSTALL_HINT,
    import_keras,
    import_tf,
    is_imported,
    is_initialized,
    versions,
)
from memfit.backend.tf_introspect import dataset_graph, traced_functions, tracing_count
from memfit.backend.tf_oom import (
    ALLOCATOR_RETRY_SECONDS,
    AllocatorStallWatch,
    allocator_stall_detectable,
    clear_step_resources,
    is_oom,
    oom_summary,
)
from memfit.backend.tf_summary import ScalarWriter

__all__ = [
    "ALLOCATOR_RETRY_SECONDS",
    "ENV_CPU_BFC",
    "ENV_CPU_BFC_LIMIT_MB",
    "ENV_GROWTH",
    "ENV_ONEDNN",
    "INSTALL_HINT",
    "MIB",
    "AllocatorStallWatch",
    "ScalarWriter",
    "allocator_stall_detectable",
    "assign_exact",
    "clear_step_resources",
    "cpu_allocator_limit",
    "cpu_bfc_enabled",
    "dataset_graph",
    "default_device",
    "device_memory_limit",
    "gpu_count",
    "gpu_settings",
    "hold_on_device",
    "import_keras",
    "import_tf",
    "is_imported",
    "is_initialized",
    "is_oom",
    "memory_info",
    "min_system_memory",
    "onednn_enabled",
    "oom_summary",
    "physical_devices",
    "require_memory_stats",
    "reserve_cpu_region",
    "reset_peak",
    "set_cpu_allocator_limit",
    "set_gpu_memory_limit",
    "traced_functions",
    "tracing_count",
    "versions",
]
