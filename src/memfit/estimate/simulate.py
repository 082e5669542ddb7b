"""Replay a traced training step through a model of TensorFlow's allocator, without running it.

The replay follows TensorFlow's executor: ops run in ready-queue (first in, first out) order;
each op allocates its outputs (rounded up to the BFC allocator's 256-byte granules) unless an
output is a view of an input (Reshape, Identity, variable reads) or the kernel takes over an
input buffer that nothing else holds (`forward_input_or_allocate_output`); its kernel's scratch
is held while it runs; a buffer is freed when the last tensor that refers to it has been
consumed. When ops can run at once (`StepGraph.inter_op_threads` > 1: several inter-op threads
and several CPUs to run them on), ops that are ready together run together: the scratch of the
largest other ready op is counted beside the running one's.

Known limit (allocator traces, ResNet50 96 px batch 2 Adam, one inter-op thread): the same
step measures 337 MiB in some processes and 425-463 MiB in others (steady within a process).
TensorFlow's single-thread schedule keeps running the chain it is on and stacks the other
ready ops (`ExecutorState::ScheduleReady`), and how far each variable's update gets before the
backward pass ends depends on the thread pool's timing as the step starts; in the high case
every gradient and its first update temporaries are live at once. The replay predicts the low
case, which was the more frequent; a replay of the single-thread schedule itself predicted the
high case and over-predicted the more frequent low case by 40-50%, so it was not kept.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from memfit.estimate.bfc import BFC

GRANULE = 256
PHASES = ("forward", "backward", "update")


def round_up(nbytes: int) -> int:
    """Bytes the BFC allocator hands out for a request of `nbytes` (256-byte granules)."""
    return 0 if nbytes <= 0 else -(-nbytes // GRANULE) * GRANULE


@dataclass
class Live:
    """A buffer live at the peak: its bytes, category, layer and producing op."""

    nbytes: int
    category: str
    layer: str
    op: str


@dataclass
class Replay:
    """What the replay found: the step's own peak (above resident) and what was live then."""

    step_peak_bytes: int
    peak_op: str
    peak_op_type: str
    peak_phase: str
    peak_layer: str
    live: list[Live] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    resident_bytes: int = 0
    peak_bytes: int = 0


_SUFFIX = re.compile(r"_\d+$")


def layer_of(name: str, layers: set[str]) -> str:
    """The Keras layer an op belongs to, from its name scopes ("" when none matches)."""
    for segment in name.split("/"):
        if segment in layers:
            return segment
        stripped = _SUFFIX.sub("", segment)
        if stripped in layers:
            return stripped
    return ""


def phase_of(name: str, op_type: str, optimizer_name: str) -> str:
    """`forward`, `backward` (under the gradient tape) or `update` (the optimizer's ops)."""
    if name.startswith("gradient_tape/"):
        return "backward"
    head = name.split("/", 1)[0]
    if head == optimizer_name or _SUFFIX.sub("", head) == optimizer_name:
        return "update"
    return "forward"


def replay(graph: Any, warmup: bool = True) -> Replay:
    """Replay `graph` (a `memfit.backend.tf_graph.StepGraph`) and find its peak.

    As `memfit.measure` does: variables (weights, optimizer state) and the batch are allocated
    first, one warm-up step settles the allocator's free chunks, and the peak of the next
    step is returned. `step_peak_bytes` is that peak less what was in use before it.
    """
    bfc = BFC()
    resident: list[Live] = []
    for name, (nbytes, kind) in graph.variables.items():
        handle = bfc.allocate(nbytes)
        label = {"weight": "weights", "optimizer": "optimizer_slots"}.get(kind, "other_state")
        layer = graph.variable_layers.get(name, "")
        resident.append(Live(bfc.size_of(handle), label, layer, name))
    for name, nbytes in zip(graph.arguments, graph.argument_bytes, strict=True):
        handle = bfc.allocate(nbytes)
        resident.append(Live(bfc.size_of(handle), "inputs", "", name))
    if warmup:
        _run(graph, bfc)
    bfc.reset_peak()
    before = bfc.in_use
    result = _run(graph, bfc)
    result.resident_bytes = before
    result.peak_bytes = before + result.step_peak_bytes
    result.live = resident + result.live
    return result


