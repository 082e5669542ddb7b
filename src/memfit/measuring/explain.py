"""Explain a measured peak: the tensors alive at that moment, by layer and kind.

`memfit.measure(..., explain=True)` (`memfit measure --explain`) runs the measured training
steps under TensorFlow's profiler (`memfit.backend.tf_profile`), which records every call of the
device's BFC allocator: op, address, chunk size, bytes in use after it, shape and dtype. From
those records, in the allocator's order, this module reconstructs the live set at the moment
of the highest bytes in use — the chunks allocated and not yet freed, plus what was resident
before the step (weights, optimizer slots: made before profiling, so they carry no record and
are attributed from the model's variables) — and groups it by layer and kind:

- `weights`, `optimizer_slots`, `other_state`: resident variables (the model's, the
  optimizer's, anything else resident before the step), including buffers an assign op gave
  a variable during the profile (copy-on-write);
- `inputs`: the batch and the input pipeline's tensors (tf.data ops);
- `activations`: outputs of forward-pass ops still alive (kept for the backward pass);
- `gradients`: backward-pass outputs with the shape of one of their layer's trainable
  variables (the weight gradients the update reads);
- `temporaries`: other backward-pass outputs (gradients of activations) and the optimizer
  update's tensors;
- `workspace`: kernels' scratch buffers (`region_type` "temp" in the profile);
- `fragmentation`: what the allocator handed out beyond each request (whole chunks it would
  not split).

The kinds are the categories of `memfit.estimate`'s breakdown, so the two can be read side by
side. The reconstruction itself (`live_at_peak`, `explain_live_set`) is pure Python.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memfit.backend.attribution import (
    KINDS,
    AllocationRecord,
    StepInfo,
    scope_segments,
    strip_suffix,
)
from memfit.estimation.bfc import round_up
from memfit.estimation.replayed import estimate_workload
from memfit.serialize import json_dict, suffixed
from memfit.sizes import format_size

OTHER = "(other)"
RESIDENT_REST = "(resident, not a variable)"
BATCH = "(batch)"
TOP_LAYERS = 5
LARGEST = 10
_INPUT_OPS = ("Iterator", "Optional", "optional", "Prefetch", "TensorSliceDataset")
# Ops that give a variable a new buffer (copy-on-write when its old one is still read).
_VARIABLE_WRITES = ("Assign", "ResourceApply", "ResourceScatter", "ResourceSparseApply")


@dataclass
class LiveSet:
    """What the allocator held at the highest bytes in use of the records.

    Attributes:
        peak_bytes: bytes in use at that moment (from the allocator's own count).
        before_bytes: bytes in use before the first record (resident before the step).
        resident_bytes: of `before_bytes`, what was still held at the peak.
        tensors: the chunks allocated during the records and alive at the peak.
        peak_op: the op whose allocation made the peak.
        unmatched_bytes: `peak_bytes` less the listed bytes (0 when the records are whole).
        reordered: records moved to follow the allocator's count (threads' timestamps
            interleave).
    """

    peak_bytes: int
    before_bytes: int
    resident_bytes: int
    tensors: list[AllocationRecord]
    peak_op: str = ""
    unmatched_bytes: int = 0
    reordered: int = 0

    @property
    def listed_bytes(self) -> int:
        """Resident bytes plus the live chunks: the peak, when the records are whole."""
        return self.resident_bytes + sum(t.nbytes for t in self.tensors)


def allocator_order(
    records: Sequence[AllocationRecord], window: int = 64
) -> list[AllocationRecord]:
    """The records in the order the allocator made the calls.

    Records come from several threads; their timestamps are taken outside the allocator's
    lock, so two close calls can swap. Each record carries the bytes in use after it: the
    next call is the one among the next `window` (by time) whose change leads there. The
    bytes in use before the first call are the ones from which most of the first calls
    follow one another.

    Example:
        ```python
        ordered = allocator_order(records)
        ```
    """
    pending = sorted(records, key=lambda r: r.time_ps)
    if not pending:
        return []
    starts = {r.in_use_bytes - r.delta for r in pending[: min(8, len(pending))]}
    trial = pending[: 4 * window]
    start = max(starts, key=lambda base: (_chain(trial, base, window)[1], -base))
    return _chain(pending, start, window)[0]


def _chain(
    pending: list[AllocationRecord], current: int, window: int
) -> tuple[list[AllocationRecord], int]:
    """Records in allocator order from `current` bytes in use; how many followed exactly."""
    taken = [False] * len(pending)
    first = 0
    ordered: list[AllocationRecord] = []
    consistent = 0
    while len(ordered) < len(pending):
        while taken[first]:
            first += 1
        choice = first
        seen = 0
        index = first
        while index < len(pending) and seen < window:
            if not taken[index]:
                seen += 1
                record = pending[index]
                if current + record.delta == record.in_use_bytes:
                    choice = index
                    consistent += 1
                    break
            index += 1
        taken[choice] = True
        ordered.append(pending[choice])
        current = pending[choice].in_use_bytes
    return ordered, consistent


def live_at_peak(records: Sequence[AllocationRecord]) -> LiveSet:
    """Reconstruct what was alive at the highest bytes in use of `records`.

    Chunks allocated before the first record (weights, optimizer state) carry no record:
    they are `before_bytes`, less what the records free of them by the peak.

    Args:
        records: one allocator's records over the profiled work (any order).

    Example:
        ```python
        live = live_at_peak(records)
        print(live.peak_bytes, live.listed_bytes, len(live.tensors))
        ```
    """
    if not records:
        raise ValueError("no allocation records to reconstruct a peak from")
    by_time = sorted(records, key=lambda r: r.time_ps)
    ordered = allocator_order(by_time)
    reordered = sum(1 for a, b in zip(by_time, ordered, strict=True) if a is not b)
    peak_index = max(range(len(ordered)), key=lambda i: (ordered[i].in_use_bytes, -i))
    before = ordered[0].in_use_bytes - ordered[0].delta
    live: dict[int, AllocationRecord] = {}
    freed_resident = 0
    for record in ordered[: peak_index + 1]:
        if record.event == "alloc":
            live[record.addr] = record
        elif record.addr in live:
            del live[record.addr]
        else:
            freed_resident += record.nbytes
    peak = ordered[peak_index]
    result = LiveSet(
        peak_bytes=peak.in_use_bytes,
        before_bytes=before,
        resident_bytes=max(0, before - freed_resident),
        tensors=sorted(live.values(), key=lambda r: -r.nbytes),
        peak_op=peak.op,
        reordered=reordered,
    )
    result.unmatched_bytes = result.peak_bytes - result.listed_bytes
    return result


def writes_variable(record: AllocationRecord) -> bool:
    """Whether a chunk is a variable's new buffer (an assign op copied it on write)."""
    segments = scope_segments(record.op)
    return bool(segments) and strip_suffix(segments[-1]).startswith(_VARIABLE_WRITES)


