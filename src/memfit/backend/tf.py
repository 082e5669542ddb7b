"""TensorFlow internals: import checks, device setup, allocator limits and statistics.

This is the only memfit module that calls TensorFlow's private or device-level APIs. TensorFlow
itself is imported lazily, so that `import memfit` and the CLI's argument checks work (and fail
clearly) without it.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from memfit.errors import BackendMissingError, MeasurementError

INSTALL_HINT = (
    'install memfit with TensorFlow: pip install "memfit[cpu]" on a CPU-only machine, '
    'or pip install "memfit[gpu]" on a machine with an NVIDIA GPU'
)

# Environment variables TensorFlow reads when it creates its CPU allocator (first op) or
# loads its kernels (import). See DESIGN.md, "Facts we build on".
ENV_CPU_BFC = "TF_CPU_ALLOCATOR_USE_BFC"
ENV_CPU_BFC_LIMIT_MB = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
ENV_ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
ENV_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
MIB = 1024 * 1024


def _quiet_logs() -> None:
    # TensorFlow prints several lines of C++ INFO logs on import; keep warnings and errors.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")


# Lines TensorFlow's C++ libraries print on import before their logging reads
# TF_CPP_MIN_LOG_LEVEL (absl's notice, once per library, and oneDNN's INFO line): seen with
# TF 2.21 on an AVX-512 CPU, where they came before every one-line error of the CLI.
_IMPORT_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|\] oneDNN custom operations are on\."
)


def import_tf() -> ModuleType:
    """Import TensorFlow, or raise a `BackendMissingError` that says what to install.

    The first import drops the INFO lines TensorFlow prints before its logging reads
    `TF_CPP_MIN_LOG_LEVEL` (when that hides INFO, memfit's default); other output passes.
    """
    _quiet_logs()
    try:
        if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") == "0":
            import tensorflow as tf
        else:
            tf = _import_filtering_noise()
    except ImportError as exc:
        raise BackendMissingError(f"TensorFlow is not installed ({exc}); {INSTALL_HINT}") from None
    return tf


def _import_filtering_noise() -> ModuleType:
    """`import tensorflow` with file descriptor 2 captured, and written back without the
    known import-time INFO lines."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (embedded interpreters)
        import tensorflow as tf

        return tf
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow as tf
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            kept = [line for line in text.splitlines(True) if not _IMPORT_NOISE.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
    return tf


def import_keras() -> ModuleType:
    """Import Keras 3 on the TensorFlow backend, or raise a `BackendMissingError`."""
    import_tf()
    try:
        import keras
    except ImportError as exc:
        raise BackendMissingError(f"Keras is not installed ({exc}); {INSTALL_HINT}") from None
    if not hasattr(keras, "RematScope") and not keras.__version__.startswith("3"):
        raise BackendMissingError(
            f"memfit needs Keras 3, found Keras {keras.__version__}; pip install -U keras"
        )
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise BackendMissingError(
            f"Keras is using the {backend!r} backend; memfit measures TensorFlow. "
            f"Set KERAS_BACKEND=tensorflow before importing keras"
        )
    return keras


def is_imported() -> bool:
    """Whether TensorFlow has been imported in this process."""
    return "tensorflow" in sys.modules


def is_initialized() -> bool:
    """Whether TensorFlow has created its runtime devices (after which limits are fixed)."""
    if not is_imported():
        return False
    try:
        from tensorflow.python.eager import context
    except ImportError:  # pragma: no cover - a TensorFlow without this module
        return False
    ctx = context.context()
    return bool(getattr(ctx, "_initialized", False) or getattr(ctx, "_context_handle", None))


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
    var = getattr(variable, "value", variable)  # the tf.Variable behind a Keras variable
    if tf.DeviceSpec.from_string(var.device).device_type == "GPU":
        # There the assign itself copies the host value onto the variable's device.
        var.assign(value, read_value=False)
        return
    with tf.device(var.device):
        tensor = tf.raw_ops.DeepCopy(x=tf.convert_to_tensor(value, dtype=var.dtype))
    var.assign(tensor, read_value=False)


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


def is_oom(exc: BaseException) -> bool:
    """Whether `exc` is TensorFlow's out-of-memory error (`ResourceExhaustedError`)."""
    if not is_imported():
        return False
    tf = sys.modules["tensorflow"]
    return isinstance(exc, tf.errors.ResourceExhaustedError)


def oom_summary(exc: BaseException) -> str:
    """The first informative line of a TensorFlow OOM message (which allocation failed)."""
    text = getattr(exc, "message", None) or str(exc)
    for line in text.splitlines():
        if "OOM when allocating" in line or "Out of memory" in line.lower():
            return line.strip()[:300]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first[:300]


def versions() -> dict[str, str | None]:
    """TensorFlow, Keras, and the CUDA/cuDNN versions TensorFlow was built with."""
    result: dict[str, str | None] = {"tensorflow": None, "keras": None, "cuda": None, "cudnn": None}
    try:
        tf = import_tf()
    except BackendMissingError:
        return result
    result["tensorflow"] = tf.__version__
    try:
        import keras

        result["keras"] = keras.__version__
    except ImportError:
        pass
    try:
        build = tf.sysconfig.get_build_info()
    except Exception:  # noqa: BLE001 - build info is optional metadata
        build = {}
    result["cuda"] = build.get("cuda_version") or None
    result["cudnn"] = build.get("cudnn_version") or None
    return result


def traced_functions(fn: Any, depth: int = 4) -> list[Any]:
    """The `tf.function`s a (Keras) train function calls, found through its closures.

    Keras 3 builds `model.train_function` as a Python closure over `tf.function`s (wrapped
    with `functools.wraps`); their tracing counts say how often the step was retraced.
    """
    found: list[Any] = []
    seen: set[int] = set()

    def visit(obj: Any, level: int) -> None:
        if obj is None or id(obj) in seen or level > depth:
            return
        seen.add(id(obj))
        if hasattr(obj, "experimental_get_tracing_count"):
            found.append(obj)
            return
        visit(getattr(obj, "__wrapped__", None), level + 1)
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(value):
                visit(value, level + 1)

    visit(fn, 0)
    return found


def tracing_count(functions: list[Any]) -> int:
    """How many times these `tf.function`s have been traced, together."""
    return sum(int(f.experimental_get_tracing_count()) for f in functions)


class ScalarWriter:
    """TensorBoard scalars written to one log folder, a whole series per call.

    `tf.summary.scalar` needs the `tensorboard` package; this writes the same records (scalar
    tensors tagged for TensorBoard's scalars plugin) with TensorFlow alone. One eager
    `tf.summary.write` costs ~0.6 ms, which per step and per series would be several times a
    small model's step; here each series goes through one compiled loop instead.

    Args:
        log_dir: the folder TensorBoard reads (created when missing).
    """

    def __init__(self, log_dir: str) -> None:
        tf = import_tf()
        self._writer = tf.summary.create_file_writer(log_dir)
        metadata = tf.compat.v1.SummaryMetadata(
            plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
        ).SerializeToString()
        writer = self._writer

        @tf.function(
            input_signature=[
                tf.TensorSpec([], tf.string),
                tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.float32),
            ]
        )
        def series(tag: Any, steps: Any, values: Any) -> None:
            with writer.as_default():
                for i in tf.range(tf.shape(values)[0]):
                    tf.summary.write(tag, values[i], step=steps[i], metadata=metadata)

        self._series = series

    def write(self, tag: str, steps: list[int], values: list[float]) -> None:
        """Write `values` of `tag` at `steps` (one record each)."""
        if steps:
            self._series(tag, steps, values)

    def flush(self) -> None:
        """Push what was written to disk."""
        self._writer.flush()


# TensorFlow's BFC allocator waits this long for memory to be returned before it refuses an
# allocation (`kMaxMillisToWait` in bfc_allocator.cc); the CPU allocator has no switch for it.
ALLOCATOR_RETRY_SECONDS = 10.0


def allocator_stall_detectable(device: str) -> bool:
    """Whether `AllocatorStallWatch` can tell an allocation waiting for memory on `device`.

    Only for a step on the CPU (a GPU step leaves the CPU threads asleep while kernels run)
    on Linux (thread states come from /proc).
    """
    return device.upper().startswith("CPU") and os.path.isdir("/proc/self/task")


class AllocatorStallWatch:
    """Notices a CPU step stalled in TensorFlow's allocator retry, seconds before its OOM.

    When the BFC allocator cannot serve a request it waits up to 10 s for another thread to
    return memory, then raises `ResourceExhaustedError`. If meanwhile no thread of the process
    runs, nothing can return memory and the OOM is certain. This watch samples the process's
    threads (other than its own) every `interval` seconds; when none has been running or in
    disk wait and none has used CPU time for `window` seconds while `pressed()` holds, it
    calls `on_stall` once. Use it only around work that computes on the CPU without pauses
    (a training step), with `allocator_stall_detectable`.

    A process also goes quiet without waiting for memory: tearing down a step's `tf.data`
    iterator and function after 20 steps sat idle for over 1.5 s (MobileNetV2 96 px under
    500 MiB, TF 2.21, with 43 MiB in use), which without `pressed` was answered as an OOM of
    a step that had fitted. Pass `pressed` to count only quiet spells with the allocator near
    its limit.

    Args:
        on_stall: called from the watch's thread when the stall is seen (it may end the
            process).
        window: seconds of a fully idle process that count as a stall.
        interval: seconds between samples.
        pressed: whether memory is short enough now for a quiet spell to be an allocation
            waiting for memory (checked only when the process is quiet); default always.

    Example:
        ```python
        with AllocatorStallWatch(lambda: report_oom_and_exit()):
            step(batch)
        ```
    """

    def __init__(
        self,
        on_stall: Callable[[], None],
        window: float = 1.5,
        interval: float = 0.1,
        pressed: Callable[[], bool] | None = None,
    ) -> None:
        self.on_stall, self.window, self.interval = on_stall, window, interval
        self.pressed = pressed or (lambda: True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memfit-stall-watch", daemon=True)
        self.stalled = False

    def __enter__(self) -> AllocatorStallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        own = str(threading.get_native_id())
        quiet_since: float | None = None
        last_cpu: int | None = None
        while not self._stop.wait(self.interval):
            busy, cpu = _threads_busy(own)
            now = time.monotonic()
            if busy or last_cpu is None or cpu != last_cpu or not self.pressed():
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= self.window:
                self.stalled = True
                self.on_stall()
                return
            last_cpu = cpu


def _threads_busy(exclude: str) -> tuple[bool, int]:
    """Whether any thread of this process but `exclude` runs (or waits on disk), and the
    CPU ticks they used."""
    busy, ticks = False, 0
    for tid in os.listdir("/proc/self/task"):
        if tid == exclude:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as handle:
                stat = handle.read()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        busy = busy or fields[0] in ("R", "D")
        ticks += int(fields[11]) + int(fields[12])
    return busy, ticks


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


def dataset_graph(dataset: Any) -> Any:
    """The `GraphDef` a `tf.data.Dataset` is built from (its ops and the functions it maps).

    Uses `Dataset._as_serialized_graph()`, a private TensorFlow API (stable since TF 2.3);
    raises `MeasurementError` when this TensorFlow no longer has it.
    """
    tf = import_tf()
    serialize = getattr(dataset, "_as_serialized_graph", None)
    if serialize is None:
        raise MeasurementError(
            f"this TensorFlow ({tf.__version__}) cannot serialise a tf.data graph; "
            f"memfit data audit needs TensorFlow 2.3 or later"
        )
    return tf.compat.v1.GraphDef.FromString(serialize().numpy())