def _run(graph: Any, bfc: BFC) -> Replay:
    ops = graph.ops
    index = {op.name: i for i, op in enumerate(ops)}
    producer = {}
    for i, op in enumerate(ops):
        for name in op.outputs:
            producer[name] = i
    consumers: dict[str, list[int]] = defaultdict(list)
    preds: list[set[int]] = [set() for _ in ops]
    for i, op in enumerate(ops):
        for name in op.inputs:
            consumers[name].append(i)
            if name in producer:
                preds[i].add(producer[name])
        for name in op.control_inputs:
            if name in index:
                preds[i].add(index[name])
    succs: list[list[int]] = [[] for _ in ops]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    phases = [phase_of(op.name, op.type, graph.optimizer_name) for op in ops]
    layers = [layer_of(op.name, graph.layers) for op in ops]
    # A backward tensor read by the optimizer's ops is a gradient.
    feeds_update: set[str] = set()
    for i, op in enumerate(ops):
        if phases[i] == "update":
            feeds_update.update(op.inputs)

    pending = {name: len(c) for name, c in consumers.items()}
    fetched = set(graph.fetches)
    arguments = set(graph.arguments)
    buffer_of: dict[str, int | None] = {}
    size: dict[int, int] = {}
    request: dict[int, int] = {}
    refs: dict[int, int] = defaultdict(int)
    owner: dict[int, int] = {}
    category: dict[int, str] = {}
    threads = max(1, int(graph.inter_op_threads))
    start = bfc.in_use
    result = Replay(0, "", "", "forward", "")

    def allocate(nbytes: int, op_index: int) -> int:
        buffer = bfc.allocate(nbytes)
        size[buffer] = bfc.size_of(buffer)
        request[buffer] = round_up(nbytes)
        refs[buffer] = 1
        owner[buffer] = op_index
        category[buffer] = phases[op_index]
        return buffer

    def release(name: str) -> None:
        buffer = buffer_of.get(name)
        if buffer is None:
            return
        refs[buffer] -= 1
        if refs[buffer] == 0:
            bfc.free(buffer)

    def snapshot(op_index: int, extra: list[tuple[int, str, int]]) -> None:
        live = []
        for buffer, count in refs.items():
            if count > 0 and size[buffer]:
                o = owner[buffer]
                cat = category[buffer]
                live.append(Live(size[buffer], cat, layers[o], ops[o].name))
        for nbytes, cat, o in extra:
            live.append(Live(nbytes, cat, layers[o], ops[o].name))
        op = ops[op_index]
        result.live = live
        result.peak_op = op.name
        result.peak_op_type = op.type
        result.peak_phase = phases[op_index]
        result.peak_layer = layers[op_index]

    for name in graph.arguments:
        buffer_of[name] = None  # held by the caller: counted as resident

    indegree = [len(p) for p in preds]
    recent: list[int] = []
    position: dict[int, int] = {}
    ready = deque(i for i in range(len(ops)) if indegree[i] == 0)
    queued = set(ready)
    while ready:
        i = ready.popleft()
        queued.discard(i)
        op = ops[i]
        position[i] = len(result.order)
        result.order.append(op.name)
        for k, name in enumerate(op.outputs):
            source = op.alias[k] if k < len(op.alias) else None
            if source is not None:
                buffer = buffer_of.get(op.inputs[source])
                buffer_of[name] = buffer
                if buffer is not None:
                    refs[buffer] += 1
                continue
            nbytes = op.output_bytes[k]
            if nbytes <= 0:
                buffer_of[name] = None
                continue
            buffer = None
            if k == 0 and op.forwards:
                wanted = round_up(nbytes)
                for tensor in op.inputs:
                    candidate = buffer_of.get(tensor)
                    if (
                        candidate is not None
                        and tensor not in arguments
                        and pending.get(tensor, 0) == op.inputs.count(tensor)
                        and refs[candidate] == 1
                        and request[candidate] == wanted
                    ):
                        buffer = candidate
                        refs[buffer] += 1
                        owner[buffer] = i
                        category[buffer] = phases[i]
                        break
            if buffer is None:
                buffer = allocate(nbytes, i)
            buffer_of[name] = buffer
        extra: list[tuple[int, str, int]] = []
        scratch: list[int] = []
        if op.scratch_bytes:
            jobs = [(op.scratch_bytes, i)]
            if threads > 1:
                # Ops that may run beside this one: ready now, or a recent op with scratch
                # that this one does not depend on (a weight gradient still being computed).
                beside = {j for j in queued if ops[j].scratch_bytes}
                beside.update(j for j in recent if not _depends(i, j, preds, position))
                jobs += sorted((ops[j].scratch_bytes, j) for j in beside)[-(threads - 1) :]
            recent = [*recent[-(threads - 1) :], i]
            for nbytes, j in jobs:
                handle = bfc.allocate(nbytes)
                scratch.append(handle)
                extra.append((bfc.size_of(handle), "workspace", j))
        now = bfc.in_use - start
        if now > result.step_peak_bytes:
            result.step_peak_bytes = now
            snapshot(i, extra)
        for handle in scratch:
            bfc.free(handle)
        for tensor in op.inputs:
            if tensor in pending:
                pending[tensor] -= 1
                if pending[tensor] == 0 and tensor not in fetched:
                    release(tensor)
        for name in op.outputs:
            if name not in consumers and name not in fetched:
                release(name)
        for j in succs[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
                queued.add(j)

    # The step's results go back to the caller, who frees them before the next step.
    for buffer, count in list(refs.items()):
        if count > 0:
            refs[buffer] = 0
            bfc.free(buffer)
    # Label what was live at the peak.
    for item in result.live:
        if item.category == "backward" and _feeds(item.op, ops, index, feeds_update):
            item.category = "gradients"
        elif item.category == "forward":
            item.category = "activations"
        elif item.category in ("backward", "update"):
            item.category = "temporaries"
    return result


def _depends(op: int, other: int, preds: list[set[int]], position: dict[int, int]) -> bool:
    """Whether `op` (transitively) needs `other`'s outputs; only ops run since `other` count."""
    floor = position[other]
    stack, seen = [op], {op}
    while stack:
        for p in preds[stack.pop()]:
            if p == other:
                return True
            if p not in seen and position.get(p, -1) > floor:
                seen.add(p)
                stack.append(p)
    return False


def _feeds(op_name: str, ops: list[Any], index: dict[str, int], feeds_update: set[str]) -> bool:
    op = ops[index[op_name]]
    return any(name in feeds_update for name in op.outputs)
