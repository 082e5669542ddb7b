"""TensorFlow's profiler: the allocator's own record of every allocation during a step.

With TensorFlow's BFC allocator (a GPU's, or the CPU's under `TF_CPU_ALLOCATOR_USE_BFC=true`,
which memfit's emulation sets) the profiler records a `MemoryAllocation` or
`MemoryDeallocation` event for each allocator call: the op that asked (`tf_op`), the chunk's
address and size, the bytes in use after the call, the tensor's shape and dtype, and whether
it was an op's output or a kernel's scratch (`region_type`). `record_allocations` runs a
callable under the profiler and returns those events as
`memfit.backend.attribution.AllocationRecord`s,
in the order they were recorded; `memfit.measuring.explain` reconstructs what was alive at the peak.
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import tempfile
from collections.abc import Callable
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend.attribution import AllocationRecord, StepInfo, VariableInfo
from memfit.backend.tf_layers import layer_tree, variable_owners
from memfit.errors import MeasurementError

_ALLOC = "MemoryAllocation"
_FREE = "MemoryDeallocation"
_HINT = (
    "--explain reads TensorFlow's own memory profile of the step, which needs TensorFlow's "
    "profiler and its BFC allocator: on a CPU give a budget (--memory SIZE or --device CARD, "
    "or memfit.emulate), on a GPU use TensorFlow's default allocator"
)


class ExplainUnavailableError(MeasurementError):
    """What was alive at the peak cannot be read here: no profiler, or no allocation events."""


def _xplane_pb2() -> Any:
    """TensorFlow's XSpace protobuf module (its location moved between releases)."""
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        try:
            from tensorflow.tsl.profiler.protobuf import xplane_pb2  # type: ignore[no-redef]
        except ImportError as exc:
            raise ExplainUnavailableError(
                f"TensorFlow's profiler protobufs cannot be imported ({exc}); {_HINT}"
            ) from None
    return xplane_pb2


def _profiler() -> Any:
    tf = tfb.import_tf()
    try:
        profiler = tf.profiler.experimental
        profiler.start, profiler.stop  # noqa: B018 - both must exist
    except AttributeError as exc:
        raise ExplainUnavailableError(
            f"this TensorFlow has no profiler (tf.profiler.experimental: {exc}); {_HINT}"
        ) from None
    return profiler


class AllocationRecorder:
    """TensorFlow's profiler over some steps; the allocator's records of `device` after.

    `start()` before the work, `stop()` after it (returns the records); `close()` (in a
    `finally`) stops a profiler left running by an error.

    Args:
        device: the TensorFlow device whose allocator to read (`"CPU:0"`, `"GPU:0"`).

    Example:
        ```python
        recorder = AllocationRecorder("CPU:0")
        recorder.start()
        step(batch)
        records = recorder.stop()
        ```
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self._pb2 = _xplane_pb2()
        self._profiler = _profiler()
        self._logdir: tempfile.TemporaryDirectory[str] | None = None

    def start(self) -> None:
        """Start TensorFlow's profiler (raises `ExplainUnavailableError` if it will not)."""
        self._logdir = tempfile.TemporaryDirectory(prefix="memfit-profile-")
        try:
            self._profiler.start(self._logdir.name)
        except Exception as exc:  # noqa: BLE001 - any refusal means "no profile here"
            self.close()
            raise ExplainUnavailableError(
                f"TensorFlow's profiler did not start ({type(exc).__name__}: {exc}); {_HINT}"
            ) from None

    def stop(self) -> list[AllocationRecord]:
        """Stop the profiler; the allocation records of `device`'s allocator, as stored.

        Raises:
            ExplainUnavailableError: the profiler wrote nothing, or no allocation on
                `device` (its allocator is not a BFC allocator).
        """
        assert self._logdir is not None, "start() first"
        logdir = self._logdir.name
        try:
            self._profiler.stop()
            pattern = os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")
            files = sorted(glob.glob(pattern))
            if not files:
                raise ExplainUnavailableError(f"TensorFlow's profiler wrote no profile; {_HINT}")
            space = self._pb2.XSpace()
            with open(files[-1], "rb") as handle:
                space.ParseFromString(handle.read())
        finally:
            self._logdir.cleanup()
            self._logdir = None
        records = _records(space)
        chosen = _allocator_records(records, self.device)
        if not chosen:
            found = sorted({r.allocator for r in records})
            raise ExplainUnavailableError(
                f"TensorFlow's profile of the step holds no allocation on {self.device}'s "
                f"allocator" + (f" (only on {', '.join(found)})" if found else "") + f"; {_HINT}"
            )
        return chosen

    def close(self) -> None:
        """Stop a profiler still running and remove its files (after an error)."""
        if self._logdir is None:
            return
        with contextlib.suppress(Exception):  # it was not running
            self._profiler.stop()
        self._logdir.cleanup()
        self._logdir = None


def record_allocations(run: Callable[[], Any], device: str) -> list[AllocationRecord]:
    """Run `run()` under TensorFlow's profiler; the allocator records of `device`.

    Args:
        run: the work to profile (one training step); its result is discarded.
        device: the TensorFlow device whose allocator to read (`"CPU:0"`, `"GPU:0"`).

    Returns:
        The allocation and deallocation records, in the order the profiler stored them
        (`memfit.measuring.explain.allocator_order` puts them in the allocator's order).

    Raises:
        ExplainUnavailableError: the profiler or its protobufs are missing, or it recorded no
            allocation on `device` (the allocator is not a BFC allocator).

    Example:
        ```python
        records = record_allocations(lambda: step(batch), "CPU:0")
        ```
    """
    recorder = AllocationRecorder(device)
    recorder.start()
    try:
        run()
        return recorder.stop()
    finally:
        recorder.close()


