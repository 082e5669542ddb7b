"""TensorFlow's devices: allocator limits set before start-up, and memory statistics after.

The environment variables and device configuration here are read by TensorFlow once, when it
creates its allocators; `memory_info` and `reset_peak` read its allocators' statistics.
"""

from __future__ import annotations

import os
from typing import Any

from memfit.backend.tf_import import import_tf
from memfit.errors import MeasurementError

# Environment variables TensorFlow reads when it creates its CPU allocator (first op) or
# loads its kernels (import); how memfit uses them: docs/design/allocator.md.
ENV_CPU_BFC = "TF_CPU_ALLOCATOR_USE_BFC"
ENV_CPU_BFC_LIMIT_MB = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
ENV_ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
ENV_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
MIB = 1024 * 1024


def physical_devices(device_type: str | None = None) -> list[Any]:
    """Physical devices TensorFlow sees, without initialising the runtime."""
    tf = import_tf()
    return list(tf.config.list_physical_devices(device_type))


def gpu_count() -> int:
    """Number of GPUs TensorFlow can use (0 with a CPU-only build)."""
    return len(physical_devices("GPU"))


def default_device() -> str:
    """The device a training step runs on by default: `GPU:0` when there is one, else `CPU:0`."""
    return "GPU:0" if gpu_count() else "CPU:0"


