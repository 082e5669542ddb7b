"""Replay a traced training step through a model of TensorFlow's allocator, without running it.

The replay follows TensorFlow's executor (`memfit.estimation.order.execution_order`). With
one inter-op thread, `single_thread_order`: depth first along one chain, other ready branches
waiting on a stack. With several, `threaded_order`: each thread runs depth first side by side,
and an idle thread steals the oldest op another has handed to the pool, so a detector's box
head and class head run at once, each thread taking the pyramid levels' chains and their
weight gradients in its own order (the other levels' gradients of a shared weight stay live
until their sum, `AddN`, can run). Ops with more than four out-edges meet their consumers in
traced order. `replay(..., race=True)` plays another reading of several threads, a ready queue
(first in, first out; which ready op runs first is a race), for the high bound. Each op allocates
its outputs (rounded up to the BFC allocator's 256-byte granules) unless an output is a view of
an input (Reshape, Identity, variable reads) or the kernel takes over an input buffer that
nothing else holds (`forward_input_or_allocate_output`); its kernel's scratch is held while it
runs; a buffer is freed when the last tensor that refers to it has been consumed.

This module sets up the allocator as a measuring process has it and plays the steps; the
executor's order is `memfit.estimation.order`, one step (each op's states and its buffers)
`memfit.estimation.step.StepRun`.

Known limit: the measured peak itself is not one number across processes. With one inter-op
thread, ResNet50 96 px batch 2 Adam measured 337 MiB in most fresh `tf.function`s and 345-375
or 420-475 MiB in some (each steady over its steps; grappler's output graph was identical,
byte for byte, in every case): which ready successor the executor continues inline follows
the order of the op's out-edges, and an `EdgeSet` with more than four edges is a hash set of
edge addresses, whose order can change from one instantiation to the next. The replay plays
the consumers' traced order (what TensorFlow's profile showed for RetinaNet's heads);
`memfit.measure` reports the spread of its repeats, and the accuracy benchmark the spread
across processes.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from memfit.estimation.bfc import BFC, GRANULE
from memfit.estimation.order import (
    INEXPENSIVE_OPS,
    execution_events,
    execution_order,
    single_thread_order,
)
from memfit.estimation.step import (
    Live,
    Replay,
    StepRun,
    layer_of,
    phase_of,
    round_up,
    step_structure,
)

# Re-exported from `memfit.estimation.order` and `memfit.estimation.step`, where they moved.
__all__ = [
    "INEXPENSIVE_OPS",
    "GRANULE",
    "Live",
    "Replay",
    "execution_order",
    "layer_of",
    "phase_of",
    "rehomed_updates",
    "replay",
    "round_up",
    "single_thread_order",
]

PHASES = ("forward", "backward", "update")
# A resource variable's handle tensor (`VarHandleOp`'s 200-byte `ResourceHandle`), one
# 256-byte chunk per variable for the life of the variable.
RESOURCE_HANDLE_BYTES = 200
# Steps the replay measures after the warm-up (the highest peak counts): as many as the
# accuracy benchmark measures in each process (5 after a warm-up). One order in every step
# does not make every step peak alike: weights that an update copies (copy-on-write) or whose
# new value it adopts move every step, so the free chunks differ from one step to the next,
# and so does the chunk a large request gets whole. EfficientNetB0's recompute step, one
# inter-op thread: TensorFlow's profile (224 px, batch 16) holds the replay's tensors at each
# step's peak and copies the replay's 46 weights a step; at batch 32 its steps peaked at
# 995-1138 MiB (3 processes of 8), the replay's at 1015-1131 (10 steps), and the highest of
# the replay's first two was 1069.3 MiB, of five 1082.8.
STEPS = 5


def replay(
    graph: Any,
    warmup: bool = True,
    steps: int = STEPS,
    region_bytes: int | None = None,
    order_seed: int | None = None,
    warmups: int = 1,
    race: bool = False,
    rehome: bool = False,
) -> Replay:
    """Replay `graph` (a `memfit.backend.tf_graph.StepGraph`) and find its peak.

    As a measuring process gets there: each variable is made as Keras makes it (see
    `_replay_once`), then the batch; one warm-up step settles the allocator's free chunks,
    and the highest peak of the next `steps` steps is the step's peak (`memfit.measure`
    reports the highest of its repeats). Weights that move every step (an update that
    copies its variable or adopts its new value's buffer) leave the free chunks different
    after each step even in one fixed order, so the steps' peaks differ by the chunk excess
    of their largest requests (`STEPS`). `step_peak_bytes` is that peak less what was in
    use before the steps. `region_bytes`: the allocator holds that budget as one region from
    the start (an emulated card, a GPU with memory growth off); None: it grows in regions.

    `order_seed` replays one process the executor could have run instead of the usual one:
    each op's successors are met in an order drawn from the seed (TensorFlow meets the
    consumers of an op with more than four out-edges in address order, and with several
    inter-op threads which ready op runs first is a race), once for each of the `warmups`
    warm-up steps (the process's allocator history) and once for the measured steps (an
    instantiation's order is the same in all its steps). None: grappler's node order.

    `race`: under several inter-op threads, play ops in ready-queue order (which of the ops
    made ready together runs first is a race) instead of each thread's depth-first order.
    TensorFlow's threads run depth first: a RetinaNet step's measured peak (192 px, default
    threading) holds four of the five pyramid levels' weight gradients of each shared head
    kernel until the fifth, handed off by the first chain, is computed near the end of the
    backward pass; the ready queue sums them as they come and holds none.

    `rehome`: every weight update that can copy its variable does so in every step
    (`rehomed_updates`): the allocator after many steps of a process in which the threads'
    timing let the weights' updates outrun the gradients that read them. Not the default:
    it brings EfficientNetB3 (96 px, batch 4, Adam, default threading) from 262 to 285 MiB
    (measured 286) and MobileNetV2's recompute step (96 px, batch 16) from 108 to 125 MiB
    (measured 123-125 after its first step), but puts MobileNetV2, ResNet50 and
    EfficientNetB0 at batch 2 4-6% above their measured peaks, where TensorFlow copied 12 to
    18 of MobileNetV2's 104 such weights a step. Which weights copy follows the threads'
    timing. Without `rehome` the replay copies a weight where its clock runs the update
    while a gradient that reads the weight is still running (`order.execution_events`).

    Known limit: with one inter-op thread the executor's order is fixed when a process
    instantiates the step but not the same in every process (an op with more than four
    out-edges meets its consumers in address order): VGG16 96 px batch 2 Adam measured
    771, 900 and 1017 MiB in three processes; the replay plays grappler's node order.
    """
    rng = random.Random(order_seed) if order_seed is not None else None
    copies = rehomed_updates(graph) if rehome else frozenset()
    return _replay_once(graph, warmup, steps, region_bytes, rng, max(1, warmups), race, copies)


def _replay_once(
    graph: Any,
    warmup: bool,
    steps: int,
    region_bytes: int | None,
    rng: random.Random | None = None,
    warmups: int = 1,
    race: bool = False,
    copies: frozenset[int] = frozenset(),
) -> Replay:
    bfc = BFC(region_bytes)
    resident: list[Live] = []
    variables: dict[str, int] = {}
    # Each variable's request, category and layer: its buffer moves when an update copies it.
    described: dict[str, tuple[int, str, str]] = {}
    temps = getattr(graph, "variable_temps", None) or {}
    for name, (nbytes, kind) in graph.variables.items():
        # As the variable was made: its resource handle (kept), then its initializer's
        # temporaries and value; the temporaries leave holes the step's tensors fill.
        layer = graph.variable_layers.get(name, "")
        kept = bfc.allocate(RESOURCE_HANDLE_BYTES)
        label = f"{name} (handle)"
        resident += _chunk(bfc, kept, RESOURCE_HANDLE_BYTES, "other_state", layer, label)
        made = [bfc.allocate(nbytes) for _ in range(temps.get(name, 0))]
        handle = bfc.allocate(nbytes)
        for buffer in made:
            bfc.free(buffer)
        variables[name] = handle
        label = {"weight": "weights", "optimizer": "optimizer_slots"}.get(kind, "other_state")
        described[name] = (nbytes, label, layer)
    for name, nbytes in zip(graph.arguments, graph.argument_bytes, strict=True):
        handle = bfc.allocate(nbytes)
        resident += _chunk(bfc, handle, nbytes, "inputs", "", name)
    fixed = int(graph.inter_op_threads) == 1 or not race
    if warmup:
        for _ in range(warmups if rng is not None else 1):
            seed = rng.random() if rng is not None else None
            order = execution_events(graph, seed) if fixed else None
            StepRun(graph, bfc, variables, order, seed, race, copies).run()
    seed = rng.random() if rng is not None else None
    order = execution_events(graph, seed) if fixed else None
    best: Replay | None = None
    held: list[Live] = []
    moved: set[str] = set()
    raced = 0
    before = bfc.in_use
    for _ in range(max(1, steps)):
        bfc.reset_peak()
        before_step = bfc.in_use
        homes = {name: (handle, bfc.size_of(handle)) for name, handle in variables.items()}
        run = StepRun(graph, bfc, variables, order, seed, race, copies)
        result = run.run()
        result.resident_bytes = before_step
        result.peak_bytes = before_step + result.step_peak_bytes
        raced = max(raced, bfc.raced_peak)
        if best is None or result.peak_bytes > best.peak_bytes:
            best = result
            # The variables' buffers live at the peak: where the step found them, unless an
            # update moved the variable before the peak (its new buffer is the step's).
            held = [
                item
                for name, (handle, size) in homes.items()
                if handle in run.held_at_peak
                for item in _sized(size, *described[name], name)
            ]
            moved = {name for name, (handle, _) in homes.items() if handle not in run.held_at_peak}
    assert best is not None
    best.resident_bytes = before
    best.step_peak_bytes = best.peak_bytes - before
    best.raced_peak_bytes = max(raced, best.peak_bytes)
    # The buffer an update gave a variable whose old one is gone (a copy, an adopted value)
    # holds the variable; a copy made while a read still holds the old one stays a temporary.
    assigns = {op.name: op.variable for op in graph.ops if op.type.startswith("Assign")}
    for item in best.live:
        if item.category == "temporaries" and assigns.get(item.op) in moved:
            item.category = described[assigns[item.op]][1]
    best.live = resident + held + best.live
    return best


def rehomed_updates(graph: Any) -> frozenset[int]:
    """The weight updates that copy their variable to a new buffer (copy-on-write).

    Under several inter-op threads a weight's update (`AssignSubVariableOp`, ...) runs on one
    thread while a backward op that reads the weight (a convolution's input gradient, a
    batch norm's gradient) may still run on another, and TensorFlow then copies the variable
    to a new buffer first (`PrepareToUpdateVariable`: the tensor's reference count is not
    one), which the variable keeps. The copy is made in the backward pass, in a hole that
    freed activations left, so over the steps the weights move into the activations' space
    and cut its free space into holes; a later large request finds a hole under twice its
    size and takes it whole. TensorFlow's allocator profile of EfficientNetB3 (96 px, batch
    4, Adam, default threading) shows 16 to 33 weights copied in each step (61 in four), and
    its 20.1 MiB input-gradient scratch at the peak in a 35.5-40.1 MiB hole bounded by copied
    weights; MobileNetV2's recompute step (96 px, batch 16) its recomputed block_1_expand
    output (13.5 MiB) in a 23.6 MiB hole between two. Which weights copy in a step depends
    on the threads' timing, and a weight copied once stays where it went until it is copied
    again. The weights that can copy are those read by a backward op that their update
    does not wait for (every weight TensorFlow copied in those profiles is one); under
    `replay(..., rehome=True)` they copy in every step. Otherwise `StepRun.assign` copies
    only while a read is still held: with one inter-op thread an op's inputs are released
    before the next op runs; with several, when the reading op ends on the threads' clock
    (`order.execution_events`).

    Args:
        graph: the traced step (`memfit.backend.tf_graph.StepGraph`); the result is cached
            on it.

    Returns:
        The indices of those update ops in `graph.ops`.

    Example:
        ```python
        copies = rehomed_updates(graph)
        result = StepRun(graph, BFC(None), None, None, None, False, copies).run()
        ```
    """
    cached = graph.__dict__.get("_rehomed_updates")
    if cached is not None and cached[0] is graph.ops:
        return cached[1]
    ops = graph.ops
    copies: set[int] = set()
    if int(getattr(graph, "inter_op_threads", 1) or 1) > 1:
        structure = step_structure(graph)
        preds, succs, phases = structure.preds, structure.succs, structure.phases
        reads = {
            op.outputs[0]: op.variable
            for op in ops
            if op.type == "ReadVariableOp" and op.variable and op.outputs
        }
        readers: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            if phases[i] == "backward" and op.type not in INEXPENSIVE_OPS:
                for name in set(op.inputs):
                    if name in reads:
                        readers.setdefault(reads[name], []).append(i)
        position = _topological_positions(preds, succs)
        for i, op in enumerate(ops):
            kind = graph.variables.get(op.variable, (0, ""))[1] if op.variable else ""
            if kind != "weight" or not op.type.startswith("Assign"):
                continue
            if any(not _needs(i, j, preds, position) for j in readers.get(op.variable, ())):
                copies.add(i)
    result = frozenset(copies)
    graph.__dict__["_rehomed_updates"] = (ops, result)
    return result


def _topological_positions(preds: list[set[int]], succs: list[list[int]]) -> list[int]:
    """Each op's place in one topological order of the graph (Kahn's)."""
    indegree = [len(p) for p in preds]
    ready = deque(i for i, count in enumerate(indegree) if count == 0)
    position = [len(preds)] * len(preds)
    placed = 0
    while ready:
        op = ready.popleft()
        position[op] = placed
        placed += 1
        for succ in succs[op]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                ready.append(succ)
    return position


def _needs(op: int, other: int, preds: list[set[int]], position: list[int]) -> bool:
    """Whether `op` (transitively) needs `other`; only ops placed after `other` are searched."""
    floor = position[other]
    if position[op] <= floor:
        return False
    stack, seen = [op], {op}
    while stack:
        for p in preds[stack.pop()]:
            if p == other:
                return True
            if p not in seen and position[p] > floor:
                seen.add(p)
                stack.append(p)
    return False


def _sized(size: int, nbytes: int, category: str, layer: str, op: str) -> list[Live]:
    """A chunk of `size` bytes holding a request of `nbytes`, as live bytes."""
    request = round_up(nbytes)
    items = [Live(request, category, layer, op)]
    if size > request:
        items.append(Live(size - request, "fragmentation", layer, op))
    return items


def _chunk(bfc: BFC, handle: int, nbytes: int, category: str, layer: str, op: str) -> list[Live]:
    """The chunk at `handle` as live bytes: the request, and what BFC handed out beyond it."""
    return _sized(bfc.size_of(handle), nbytes, category, layer, op)