def kind_of(record: AllocationRecord, layer: str, info: StepInfo, grad_shapes: Any) -> str:
    """The kind of a chunk allocated during the step (see the module's docstring)."""
    if record.region == "temp":
        return "workspace"
    segments = scope_segments(record.op)
    head = segments[0] if segments else ""
    if "gradient_tape" in segments:
        shape = tuple(record.shape or ())
        return "gradients" if layer and shape in grad_shapes.get(layer, ()) else "temporaries"
    if info.optimizer_name and strip_suffix(head) == strip_suffix(info.optimizer_name):
        return "temporaries"
    if head.endswith("Dataset") or head.startswith(_INPUT_OPS):
        return "inputs"
    return "activations"


@dataclass
class Explanation:
    """The tensors alive at a measured step's peak, grouped by layer and kind.

    Attributes:
        device: the device measured.
        allocator: the allocator the profile was read from.
        peak_bytes: bytes in use at the profiled step's peak (the allocator's count).
        listed_bytes: what the explanation lists (sums to `peak_bytes` when whole).
        measured_peak_bytes: the measurement's peak (`Measurement.peak_bytes`).
        by_kind: bytes per kind (`KINDS`).
        per_layer: `[{"layer", "bytes", "<kind>_bytes"...}]`, largest first.
        largest: the largest live tensors: `op`, `layer`, `kind`, `bytes`, `shape`, `dtype`.
        tensors: number of chunks allocated during the step and alive at the peak.
        peak_op: the op whose allocation made the peak.
        estimate: `memfit.estimate`'s prediction of the same step: `peak_bytes`, `breakdown`
            (`<kind>_bytes`), `per_layer`; or `{"error": ...}` when it failed.
        top_layers: the top layers of each side and how many they share.
        notes: what the reader should know (records reordered, bytes not matched).
    """

    device: str
    allocator: str
    peak_bytes: int
    listed_bytes: int
    measured_peak_bytes: int | None
    by_kind: dict[str, int]
    per_layer: list[dict[str, Any]]
    largest: list[dict[str, Any]]
    tensors: int = 0
    peak_op: str = ""
    estimate: dict[str, Any] | None = None
    top_layers: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def listed_error(self) -> float | None:
        """Listed bytes relative to the measured peak, minus 1 (None without a peak)."""
        peak = self.measured_peak_bytes
        return None if not peak else self.listed_bytes / peak - 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: sizes in bytes with `_bytes` keys."""
        return json_dict(
            self,
            "device allocator peak_bytes listed_bytes measured_peak_bytes listed_error by_kind "
            "per_layer largest tensors peak_op estimate top_layers notes",
            by_kind=suffixed(self.by_kind, "_bytes"),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Explanation:
        """The explanation `to_dict` wrote (from a child process, or a JSON file)."""
        return cls(
            device=data["device"],
            allocator=data.get("allocator", ""),
            peak_bytes=data["peak_bytes"],
            listed_bytes=data["listed_bytes"],
            measured_peak_bytes=data.get("measured_peak_bytes"),
            by_kind={k.removesuffix("_bytes"): v for k, v in data.get("by_kind", {}).items()},
            per_layer=list(data.get("per_layer", [])),
            largest=list(data.get("largest", [])),
            tensors=int(data.get("tensors", 0)),
            peak_op=data.get("peak_op", ""),
            estimate=data.get("estimate"),
            top_layers=data.get("top_layers"),
            notes=list(data.get("notes", [])),
        )

    def __str__(self) -> str:
        top = ", ".join(row["layer"] for row in self.per_layer[:3])
        return (
            f"alive at the peak: {format_size(self.listed_bytes)} in {self.tensors} tensors "
            f"besides resident state; top layers {top}"
        )


def _attribute_resident(resident: int, info: StepInfo) -> list[tuple[str, str, int]]:
    """Resident bytes as (layer, kind, bytes): the variables, the batch, then what is left.

    `memfit.measure` makes the batch before the steps (in the device's allocator, as a GPU
    holds it: `tfb.hold_on_device`), so it is resident with the variables, and `inputs` as
    the estimate shows it (`StepInfo.batch_bytes`).
    """
    rows: list[tuple[str, str, int]] = []
    left = resident
    order = {"weights": 0, "optimizer_slots": 1, "other_state": 2}
    for var in sorted(info.variables, key=lambda v: order.get(v.kind, 3)):
        if left <= 0:
            break
        nbytes = min(round_up(var.nbytes), left)
        rows.append((var.layer or OTHER, var.kind, nbytes))
        left -= nbytes
    batch = min(round_up(info.batch_bytes), left) if info.batch_bytes else 0
    if batch > 0:
        rows.append((BATCH, "inputs", batch))
        left -= batch
    if left > 0:
        rows.append((RESIDENT_REST, "other_state", left))
    return rows


def explain_live_set(
    live: LiveSet,
    info: StepInfo,
    *,
    device: str = "",
    allocator: str = "",
    measured_peak_bytes: int | None = None,
    largest: int = LARGEST,
) -> Explanation:
    """Group a live set by layer and kind (see the module's docstring for the kinds).

    Args:
        live: what `live_at_peak` found.
        info: the model's layers and variables.
        device: the device measured.
        allocator: the allocator's name.
        measured_peak_bytes: the measurement's peak, to compare the listed bytes with.
        largest: how many of the largest tensors to list.

    Example:
        ```python
        explanation = explain_live_set(live_at_peak(records), info, measured_peak_bytes=peak)
        ```
    """
    grad_shapes: dict[str, set[tuple[int, ...]]] = defaultdict(set)
    for var in info.variables:
        if var.trainable and var.kind == "weights":
            grad_shapes[var.layer].add(tuple(var.shape))
    info.tree.choose_policy(t.op for t in live.tensors)
    by_kind = dict.fromkeys(KINDS, 0)
    layers: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(KINDS, 0))
    rows: list[dict[str, Any]] = []
    # A variable whose buffer an update replaced during the profile is still resident: its
    # old buffer's free lowered the resident bytes, its new one is a chunk of the records.
    moved = [t for t in live.tensors if writes_variable(t)]
    tensors = [t for t in live.tensors if not writes_variable(t)]
    resident = live.resident_bytes + sum(t.nbytes for t in moved)
    for layer, kind, nbytes in _attribute_resident(resident, info):
        by_kind[kind] += nbytes
        layers[layer][kind] += nbytes
    variables = sorted(info.variables, key=lambda v: -v.nbytes)
    for var in variables[:largest]:
        rows.append(
            {
                "op": var.name,
                "layer": var.layer or OTHER,
                "kind": var.kind,
                "bytes": round_up(var.nbytes),
                "shape": var.shape,
                "dtype": var.dtype,
            }
        )
    for tensor in tensors:
        layer = info.tree.layer_of(tensor.op) or OTHER
        kind = kind_of(tensor, layer, info, grad_shapes)
        used = min(tensor.nbytes, round_up(tensor.requested_bytes) or tensor.nbytes)
        by_kind[kind] += used
        layers[layer][kind] += used
        if tensor.nbytes > used:
            by_kind["fragmentation"] += tensor.nbytes - used
            layers[layer]["fragmentation"] += tensor.nbytes - used
        rows.append(
            {
                "op": tensor.op,
                "layer": layer,
                "kind": kind,
                "bytes": tensor.nbytes,
                "shape": tensor.shape,
                "dtype": tensor.dtype,
            }
        )
    rows.sort(key=lambda r: -r["bytes"])
    per_layer = [
        {"layer": name, "bytes": sum(parts.values()), **{f"{k}_bytes": v for k, v in parts.items()}}
        for name, parts in layers.items()
    ]
    per_layer.sort(key=lambda row: -row["bytes"])
    notes = []
    if live.unmatched_bytes:
        notes.append(
            f"{format_size(abs(live.unmatched_bytes))} of the allocator's count at the peak "
            f"{'are not' if live.unmatched_bytes > 0 else 'too many are'} matched by the "
            f"profile's records"
        )
    return Explanation(
        device=device,
        allocator=allocator,
        peak_bytes=live.peak_bytes,
        listed_bytes=sum(by_kind.values()),
        measured_peak_bytes=measured_peak_bytes,
        by_kind=by_kind,
        per_layer=per_layer,
        largest=rows[:largest],
        tensors=len(tensors),
        peak_op=live.peak_op,
        notes=notes,
    )


def top_layers(per_layer: Iterable[dict[str, Any]], count: int = TOP_LAYERS) -> list[str]:
    """The `count` largest layers of a per-layer list, leaving out unattributed rows."""
    named = [row for row in per_layer if row["layer"] and not row["layer"].startswith("(")]
    return [row["layer"] for row in sorted(named, key=lambda r: -r["bytes"])[:count]]


def compare_with_estimate(explanation: Explanation, estimate: dict[str, Any]) -> None:
    """Attach an estimate of the same step (its `to_dict()`) and the shared top layers.

    Example:
        ```python
        compare_with_estimate(explanation, memfit.estimate(model, 16).to_dict())
        ```
    """
    kept = {
        "peak_bytes": estimate.get("peak_bytes"),
        "breakdown": estimate.get("breakdown", {}),
        "per_layer": list(estimate.get("per_layer", []))[:30],
        "peak_moment": estimate.get("peak_moment", {}),
    }
    explanation.estimate = kept
    measured = top_layers(explanation.per_layer)
    estimated = top_layers(kept["per_layer"])
    explanation.top_layers = {
        "measured": measured,
        "estimated": estimated,
        "common": len(set(measured) & set(estimated)),
    }


def explain_records(
    workload: Any,
    records: Sequence[AllocationRecord],
    *,
    info: StepInfo,
    device: str,
    batch_size: int,
    measured_peak_bytes: int | None,
    with_estimate: bool = True,
) -> Explanation:
    """Explain the peak of profiled training steps of `workload` from their records.

    Args:
        workload: the `memfit.Workload` measured (its model's layers and variables).
        records: the allocator records of the measured steps
            (`memfit.backend.tf_profile.AllocationRecorder`).
        info: the model's layers and resident variables
            (`memfit.backend.tf_profile.step_info(workload)`).
        device: the device measured.
        batch_size: the steps' batch size (for the estimate of the same step).
        measured_peak_bytes: the measurement's peak.
        with_estimate: also estimate the same step with `memfit.estimate`, side by side.

    Example:
        ```python
        explanation = explain_records(workload, records, info=step_info(workload),
                                      device="CPU:0", batch_size=16,
                                      measured_peak_bytes=peak)
        ```
    """
    live = live_at_peak(records)
    explanation = explain_live_set(
        live,
        info,
        device=device,
        allocator=records[0].allocator if records else "",
        measured_peak_bytes=measured_peak_bytes,
    )
    if measured_peak_bytes and live.peak_bytes != measured_peak_bytes:
        explanation.notes.append(
            f"the allocator's records peak at {format_size(live.peak_bytes)}, its statistics "
            f"at {format_size(measured_peak_bytes)}"
        )
    if with_estimate:
        try:
            compare_with_estimate(explanation, estimate_workload(workload, batch_size).to_dict())
        except Exception as exc:  # noqa: BLE001 - the measurement stands without it
            explanation.estimate = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return explanation
