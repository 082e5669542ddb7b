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
    """Op indices of `graph` in the order the single-thread executor runs them.

    Args:
        graph: the traced step (`memfit.backend.tf_graph.StepGraph`).
        seed: each op's successors in an order drawn from it (another process's order)
            instead of grappler's node order.

    Example:
        >>> [graph.ops[i].name for i in execution_order(graph)][:3]  # doctest: +SKIP
        ['data', 'model/conv/ReadVariableOp', 'model/conv/Conv2D']
    """
    ops = graph.ops
    preds, succs, _ = op_dependencies(ops)
    cheap = [op.type in INEXPENSIVE_OPS for op in ops]
    edges = _edge_order(succs, ops, graph)
    if seed is not None:
        rng = random.Random(seed)
        edges = [rng.sample(s, len(s)) for s in edges]
    return single_thread_order(preds, edges, cheap)


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
