"""The order TensorFlow's executor runs a step's ops in.

`single_thread_order` follows the executor's own policy (`ExecutorState::ScheduleReady`): one
chain runs inline, depth first; the other ready expensive ops wait on the pool's stack. Each
inter-op thread runs that way, so `memfit.estimation.simulate` plays this order under one
thread or several. `execution_order` applies it to a traced step, its successors in the order
TensorFlow meets them (grappler's node order, or an order drawn from a seed: another
process); `depends_on` tells whether one op needs another's outputs (ops that may run side
by side).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from typing import Any

from memfit.backend.tf_graph import op_dependencies

# Kernels whose `IsExpensive()` is false: the executor runs them inline, never via the pool.
INEXPENSIVE_OPS = frozenset(
    {
        "Const", "Placeholder", "NoOp", "Identity", "IdentityN", "Shape", "ShapeN", "Rank",
        "Size", "Reshape", "Squeeze", "ExpandDims", "VarHandleOp", "StopGradient",
    }
)  # fmt: skip


def execution_order(graph: Any, seed: float | None = None) -> list[int]:
    """Op indices of `graph` in the order TensorFlow's executor starts them.

    With one inter-op thread, `single_thread_order`; with several, `threaded_order`: each
    thread runs depth first and an idle thread takes the oldest op another one handed to the
    pool, so two branches made ready together (a detector's box and class heads) run side by
    side, each depth first.

    Args:
        graph: the traced step (`memfit.backend.tf_graph.StepGraph`).
        seed: each op's successors in an order drawn from it (another process's order)
            instead of grappler's node order.

    Example:
        >>> [graph.ops[i].name for i in execution_order(graph)][:3]  # doctest: +SKIP
        ['data', 'model/conv/ReadVariableOp', 'model/conv/Conv2D']
    """
    preds, edges, cheap, threads = _executor_inputs(graph, seed)
    if threads == 1:
        return single_thread_order(preds, edges, cheap)
    return threaded_order(preds, edges, cheap, op_seconds(graph), threads)


def execution_events(graph: Any, seed: float | None = None) -> list[int]:
    """`execution_order` with each op's end: op `i` starts at `i`, ends at `~i` (negative).

    With one inter-op thread an op ends before the next starts (`~i` right after `i`). With
    several, `threaded_events`: an op ends when `threaded_order`'s clock says, and the ops
    the other threads start meanwhile find its inputs still held, as the executor holds an
    op's inputs until its kernel returns (a buffer a running op reads cannot be taken over
    by another op, and a weight it reads is copied before an update).

    Example:
        >>> events = execution_events(graph)  # doctest: +SKIP
        >>> [e for e in events if e >= 0] == execution_order(graph)  # doctest: +SKIP
        True
    """
    if seed is None:
        # Grappler's order is the same in every replay of the graph: played once (again
        # where the ops' costs kept on the graph, `op_seconds`, were replaced since).
        cached = _cached(graph, "_execution_events")
        if cached is None or cached[0] is not graph.__dict__.get("_op_seconds"):
            events = _events(graph, None)
            cached = (graph.__dict__.get("_op_seconds"), events)
            graph.__dict__["_execution_events"] = (_graph_key(graph), cached)
        return list(cached[1])
    return _events(graph, seed)


def _events(graph: Any, seed: float | None) -> list[int]:
    """`execution_events`, played (no cache)."""
    preds, edges, cheap, threads = _executor_inputs(graph, seed)
    if threads == 1:
        return [e for i in single_thread_order(preds, edges, cheap) for e in (i, ~i)]
    return threaded_events(preds, edges, cheap, op_seconds(graph), threads)


def _graph_key(graph: Any) -> tuple[Any, ...]:
    """What the executor's order of `graph` follows: a cache's key (`_cached`).

    Its ops (a pass that prunes the step makes a new list) and their count, grappler's node
    order and the inter-op threads (a copy of a graph may run under other threads).
    """
    threads = max(1, int(getattr(graph, "inter_op_threads", 1) or 1))
    return graph.ops, len(graph.ops), getattr(graph, "node_rank", None), threads


def _cached(graph: Any, name: str) -> Any:
    """What `graph.__dict__[name]` holds, if it was made for the graph as it is now."""
    cached = graph.__dict__.get(name)
    if cached is None:
        return None
    (ops, count, rank, threads), key = cached[0], _graph_key(graph)
    same = ops is key[0] and count == key[1] and rank is key[2] and threads == key[3]
    return cached[1] if same else None


def graph_dependencies(graph: Any) -> tuple[list[set[int]], list[list[int]], list[int]]:
    """`op_dependencies` of `graph.ops`: made once per graph and cached on it (read only).

    Example:
        >>> preds, succs, out_edges = graph_dependencies(graph)  # doctest: +SKIP
    """
    ops = graph.ops
    cached = graph.__dict__.get("_dependencies")
    if cached is None or cached[0] is not ops or cached[1] != len(ops):
        cached = graph.__dict__["_dependencies"] = (ops, len(ops), op_dependencies(ops))
    return cached[2]


def _executor_inputs(
    graph: Any, seed: float | None
) -> tuple[list[set[int]], list[list[int]], list[bool], int]:
    """What the executor's order follows: each op's predecessors, its successors in the
    order the executor meets them (drawn from `seed` when given), whether its kernel is
    inexpensive, and the inter-op threads.

    A drawn order shuffles every op's successors, wider than TensorFlow's own variation under
    one inter-op thread (an `EdgeSet` keeps up to four out-edges in an array in the graph's
    node order; only more than four go to a hash set whose order can change between
    processes). The width stands in for what the replay does not model: the threads' timing,
    which changes from one step to the next, and the allocator histories it leaves. Shuffling
    only the hash sets brought ResNet50's recompute step (224 px b32, default threading)
    from +5.0% to -1.4%, but the accuracy benchmark's default-threading median from 2.1% to
    3.1% and its coverage from 64 to 59 of 64 cases; under one thread only, the pinned
    coverage from 63 to 61 (bench/history/estimate_accuracy.md, "A sampled process's orders").

    All but the drawn order are the same for every order of the graph (a sampled process
    draws one for each of its steps): made once and cached on the graph.
    """
    inputs = _cached(graph, "_executor_inputs")
    if inputs is None:
        ops = graph.ops
        preds, succs, out_edges = graph_dependencies(graph)
        cheap = [op.type in INEXPENSIVE_OPS for op in ops]
        inputs = preds, _edge_order(succs, out_edges, ops, graph), cheap
        graph.__dict__["_executor_inputs"] = (_graph_key(graph), inputs)
    preds, edges, cheap = inputs
    if seed is not None:
        rng = random.Random(seed)
        edges = [rng.sample(s, len(s)) for s in edges]
    return preds, edges, cheap, _graph_key(graph)[3]


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


def threaded_order(
    preds: list[set[int]],
    succs: list[list[int]],
    cheap: list[bool],
    seconds: list[float],
    threads: int,
) -> list[int]:
    """The order TensorFlow's executor starts a graph's ops in with several inter-op threads.

    Each thread follows `ExecutorState::ScheduleReady` as in `single_thread_order`: it runs
    its inline queue, keeps the last newly ready expensive op inline and hands the others to
    the inter-op pool. The pool (Eigen's `NonBlockingThreadPool`) puts a task a worker
    schedules at the front of that worker's own queue; a worker takes its own newest task
    first, and a worker with nothing to do steals the oldest task of another's queue. So the
    threads run depth first side by side: when a loss gradient makes a detector's box head
    and class head ready, one thread continues into one head and the other steals the
    other, and each takes the pyramid levels' chains and their weight gradients in its own
    depth-first order. Which op a thread finds when it steals depends on how long the ops
    take: `seconds` (`op_seconds`), a rough cost; the order of ops that start together
    follows the threads' numbers.

    Args:
        preds: each op's predecessors (data and control).
        succs: each op's successors, in the order the executor sees them.
        cheap: whether each op's kernel is inexpensive (run inline, never via the pool).
        seconds: each op's rough run time.
        threads: inter-op threads.

    Returns:
        Op indices in the order they start; one thread gives `single_thread_order`.

    Example:
        >>> threaded_order([set(), {0}, {0}, {1}], [[1, 2], [3], [], []],
        ...                [True, False, False, False], [0.0, 1.0, 1.0, 1.0], 2)
        [0, 2, 1, 3]
    """
    return [e for e in threaded_events(preds, succs, cheap, seconds, threads) if e >= 0]


def threaded_events(
    preds: list[set[int]],
    succs: list[list[int]],
    cheap: list[bool],
    seconds: list[float],
    threads: int,
) -> list[int]:
    """`threaded_order`'s starts and ends, by its clock: `i` starts op `i`, `~i` ends it.

    An op ends `seconds[i]` after it starts; the ops other threads start in the meantime
    come between its start and its end. Ends at one moment come before the starts then.

    Example:
        >>> threaded_events([set(), {0}, {0}, {1}], [[1, 2], [3], [], []],
        ...                 [True, False, False, False], [0.0, 1.0, 2.0, 1.0], 2)
        [0, -1, 2, 1, -2, 3, -3, -4]
    """
    indegree = [len(p) for p in preds]
    inline: list[deque[int]] = [deque() for _ in range(threads)]
    queue: list[deque[int]] = [deque() for _ in range(threads)]  # left: newest
    busy = [False] * threads
    clock: list[tuple[float, int, int, int]] = []
    order: list[int] = []
    events: list[tuple[float, int]] = []  # (when, op that starts or ~op that ends)
    now = 0.0

    def schedule(worker: int, ready: list[int]) -> None:
        current = None
        for op in ready:
            if cheap[op]:
                inline[worker].append(op)
                continue
            if current is not None:
                queue[worker].appendleft(current)
            current = op
        if current is not None:
            if inline[worker]:
                queue[worker].appendleft(current)
            else:
                inline[worker].append(current)

    def take(worker: int) -> int | None:
        if inline[worker]:
            return inline[worker].popleft()
        if queue[worker]:
            return queue[worker].popleft()
        for other in range(worker + 1, worker + threads):
            victim = queue[other % threads]
            if victim:
                return victim.pop()
        return None

    def start_idle(first: int) -> None:
        for k in range(threads):
            worker = (first + k) % threads
            if busy[worker]:
                continue
            op = take(worker)
            if op is None:
                continue
            busy[worker] = True
            order.append(op)
            events.append((now, op))
            heapq.heappush(clock, (now + seconds[op], len(order), worker, op))

    # The step's first ops, as `single_thread_order` takes them: the first thread's.
    schedule(0, [i for i, count in enumerate(indegree) if count == 0])
    start_idle(0)
    while clock:
        now, _, worker, op = heapq.heappop(clock)
        busy[worker] = False
        # Other threads' starts at this same moment come after this end (a thread whose op
        # ended at this moment started its next one before this end was popped).
        place = len(events)
        while place and events[place - 1][0] == now and events[place - 1][1] not in (op, ~op):
            if events[place - 1][1] < 0:
                break  # another end at this moment: this one goes after it
            place -= 1
        events.insert(place, (now, ~op))
        ready = []
        for succ in succs[op]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                ready.append(succ)
        if ready:
            schedule(worker, ready)
        start_idle(worker)
    return [event for _, event in events]


# Rough speeds of this model of a CPU step (`op_seconds`): what matters is which of two ops
# that run side by side ends first, not the step's time.
FLOPS_PER_SECOND = 2e10
BYTES_PER_SECOND = 4e9
OP_SECONDS = 2e-6
_CONVOLUTIONS = frozenset({"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"})
_DEPTHWISE = frozenset(
    {"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
     "DepthwiseConv2dNativeBackpropFilter"}
)  # fmt: skip
_MATMULS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
_REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod"})
# A reduction over the outer axes that keeps the innermost one (a batch norm's `Mean` over
# batch and pixels, its gradient's `Sum`s) reads its input about as slowly as an elementwise
# product of two such tensors runs: 0.9-1.8 times `x * g` on seven NHWC shapes (2.5-150 MiB,
# this 2-core CPU, under the emulated BFC allocator), where the bytes count puts it at a
# third. It counts its input bytes this many times. Reductions over the innermost axis run
# at the elementwise ops' speed (0.2-0.8 times `x * g`) and count their bytes once.
OUTER_REDUCTION_BYTES = 4


def op_seconds(graph: Any) -> list[float]:
    """A rough run time for each op of `graph`: its arithmetic and the bytes it touches.

    Convolutions and their gradients count their multiply-adds (the kernel's taps and input
    channels for each element of the output, or of the output's gradient); matrix products
    theirs; other ops the bytes they read and write. Inexpensive kernels (`INEXPENSIVE_OPS`)
    take no time.

    Args:
        graph: the traced step (`memfit.backend.tf_graph.StepGraph`).

    Example:
        >>> seconds = op_seconds(graph)  # doctest: +SKIP
    """
    ops = graph.ops
    cached = graph.__dict__.get("_op_seconds")
    if cached is not None and cached[0] is ops:
        return cached[1]
    shape_of: dict[str, tuple[tuple[int, ...], int]] = {}
    for op in ops:
        for name, shape in zip(op.outputs, op.output_shapes, strict=False):
            shape_of[name] = shape

    def elements(name: str) -> int:
        shape = shape_of.get(name)
        return math.prod(shape[0]) if shape is not None else 0

    seconds = []
    for op in ops:
        if op.type in INEXPENSIVE_OPS:
            seconds.append(0.0)
            continue
        touched = sum(op.output_bytes) + sum(
            elements(name) * shape_of[name][1] for name in op.inputs if name in shape_of
        )
        flops = 0
        sizes = [elements(name) for name in op.inputs]
        if op.type in _CONVOLUTIONS and len(op.inputs) == 3 and op.output_shapes:
            kernel = shape_of.get(op.inputs[1], ((),))[0]
            # Both gradients do the forward's multiply-adds: one per output-gradient element
            # (input 2), kernel tap and input channel. Counting the larger of that and the
            # op's output as pixels made MobileNet's conv_pw_13 filter gradient (its output,
            # the kernel, 1x1x1024x1024 against 8x4x4x1024 at 128 px batch 8) 8 times too
            # slow, and its Adam update wait in the replay; a projection's input gradient
            # (its output, 384 channels against 64) 6 times.
            if op.type == "Conv2DBackpropFilter":
                kernel = op.output_shapes[0][0]
            image = sizes[2]
            if len(kernel) == 4:
                flops = 2 * image * kernel[0] * kernel[1] * kernel[2]
        elif op.type in _CONVOLUTIONS and len(op.inputs) == 2:
            kernel = shape_of.get(op.inputs[1], ((),))[0]
            if len(kernel) == 4 and op.output_shapes:
                flops = 2 * math.prod(op.output_shapes[0][0]) * math.prod(kernel[:3])
        elif op.type in _DEPTHWISE:
            flops = 2 * 9 * max(sizes + [0])
        elif op.type in _MATMULS and len(sizes) >= 2 and op.output_shapes:
            flops = 2 * int(math.sqrt(sizes[0] * sizes[1] * math.prod(op.output_shapes[0][0])))
        elif op.type in _REDUCTIONS and op.inputs and op.output_shapes:
            shape, out = shape_of.get(op.inputs[0], ((), 0))[0], op.output_shapes[0][0]
            if len(shape) > 1 and out and out[-1] == shape[-1] and math.prod(out) < sizes[0]:
                touched += (OUTER_REDUCTION_BYTES - 1) * sizes[0] * shape_of[op.inputs[0]][1]
        seconds.append(OP_SECONDS + flops / FLOPS_PER_SECOND + touched / BYTES_PER_SECOND)
    graph.__dict__["_op_seconds"] = (ops, seconds)  # each sampled process replays the graph
    return seconds


def _edge_order(
    succs: list[list[int]], out_edges: list[int], ops: list[Any], graph: Any
) -> list[list[int]]:
    """Each op's consumers in the order TensorFlow's executor meets them.

    An op's out-edges are an `EdgeSet`: up to four are kept in a small array, in the order
    grappler's graph lists their consumers (`StepGraph.node_rank`); ops grappler removed or
    renamed come after, in traced order. More than four go to a hash set of the edges'
    addresses, which iterates in the order the edges were made: the consumers' traced order
    (RetinaNet's loss gradient feeds the five pyramid levels' `Slice`s; TensorFlow's
    allocator profile shows the levels run in the reverse of their traced order, as
    depth-first scheduling of successors met in traced order runs them). Without grappler's
    order, consumers go in reverse traced order (what earlier traces matched for
    convolutions: the input gradient continues inline, the weight gradient waits).
    `out_edges`: each op's out-edges as TensorFlow's graph counts them, one per input read
    and per control input (`op_dependencies`).
    """
    rank = getattr(graph, "node_rank", None) or {}
    missing = len(rank)
    keys = [rank.get(op.name, missing + i) for i, op in enumerate(ops)]
    return [
        sorted(s)
        if out_edges[i] > EDGE_SET_INLINE
        else sorted(s, key=keys.__getitem__)
        if rank
        else sorted(s, reverse=True)
        for i, s in enumerate(succs)
    ]


# `EdgeSet::kInline` (graph/edgeset.h): out-edges kept in an array, in insertion order.
EDGE_SET_INLINE = 4


def depends_on(op: int, other: int, preds: list[set[int]], position: dict[int, int]) -> bool:
    """Whether `op` (transitively) needs `other`'s outputs; only ops run since `other` count.

    Args:
        op: the op about to run.
        other: an op run before it.
        preds: each op's predecessors.
        position: each op run so far -> its place in the run.

    Example:
        >>> depends_on(2, 0, [set(), {0}, {1}], {0: 0, 1: 1})
        True
    """
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