def set_cpu_allocator_limit(limit_bytes: int) -> None:
    """Ask for TensorFlow's BFC CPU allocator capped at `limit_bytes`, with oneDNN off.

    Must run before TensorFlow initialises (the allocator reads these variables once). With
    oneDNN on, a kernel whose allocation is refused can crash the process (SIGSEGV) instead of
    raising `ResourceExhaustedError`, so oneDNN is turned off as well.
    """
    os.environ[ENV_CPU_BFC] = "true"
    os.environ[ENV_CPU_BFC_LIMIT_MB] = str(max(1, limit_bytes // (1024 * 1024)))
    os.environ[ENV_ONEDNN] = "0"


def reserve_cpu_region(limit_bytes: int) -> int:
    """Make the capped BFC CPU allocator hold its whole limit as one region, as a GPU does.

    TensorFlow creates the CPU's BFC allocator with memory growth on and no garbage
    collection: it takes regions of doubling size (2, 4, 8 MiB, ...) as training needs them
    and never merges them, so after a few sizes have run the free memory is split between
    regions and what fits depends on what ran before. A GPU's BFC allocator with memory
    growth off (TensorFlow's default) takes its whole limit as one region at first use.

    This reproduces that: one allocation just under the limit, made before anything else,
    makes the allocator's next region span all that is left (the region size doubles until it
    covers the request, then is cut to what the limit allows); freed at once, it leaves one
    free chunk that every later allocation is split from. Only the region's address space is
    reserved (the tensor is never written, so no page is touched); the allocator's handle
    table, 8 bytes per 256-byte granule (1/32 of the limit), is the host memory it costs.

    The allocation runs in a graph-mode session of its own: the eager runtime is not
    initialised, so thread counts and devices can still be configured afterwards. Must run
    before anything else allocates on the CPU (first thing after the limit is set).

    Args:
        limit_bytes: the allocator's limit (`set_cpu_allocator_limit`).

    Returns:
        The bytes of the region reserved (0 when the allocator refused every size tried).
    """
    tf = import_tf()
    limit_mib = max(1, limit_bytes // MIB)
    graph = tf.Graph()
    # TensorFlow's own start-up may already have taken the first 2 MiB region (or a second
    # of 4 MiB): ask for what is left after it. A refused size costs the allocator's 10 s
    # retry, so the likely one comes first.
    for taken in (2, 6):
        size = limit_mib - taken
        if size <= 0:
            return 0
        with graph.as_default():
            # [MiB, 1 MiB]: a flat shape over 2**31 elements does not fit the int32 shape.
            empty = tf.raw_ops.Empty(shape=[size, MIB], dtype=tf.uint8, init=False)
        try:
            with tf.compat.v1.Session(graph=graph) as session:
                session.run(empty.op)
        except tf.errors.ResourceExhaustedError:
            continue
        return size * MIB
    return 0


def cpu_bfc_enabled() -> bool:
    """Whether this process's environment asks for TensorFlow's BFC CPU allocator (the only
    CPU allocator that keeps memory statistics)."""
    return os.environ.get(ENV_CPU_BFC, "").lower() in ("true", "1")


def cpu_allocator_limit() -> int | None:
    """The BFC CPU allocator limit set in this process's environment, in bytes, if any."""
    if not cpu_bfc_enabled():
        return None
    limit = os.environ.get(ENV_CPU_BFC_LIMIT_MB)
    return int(limit) * 1024 * 1024 if limit and limit.isdigit() else None


def onednn_enabled() -> bool:
    """Whether oneDNN optimisations are (probably) on: TensorFlow's default on x86 CPUs."""
    return os.environ.get(ENV_ONEDNN, "1").strip().lower() not in ("0", "false")


def set_gpu_memory_limit(limit_bytes: int) -> list[str]:
    """Cap every visible GPU at `limit_bytes` with one logical device each.

    Returns the names of the GPUs capped. Raises `RuntimeError` from TensorFlow when the runtime
    is already initialised.
    """
    tf = import_tf()
    gpus = tf.config.list_physical_devices("GPU")
    limit_mb = max(1, limit_bytes // MIB)
    for gpu in gpus:
        tf.config.set_logical_device_configuration(
            gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mb)]
        )
    return [gpu.name for gpu in gpus]


def gpu_settings() -> list[dict[str, Any]]:
    """Per GPU: memory growth and logical-device memory limits, read without initialising."""
    tf = import_tf()
    settings = []
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            growth = bool(tf.config.experimental.get_memory_growth(gpu))
        except (ValueError, RuntimeError):
            growth = None
        logical = tf.config.get_logical_device_configuration(gpu) or []
        limits = [
            int(cfg.memory_limit) * 1024 * 1024
            for cfg in logical
            if getattr(cfg, "memory_limit", None) is not None
        ]
        try:
            details = tf.config.experimental.get_device_details(gpu)
        except (ValueError, RuntimeError):
            details = {}
        settings.append(
            {
                "name": gpu.name,
                "device_name": details.get("device_name"),
                "compute_capability": details.get("compute_capability"),
                "memory_growth": growth,
                "memory_limits_bytes": limits,
            }
        )
    return settings


def memory_info(device: str) -> dict[str, int] | None:
    """The allocator's `current` and `peak` bytes on `device`, or None where unavailable.

    On CPU the statistics exist only with the BFC allocator (`set_cpu_allocator_limit`).
    Calling this initialises TensorFlow's runtime.
    """
    tf = import_tf()
    if "CPU" in device.upper() and not cpu_bfc_enabled():
        # Some TensorFlow builds answer for the default CPU allocator too, with zeros: it
        # keeps no statistics (a step "measured" 0 bytes).
        return None
    try:
        info = tf.config.experimental.get_memory_info(device)
    except (ValueError, RuntimeError):
        return None
    return {"current": int(info["current"]), "peak": int(info["peak"])}


def tf_variable(variable: Any) -> Any:
    """The `tf.Variable` behind a Keras 3 variable (its `value`), or `variable` itself.

    A tf_keras (Keras 2) variable is a `tf.Variable` already, whose `value` is a method.

    Example:
        ```python
        handle = tf_variable(model.variables[0]).handle
        ```
    """
    inner = getattr(variable, "value", variable)
    return variable if callable(inner) else inner


def assign_exact(variable: Any, value: Any) -> None:
    """Write `value` (a host array) into `variable` bit for bit, on the variable's allocator.

    A plain `assign` of a NumPy array lets the variable adopt the tensor converted from it,
    and on a CPU device that tensor may live outside the device's allocator (TensorFlow can
    keep the NumPy buffer, or copy it with the process-wide allocator): the variable then
    drops out of the device's statistics and out of an emulated budget. Measured: after a
    dozen plain restores of MobileNetV2's weights and Adam slots, the allocator counted
    26.6 MB in use for 28.4 MB of variables. The value is therefore copied on the variable's
    own device first (`DeepCopy`) and that copy is what the variable adopts. On a GPU the
    assign copies the host value onto the device anyway.

    Args:
        variable: A `tf.Variable`, or a Keras variable (its TensorFlow variable is written).
        value: The saved value, of the variable's shape and dtype.
    """
    tf = import_tf()
    var = tf_variable(variable)
    if tf.DeviceSpec.from_string(var.device).device_type == "GPU":
        # There the assign itself copies the host value onto the variable's device.
        var.assign(value, read_value=False)
        return
    with tf.device(var.device):
        tensor = tf.raw_ops.DeepCopy(x=tf.convert_to_tensor(value, dtype=var.dtype))
    var.assign(tensor, read_value=False)


def hold_on_device(structure: Any) -> Any:
    """`structure` with each tensor on a CPU copied into the CPU's allocator, as a GPU holds it.

    On a GPU a tensor made from a NumPy array is copied onto the device, so a batch counts
    against the card. On a CPU TensorFlow keeps the NumPy buffer, or copies it with the
    process-wide allocator, outside the device's BFC allocator: under an emulated card
    (`memfit.emulate`) the batch a step reads counted nowhere (ResNet50's batch of 32 at 224
    px, 19.3 MB: 0 bytes more in use after `tf.constant` or `Workload.batch`, 19.3 MB after
    `DeepCopy`), where a GPU holds it and `model.fit`'s `tf.data` pipeline allocates it in
    that allocator. Each such tensor is copied there (`DeepCopy`); elsewhere (a GPU, the
    default CPU allocator, which keeps no statistics, a tensor that is not dense or a dtype
    without the kernel) it is returned as is.

    Args:
        structure: tensors, nested as `tf.nest` allows (a batch `(x, y)`).

    Returns:
        The same structure.

    Example:
        ```python
        x, y = hold_on_device((tf.constant(images), tf.constant(labels)))
        ```
    """
    if not cpu_bfc_enabled():
        return structure
    tf = import_tf()

    def held(tensor: Any) -> Any:
        if not isinstance(tensor, tf.Tensor) or not hasattr(tensor, "numpy"):
            return tensor
        if tf.DeviceSpec.from_string(tensor.device or "CPU:0").device_type != "CPU":
            return tensor
        try:
            with tf.device(tensor.device or "CPU:0"):
                return tf.raw_ops.DeepCopy(x=tensor)
        except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError, TypeError):
            return tensor  # no DeepCopy kernel for this dtype here

    return tf.nest.map_structure(held, structure)


def reset_peak(device: str) -> None:
    """Reset the allocator's peak statistic on `device` to its current bytes."""
    tf = import_tf()
    tf.config.experimental.reset_memory_stats(device)


def require_memory_stats(device: str) -> None:
    """Raise a `MeasurementError` that explains why `device` has no memory statistics."""
    if memory_info(device) is not None:
        return
    if device.upper().startswith("CPU"):
        raise MeasurementError(
            "TensorFlow's CPU allocator keeps no memory statistics in this process: TensorFlow "
            "was initialised before memfit could switch on its BFC allocator. Call "
            "memfit.emulate(...) (or set MEMFIT_MEMORY) before building any model or tensor, "
            "or measure with isolated=True"
        )
    raise MeasurementError(f"TensorFlow reports no memory statistics for {device}")


def device_memory_limit(device: str) -> int | None:
    """The bytes TensorFlow's allocator may use on `device` (a GPU's limit), or None.

    Initialises TensorFlow's runtime. On CPU there is no such limit (None) unless the BFC
    allocator was capped (`set_cpu_allocator_limit`).
    """
    if device.upper().startswith("CPU"):
        return cpu_allocator_limit()
    import_tf()
    try:
        from tensorflow.python.client import device_lib

        index = int(device.split(":")[-1]) if ":" in device else 0
        limits = [d.memory_limit for d in device_lib.list_local_devices() if d.device_type == "GPU"]
        return int(limits[index]) if index < len(limits) else None
    except Exception:  # noqa: BLE001 - a limit is optional information
        return None


def min_system_memory(available_bytes: int, compute_capability: tuple[int, int]) -> int:
    """TensorFlow's default GPU reserve (`MinSystemMemory` in gpu_device.cc, TF 2.13+)."""
    mib = 1024 * 1024
    if available_bytes < 2 * 1024**3:
        return 225 * mib
    major = compute_capability[0]
    if major <= 6:
        return 500 * mib
    if major <= 7:
        return 1050 * mib
    if major <= 8:
        return 1536 * mib
    return 1800 * mib
