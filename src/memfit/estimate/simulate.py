"""Replay a traced training step through a model of TensorFlow's allocator, without running it.

The replay follows TensorFlow's executor. Ops run in the order of `single_thread_order`, the
executor's own policy: depth first along one chain, other ready branches waiting on a stack.
That holds for each thread: with several inter-op threads on several CPUs each thread runs
its chain depth first and the ops it hands to the pool wait, so a weight gradient that the
first backward chain handed off (a layer shared by several inputs: a detector's heads at each
pyramid level) is computed near the end of the backward pass, and the other inputs' gradients
of that weight stay live until their sum (`AddN`) can run. Ops ready at the same time may
run together: the scratch of the largest other ready op is counted beside the running one's.
`replay(..., race=True)` plays the other reading of several threads, a ready queue (first
in, first out; which ready op runs first is a race), for the high bound. Each op allocates
its outputs (rounded up to the BFC allocator's 256-byte granules) unless an output is a view of
an input (Reshape, Identity, variable reads) or the kernel takes over an input buffer that
nothing else holds (`forward_input_or_allocate_output`); its kernel's scratch is held while it
runs; a buffer is freed when the last tensor that refers to it has been consumed.

Known limit: the measured peak itself is not one number across processes. With one inter-op
thread, ResNet50 96 px batch 2 Adam measured 337 MiB in most fresh `tf.function`s and 345-375
or 420-475 MiB in some (each steady over its steps; grappler's output graph was identical,
byte for byte, in every case): which ready successor the executor continues inline follows
the order of the op's out-edges, and an `EdgeSet` with more than four edges iterates by
address, which changes from one instantiation to the next. The replay predicts the usual
(low) order; `memfit.measure` reports the spread of its repeats, and the accuracy benchmark
the spread across processes.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from memfit.backend.tf_graph import op_dependencies
from memfit.estimate.bfc import BFC

GRANULE = 256
# Kernels whose `IsExpensive()` is false: the executor runs them inline, never via the pool.
INEXPENSIVE_OPS = frozenset(
    {
        "Const", "Placeholder", "NoOp", "Identity", "IdentityN", "Shape", "ShapeN", "Rank",
        "Size", "Reshape", "Squeeze", "ExpandDims", "VarHandleOp", "StopGradient",
    }
)  # fmt: skip
PHASES = ("forward", "backward", "update")
# A resource variable's handle tensor (`VarHandleOp`'s 200-byte `ResourceHandle`), one
# 256-byte chunk per variable for the life of the variable.
RESOURCE_HANDLE_BYTES = 200
# Steps the replay measures after the warm-up (the highest peak counts).
STEPS = 2


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
    activations_kept_bytes: int = 0


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


def replay(
    graph: Any,
    warmup: bool = True,
    steps: int = STEPS,
    region_bytes: int | None = None,
    order_seed: int | None = None,
    warmups: int = 1,
    race: bool = False,
) -> Replay:
    """Replay `graph` (a `memfit.backend.tf_graph.StepGraph`) and find its peak.

    As a measuring process gets there: each variable is made as Keras makes it (see
    `_replay_once`), then the batch; one warm-up step settles the allocator's free chunks,
    and the highest peak of the next `steps` steps is the step's peak (`memfit.measure`
    reports the highest of its repeats). `step_peak_bytes` is that peak less what was in
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

    Known limit: with one inter-op thread the executor's order is fixed when a process
    instantiates the step but not the same in every process (an op with more than four
    out-edges meets its consumers in address order): VGG16 96 px batch 2 Adam measured
    771, 900 and 1017 MiB in three processes; the replay plays grappler's node order.
    """
    rng = random.Random(order_seed) if order_seed is not None else None
    return _replay_once(graph, warmup, steps, region_bytes, rng, max(1, warmups), race)


def _replay_once(
    graph: Any,
    warmup: bool,
    steps: int,
    region_bytes: int | None,
    rng: random.Random | None = None,
    warmups: int = 1,
    race: bool = False,
) -> Replay:
    bfc = BFC(region_bytes)
    resident: list[Live] = []
    variables: dict[str, int] = {}
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
        resident += _chunk(bfc, handle, nbytes, label, layer, name)
    for name, nbytes in zip(graph.arguments, graph.argument_bytes, strict=True):
        handle = bfc.allocate(nbytes)
        resident += _chunk(bfc, handle, nbytes, "inputs", "", name)
    fixed = int(graph.inter_op_threads) == 1 or not race
    if warmup:
        for _ in range(warmups if rng is not None else 1):
            seed = rng.random() if rng is not None else None
            order = execution_order(graph, seed) if fixed else None
            _run(graph, bfc, variables, order, seed, race)
    seed = rng.random() if rng is not None else None
    order = execution_order(graph, seed) if fixed else None
    best: Replay | None = None
    before = bfc.in_use
    for _ in range(max(1, steps)):
        bfc.reset_peak()
        before_step = bfc.in_use
        result = _run(graph, bfc, variables, order, seed, race)
        result.resident_bytes = before_step
        result.peak_bytes = before_step + result.step_peak_bytes
        if best is None or result.peak_bytes > best.peak_bytes:
            best = result
    assert best is not None
    best.resident_bytes = before
    best.step_peak_bytes = best.peak_bytes - before
    best.live = resident + best.live
    return best


def execution_order(graph: Any, seed: float | None = None) -> list[int]:
    """Op indices of `graph` in the order the single-thread executor runs them.

    `seed`: each op's successors in an order drawn from it (another process's order)
    instead of grappler's node order.
    """
    ops = graph.ops
    preds, succs, _ = op_dependencies(ops)
    cheap = [op.type in INEXPENSIVE_OPS for op in ops]
    edges = _edge_order(succs, ops, graph)
    if seed is not None:
        rng = random.Random(seed)
        edges = [rng.sample(s, len(s)) for s in edges]
    return single_thread_order(preds, edges, cheap)


def _structure(graph: Any) -> tuple[Any, ...]:
    """What every replay of `graph` reads and none changes, made once per graph.

    Op index by name, each tensor's consumers, each op's predecessors and successors, phase
    and layer, and the tensors the optimizer's ops read (gradients). A sampled process
    replays the same graph many times (`memfit.estimate.bounds`): this is built once.
    """
    cached = graph.__dict__.get("_replay_structure")
    if cached is not None:
        return cached
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
    tree = getattr(graph, "layer_tree", None)
    layers = [tree.layer_of(op.name) if tree else layer_of(op.name, graph.layers) for op in ops]
    # A backward tensor read by the optimizer's ops is a gradient.
    feeds_update: set[str] = set()
    for i, op in enumerate(ops):
        if phases[i] == "update":
            feeds_update.update(op.inputs)
    structure = (index, dict(consumers), preds, succs, phases, layers, feeds_update)
    graph.__dict__["_replay_structure"] = structure
    return structure


def _run(
    graph: Any,
    bfc: BFC,
    variables: dict[str, int] | None = None,
    order: list[int] | None = None,
    seed: float | None = None,
    race: bool = False,
) -> Replay:
    ops = graph.ops
    index, consumers, preds, succs, phases, layers, feeds_update = _structure(graph)
    if seed is not None and order is None:
        # Several inter-op threads: which of the ops made ready together runs first is a race.
        shuffle = random.Random(seed).shuffle
        succs = [list(s) for s in succs]
        for s in succs:
            shuffle(s)

    pending = {name: len(c) for name, c in consumers.items()}
    fetched = set(graph.fetches)
    arguments = set(graph.arguments)
    buffer_of: dict[str, int | None] = {}
    size: dict[int, int] = {}
    request: dict[int, int] = {}
    refs: dict[int, int] = defaultdict(int)
    owner: dict[int, int] = {}
    # The op that allocated each buffer: its layer is the buffer's, as in TensorFlow's memory
    # profile (`memfit measure --explain`), even after an op forwarded it to its own output.
    made_by: dict[int, int] = {}
    category: dict[int, str] = {}
    threads = max(1, int(graph.inter_op_threads))
    start = bfc.in_use
    result = Replay(0, "", "", "forward", "")
    forward_live = [0]
    # Each variable's buffer: the variable holds one reference; a read shares it.
    held = variables if variables is not None else {}
    for name, handle in held.items():
        size[handle] = bfc.size_of(handle)
        request[handle] = round_up(graph.variables[name][0])
        refs[handle] = 1
        owner[handle] = -1
    # The live set at the peak is read once the step ends (a step's peak rises op after op,
    # and reading ~1,000 live buffers at each rise was most of the replay's time): a new
    # peak records its `clock`; a buffer was live then if it was allocated before and freed
    # after. A buffer live then whose owner changes, or whose address is allocated again,
    # is kept as it was in `before_change` first.
    clock = [0]
    born: dict[int, int] = {}
    died: dict[int, int] = {}
    before_change: dict[int, tuple[int, str, int, int, int | None]] = {}
    peak_at: list[Any] = [None]  # (clock, op index, extra) of the peak so far

    def live_at_peak(buffer: int) -> bool:
        return live_at_peak_of(buffer, peak_at[0][0])

    def live_at_peak_of(buffer: int, at: int) -> bool:
        return born.get(buffer, 0) <= at < died.get(buffer, at + 1)

    def keep(buffer: int) -> None:
        if peak_at[0] is not None and buffer not in before_change and live_at_peak(buffer):
            before_change[buffer] = (
                owner[buffer],
                category.get(buffer, ""),
                size[buffer],
                request[buffer],
                made_by.get(buffer),
            )

    def allocate(nbytes: int, op_index: int) -> int:
        buffer = bfc.allocate(nbytes)
        if buffer in died:
            keep(buffer)
        clock[0] += 1
        born[buffer] = clock[0]
        died.pop(buffer, None)
        size[buffer] = bfc.size_of(buffer)
        request[buffer] = round_up(nbytes)
        refs[buffer] = 1
        owner[buffer] = made_by[buffer] = op_index
        category[buffer] = phases[op_index]
        count_forward(buffer, +1)
        return buffer

    def count_forward(buffer: int, sign: int) -> None:
        # Bytes the forward pass made that are still live; their highest is what the
        # forward pass keeps for the backward pass.
        if category.get(buffer) == "forward":
            forward_live[0] += sign * request[buffer]
            result.activations_kept_bytes = max(result.activations_kept_bytes, forward_live[0])

    def release(name: str) -> None:
        buffer = buffer_of.get(name)
        if buffer is None:
            return
        refs[buffer] -= 1
        if refs[buffer] == 0:
            count_forward(buffer, -1)
            clock[0] += 1
            died[buffer] = clock[0]
            bfc.free(buffer)

    def snapshot(op_index: int, extra: list[tuple[int, int, str, int]]) -> None:
        peak_at[0] = (clock[0], op_index, extra)
        before_change.clear()

    def read_back() -> None:
        at, op_index, extra = peak_at[0]
        peak_at[0] = None
        live = []
        for buffer in refs:
            record = before_change.get(buffer)
            if record is None:
                if not live_at_peak_of(buffer, at):
                    continue
                record = (
                    owner[buffer],
                    category.get(buffer, ""),
                    size[buffer],
                    request[buffer],
                    made_by.get(buffer),
                )
            o, cat, chunk, wanted, maker = record
            if chunk and o >= 0:
                layer = layers[o if maker is None else maker]
                live.append(Live(wanted, cat, layer, ops[o].name))
                if chunk > wanted:
                    live.append(Live(chunk - wanted, "fragmentation", layer, ops[o].name))
        for nbytes, chunk, cat, o in extra:
            live.append(Live(nbytes, cat, layers[o], ops[o].name))
            if chunk > nbytes:
                live.append(Live(chunk - nbytes, "fragmentation", layers[o], ops[o].name))
        op = ops[op_index]
        result.live = live
        result.peak_op = op.name
        result.peak_op_type = op.type
        result.peak_phase = phases[op_index]
        result.peak_layer = layers[op_index]

    def _assign(op_index: int, op: Any) -> None:
        # AssignVariableOp adopts its value's buffer when nothing else holds it, else copies
        # in place; AssignAdd/Sub update in place. Either first copies the variable to a new
        # buffer while a read of its old value is still live (copy-on-write,
        # resource_variable_ops.cc), and the variable keeps the new buffer for good.
        old = held[op.variable]
        if op.type == "AssignVariableOp" and len(op.inputs) > 1:
            value = op.inputs[1]
            candidate = buffer_of.get(value)
            if (
                candidate is not None
                and value not in arguments
                and pending.get(value, 0) == 1
                and refs[candidate] == 1
                and request[candidate] == request[old]
            ):
                refs[candidate] += 1
                keep(candidate)
                owner[candidate] = op_index
                held[op.variable] = candidate
                release_buffer(old)
                return
        if refs[old] > 1:
            new = allocate(request[old], op_index)
            held[op.variable] = new
            release_buffer(old)

    def release_buffer(buffer: int) -> None:
        refs[buffer] -= 1
        if refs[buffer] == 0:
            count_forward(buffer, -1)
            clock[0] += 1
            died[buffer] = clock[0]
            bfc.free(buffer)

    def _finish(op_index: int) -> None:
        op = ops[op_index]
        for tensor in op.inputs:
            if tensor in pending:
                pending[tensor] -= 1
                if pending[tensor] == 0 and tensor not in fetched:
                    release(tensor)
        for name in op.outputs:
            if name not in consumers and name not in fetched:
                release(name)
        if threads > 1:
            for j in succs[op_index]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    if not fixed:
                        ready.append(j)
                    queued.add(j)

    for name in graph.arguments:
        buffer_of[name] = None  # held by the caller: counted as resident

    indegree = [len(p) for p in preds]
    recent: list[int] = []
    position: dict[int, int] = {}
    if order is not None or threads == 1 or not race:
        # A fixed order: each thread's depth-first policy (`single_thread_order`). Under
        # several threads the ops made ready and not yet run are the ones that may run beside.
        ready = deque(order if order is not None else execution_order(graph))
        queued = {i for i in range(len(ops)) if indegree[i] == 0} if threads > 1 else set()
        fixed = True
    else:
        ready = deque(i for i in range(len(ops)) if indegree[i] == 0)
        queued = set(ready)
        fixed = False
    while ready:
        i = ready.popleft()
        queued.discard(i)
        op = ops[i]
        position[i] = len(result.order)
        result.order.append(op.name)
        if op.variable in held:
            if op.type == "ReadVariableOp":
                buffer = held[op.variable]
                refs[buffer] += 1
                buffer_of[op.outputs[0]] = buffer
                _finish(i)
                continue
            _assign(i, op)
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
                        keep(buffer)
                        owner[buffer] = i
                        count_forward(buffer, -1)
                        category[buffer] = phases[i]
                        count_forward(buffer, +1)
                        break
            if buffer is None:
                buffer = allocate(nbytes, i)
            buffer_of[name] = buffer
        extra: list[tuple[int, int, str, int]] = []
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
                extra.append((round_up(nbytes), bfc.size_of(handle), "workspace", j))
        now = bfc.in_use - start
        if now > result.step_peak_bytes:
            result.step_peak_bytes = now
            snapshot(i, extra)
        for handle in scratch:
            bfc.free(handle)
        _finish(i)

    # The step's results go back to the caller, who frees them before the next step.
    kept = set(held.values())
    for buffer, count in list(refs.items()):
        if count > 0 and buffer not in kept:
            refs[buffer] = 0
            clock[0] += 1
            died[buffer] = clock[0]
            bfc.free(buffer)
    if peak_at[0] is not None:
        read_back()
    # Label what was live at the peak.
    for item in result.live:
        if item.category == "backward" and _feeds(item.op, ops, index, feeds_update):
            item.category = "gradients"
        elif item.category == "forward":
            item.category = "activations"
        elif item.category in ("backward", "update"):
            item.category = "temporaries"
    return result


def single_thread_order(
    preds: list[set[int]], succs: list[list[int]], cheap: list[bool]
) -> list[int]:
    """The order TensorFlow's executor runs a graph in with one inter-op thread.

    Follows `ExecutorState::Process` / `ScheduleReady` (executor.cc, TF 2.21): a worker runs
    an "inline" queue first in, first out; when an op finishes, its newly ready successors
    that are inexpensive (`OpKernel::IsExpensive()` false: constants, arguments, shape
    and view ops) join the inline queue; of the expensive ones, the last stays inline if
    the queue is empty, and every other is handed to the thread pool, whose single worker
    takes its own tasks last in, first out once the inline queue runs dry. So the step runs
    depth first along one chain while the other ready branches wait on a stack: an
    optimizer update whose gradient is ready waits until the backward chain in progress
    ends.

    Which of several ready successors stays inline follows the order of TensorFlow's
    out-edges: the order of the consumers' nodes in the graph grappler made (an op's
    `EdgeSet` with more than four edges iterates by address instead). `replay` passes
    successors in grappler's node order (`_edge_order`): a convolution's input gradient
    continues inline and its weight gradient (with that weight's update) waits; Adam's
    `square(gradient)` continues inline and `gradient - m` waits.

    Args:
        preds: each op's predecessors (data and control).
        succs: each op's successors, in the order the executor sees them.
        cheap: whether each op's kernel is inexpensive.

    Returns:
        Op indices in execution order.

    Example:
        >>> single_thread_order([set(), {0}, {0}], [[1, 2], [], []], [True, False, False])
        [0, 2, 1]
    """
    indegree = [len(p) for p in preds]
    stack: list[int] = []
    inline: deque[int] = deque()
    order: list[int] = []

    def schedule(ready: list[int]) -> None:
        current = None
        dispatched = []
        for op in ready:
            if cheap[op]:
                inline.append(op)
                continue
            if current is not None:
                dispatched.append(current)
            current = op
        if current is not None:
            if inline:
                dispatched.append(current)
            else:
                inline.append(current)
        stack.extend(dispatched)

    schedule([i for i, count in enumerate(indegree) if count == 0])
    while True:
        while inline:
            op = inline.popleft()
            order.append(op)
            ready = []
            for succ in succs[op]:
                indegree[succ] -= 1
                if indegree[succ] == 0:
                    ready.append(succ)
            if ready:
                schedule(ready)
        if not stack:
            return order
        inline.append(stack.pop())


def _edge_order(succs: list[list[int]], ops: list[Any], graph: Any) -> list[list[int]]:
    """Each op's consumers in the order TensorFlow's executor meets them.

    That is the order of their nodes in the graph grappler made (`StepGraph.node_rank`);
    ops grappler removed or renamed come after, in traced order. Without that order,
    consumers go in reverse traced order (what earlier traces matched for convolutions:
    the input gradient continues inline, the weight gradient waits).
    """
    rank = getattr(graph, "node_rank", None) or {}
    if not rank:
        return [s[::-1] for s in succs]
    missing = len(rank)
    keys = [rank.get(op.name, missing + i) for i, op in enumerate(ops)]
    return [sorted(s, key=keys.__getitem__) for s in succs]


def _chunk(bfc: BFC, handle: int, nbytes: int, category: str, layer: str, op: str) -> list[Live]:
    """The chunk at `handle` as live bytes: the request, and what BFC handed out beyond it."""
    request = round_up(nbytes)
    items = [Live(request, category, layer, op)]
    if bfc.size_of(handle) > request:
        items.append(Live(bfc.size_of(handle) - request, "fragmentation", layer, op))
    return items


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