def _allocator_records(records: list[AllocationRecord], device: str) -> list[AllocationRecord]:
    """The records of the allocator that serves `device` (its BFC allocator)."""
    kind = device.split(":")[0].upper()
    index = device.split(":")[-1] if ":" in device else "0"
    if kind == "GPU":
        wanted = {f"GPU_{index}_bfc"}
        return [r for r in records if r.allocator in wanted]
    # The CPU's BFC allocator ("bfc_cpu_allocator_for_gpu" in TF 2.21); not a GPU's, nor the
    # pinned host allocator a GPU uses.
    names: dict[str, int] = {}
    for r in records:
        if r.allocator.startswith("GPU_") or "host" in r.allocator.lower():
            continue
        names[r.allocator] = names.get(r.allocator, 0) + 1
    if not names:
        return []
    busiest = max(names, key=lambda n: names[n])
    return [r for r in records if r.allocator == busiest]


def _records(space: Any) -> list[AllocationRecord]:
    """Every MemoryAllocation / MemoryDeallocation event of every plane, as records."""
    records: list[AllocationRecord] = []
    for plane in space.planes:
        kinds = {
            key: ("alloc" if meta.name == _ALLOC else "free")
            for key, meta in plane.event_metadata.items()
            if meta.name in (_ALLOC, _FREE)
        }
        if not kinds:
            continue
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        for line in plane.lines:
            base_ps = int(line.timestamp_ns) * 1000
            for event in line.events:
                kind = kinds.get(event.metadata_id)
                if kind is None:
                    continue
                stats: dict[str, Any] = {}
                for stat in event.stats:
                    field = stat.WhichOneof("value")
                    if field is None:
                        continue
                    value = getattr(stat, field)
                    if field == "ref_value":
                        value = stat_names.get(value, "")
                    stats[stat_names.get(stat.metadata_id, "")] = value
                records.append(_record(kind, base_ps + int(event.offset_ps), stats))
    return records


def _record(kind: str, time_ps: int, stats: dict[str, Any]) -> AllocationRecord:
    shape = stats.get("shape", stats.get("tensor_shape"))
    return AllocationRecord(
        event=kind,
        time_ps=time_ps,
        addr=int(stats.get("addr", 0)),
        nbytes=int(stats.get("allocation_bytes", 0)),
        requested_bytes=int(stats.get("requested_bytes", 0)),
        in_use_bytes=int(stats.get("bytes_allocated", 0)),
        op=str(stats.get("tf_op", "") or ""),
        region=str(stats.get("region_type", "") or ""),
        dtype=_dtype_name(stats.get("data_type")),
        shape=_shape(shape),
        allocator=str(stats.get("allocator_name", "") or ""),
    )


def _dtype_name(value: Any) -> str:
    """A DataType enum number as its name (`float32`), or "" when unknown."""
    if value in (None, "", 0):
        return ""
    try:
        tf = tfb.import_tf()
        return str(tf.dtypes.as_dtype(int(value)).name)
    except (TypeError, ValueError):
        return str(value)


def _shape(value: Any) -> list[int] | None:
    if not isinstance(value, str) or not value.startswith("["):
        return None
    inner = value.strip("[]").strip()
    if not inner:
        return []
    try:
        return [int(part) for part in inner.split(",")]
    except ValueError:
        return None


def step_info(workload: Any) -> Any:
    """The model's layers and resident variables, as `memfit.backend.attribution.StepInfo`.

    Each model variable belongs to the innermost layer that holds it, each optimizer slot
    to the layer of the variable it was made for (`memfit.backend.tf_layers`).
    """

    tf = tfb.import_tf()
    model = workload.model
    tree = layer_tree(model)
    owner = variable_owners(model, tree)
    optimizer = model.optimizer
    trainable = {id(v) for v in model.trainable_variables}
    variables: list[VariableInfo] = []
    seen: set[int] = set()

    def add(var: Any, kind: str) -> None:
        if id(var) in seen:
            return
        seen.add(id(var))
        dtype = tf.as_dtype(var.dtype)
        shape = [int(d) for d in var.shape]
        nbytes = int(dtype.size) * math.prod(shape)
        name = str(getattr(var, "path", None) or var.name)
        layer = owner.get(id(var), "")
        variables.append(
            VariableInfo(name, layer, kind, nbytes, shape, dtype.name, id(var) in trainable)
        )

    for var in model.variables:
        add(var, "weights")
    for var in getattr(optimizer, "variables", None) or []:
        add(var, "optimizer_slots" if id(var) in owner else "other_state")
    for var in workload.state_variables():
        add(var, "other_state")
    return StepInfo(
        tree=tree, variables=variables, optimizer_name=str(getattr(optimizer, "name", "") or "")
    )


def check_available() -> None:
    """Raise `ExplainUnavailableError` now when the profiler cannot be used here."""
    _xplane_pb2()
    _profiler()
