"""The step graph: the ops of a traced training step and the passes that prune it.

`OpInfo` describes one op in backend-neutral terms for `memfit.estimate` (its outputs' byte
sizes, which input buffer an output aliases or may take over, the scratch memory its kernel
allocates while it runs); `StepGraph` is the whole step and what the caller holds. The passes
(`drop_identity_n`, `prune_dead`) remove what TensorFlow removes before the step runs;
`op_dependencies` and `is_acyclic` read the graph's edges. `at_batch_size` makes the step at
another batch size from two traces of it (trace once, replay many).

The graph is made by `memfit.backend.tf_trace.trace_step`, its wiring corrected by
`memfit.backend.tf_grappler`, and replayed by `memfit.estimation.simulate`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

# A tensor's shape as the allocator sizes it: its dimensions (unknown ones as 1) and the bytes
# of one element (0: nothing is allocated for it, whatever its shape).
Shape = tuple[tuple[int, ...], int]


@dataclass
class OpInfo:
    """One op of the step graph, as the allocator sees it.

    Attributes:
        name: the op's name (its name scopes say which layer it belongs to).
        type: the op type (`Conv2D`, `ReadVariableOp`, ...).
        inputs: names of the tensors it reads (`op:index`).
        outputs: names of the tensors it makes.
        output_bytes: bytes of each output (0 where nothing is allocated).
        control_inputs: ops that must run before it.
        alias: for each output, the input index whose buffer it shares, or None.
        forwards: whether its kernel may take over an input buffer for output 0.
        scratch_bytes: temporary bytes its kernel allocates while it runs.
        variable: for a variable read or write, the variable's name.
        output_shapes: each output's `Shape` (dimensions, bytes of an element), from which
            `output_bytes` was computed; empty when unknown.
    """

    name: str
    type: str
    inputs: list[str]
    outputs: list[str]
    output_bytes: list[int]
    control_inputs: list[str] = field(default_factory=list)
    alias: list[int | None] = field(default_factory=list)
    forwards: bool = False
    scratch_bytes: int = 0
    variable: str | None = None
    output_shapes: list[Shape] = field(default_factory=list)


@dataclass
class StepGraph:
    """A traced training step: its ops in graph order, and what the caller holds.

    Attributes:
        ops: every op of the step.
        arguments: tensor names of the batch's inputs and targets (held by the caller).
        argument_bytes: bytes of each argument.
        fetches: tensor names the step returns (the logs).
        variables: name -> (bytes, kind) of each variable, kind one of `weight`,
            `optimizer`, `other`.
        variable_layers: variable name -> the layer that owns it (optimizer slots: the layer
            of the variable they are for).
        layers: names of the model's layers (for attributing ops).
        layer_tree: the model's layers as a `memfit.backend.attribution.LayerTree`, its reading of
            `_N` suffixes chosen from these ops: attributes ops to innermost layers (None:
            `layers` does, outermost first).
        optimizer_name: the optimizer's name scope.
        inter_op_threads: ops the runtime may run at once (inter-op threads, at most the
            CPUs the process may run on).
        variable_temps: variable name -> buffers of its size its initializer made and freed
            when the variable was created (2 for Keras' random initializers: the random
            draw and its scaling; 0 for constants such as zeros).
        node_rank: op name -> its position in the graph grappler makes of the step (the graph
            TensorFlow runs); the executor meets an op's consumers in this order. Empty when
            grappler could not be run.
        batch_size: samples in the traced batch (0: unknown).
        argument_shapes: each argument's `Shape` (empty when unknown).
    """

    ops: list[OpInfo]
    arguments: list[str]
    argument_bytes: list[int]
    fetches: list[str]
    variables: dict[str, tuple[int, str]]
    variable_layers: dict[str, str]
    layers: set[str]
    optimizer_name: str
    inter_op_threads: int
    node_rank: dict[str, int] = field(default_factory=dict)
    variable_temps: dict[str, int] = field(default_factory=dict)
    layer_tree: Any = None
    batch_size: int = 0
    argument_shapes: list[Shape] = field(default_factory=list)


def drop_identity_n(
    ops: list[OpInfo], fetches: list[str], keep: Collection[str] = ()
) -> list[OpInfo]:
    """Remove `IdentityN` ops as grappler's dependency optimizer does before the step runs.

    Keras passes all gradients through one `IdentityN` before the optimizer's update. In the
    traced graph that op is a barrier (no variable's update could start before every gradient
    exists, so every variable's update temporaries would be live at once), but TensorFlow runs
    the grappler-optimized function, whose `DependencyOptimizer` (`SafeToRemoveIdentity`,
    `dependency_optimizer.cc`) deletes `IdentityN` nodes that do not feed the function's
    results and wires each consumer to the matching input: each variable's update starts when
    its own gradient is ready, during the backward pass, and frees its temporaries early.
    Allocator traces of ResNet50 show update kernels (`AssignSubVariableOp`) interleaved with
    backward kernels, which a barrier would rule out.

    `keep`: the `IdentityN`s grappler kept (`tf_grappler.grappler_graph`), which TensorFlow
    runs as barriers: a custom gradient's (`tf.recompute_grad`: each recomputed segment's
    gradients pass through one), whose consumers wait for all of the segment's gradients. In
    RetinaNet's recompute step a pyramid level's head weight gradients reach their sum over
    the levels only with that level's input gradient, so each head kernel's update runs after
    the last read of the kernel (TensorFlow's executor log; dropped, the update copied ten
    kernels a step that TensorFlow never copies).
    """
    fetched = set(fetches)
    renamed: dict[str, str] = {}
    control: dict[str, list[str]] = {}
    producer = {name: op.name for op in ops for name in op.outputs}
    kept: list[OpInfo] = []
    for op in ops:
        if (
            op.type == "IdentityN"
            and op.name not in keep
            and len(op.inputs) == len(op.outputs)
            and not fetched.intersection(op.outputs)
        ):
            renamed.update(zip(op.outputs, op.inputs, strict=True))
            sources = [producer[t] for t in op.inputs if t in producer]
            control[op.name] = list(dict.fromkeys([*sources, *op.control_inputs]))
            continue
        kept.append(op)
    if not renamed:
        return ops
    for op in kept:
        op.inputs = [renamed.get(t, t) for t in op.inputs]
        if any(c in control for c in op.control_inputs):
            expanded = [x for c in op.control_inputs for x in control.get(c, [c])]
            op.control_inputs = list(dict.fromkeys(expanded))
    return kept


def prune_dead(ops: list[OpInfo], fetches: list[str], effects: set[str]) -> list[OpInfo]:
    """Remove ops whose results reach neither the step's results nor an op with effects.

    TensorFlow prunes such ops when it instantiates the function (`PruneFunctionBody`) and
    grappler's model pruner again, so they never run. A traced step has many: TensorFlow's
    `swish` gradient also computes the gradient of its constant `beta` (`square(features)`,
    made as soon as the forward pass has `features`, and a sum), which nothing uses; kept,
    they would hold an activation-sized tensor per swish layer until the backward pass
    (EfficientNetB0 96 px batch 4: +49 MiB predicted that never exists).

    Args:
        ops: the step's ops.
        fetches: tensor names the step returns.
        effects: names of ops that must run for their effects (variable updates, stateful
            ops).

    Returns:
        The ops that run, in their order.
    """
    by_name = {op.name: op for op in ops}
    producer = {name: op.name for op in ops for name in op.outputs}
    stack = [producer[t] for t in fetches if t in producer]
    stack += [op.name for op in ops if op.name in effects]
    live: set[str] = set()
    while stack:
        name = stack.pop()
        if name in live or name not in by_name:
            continue
        live.add(name)
        op = by_name[name]
        stack.extend(producer[t] for t in op.inputs if t in producer)
        stack.extend(op.control_inputs)
    return [op for op in ops if op.name in live]


def op_dependencies(ops: list[Any]) -> tuple[list[set[int]], list[list[int]], list[int]]:
    """Each op's predecessors, successors (graph order) and number of out-edges."""
    index = {op.name: i for i, op in enumerate(ops)}
    producer = {name: i for i, op in enumerate(ops) for name in op.outputs}
    preds: list[set[int]] = [set() for _ in ops]
    edges = [0] * len(ops)
    for i, op in enumerate(ops):
        for name in op.inputs:
            if name in producer:
                preds[i].add(producer[name])
                edges[producer[name]] += 1
        for name in op.control_inputs:
            if name in index:
                preds[i].add(index[name])
                edges[index[name]] += 1
    succs: list[list[int]] = [[] for _ in ops]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)  # in graph order: the ops are visited in order
    return preds, succs, edges


def is_acyclic(ops: list[OpInfo]) -> bool:
    """Whether the ops' data and control inputs form no loop (Kahn's algorithm)."""
    preds, succs, _ = op_dependencies(ops)
    pending = [len(p - {i}) for i, p in enumerate(preds)]
    ready = [i for i, n in enumerate(pending) if n == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for j in succs[i]:
            if j == i:
                continue
            pending[j] -= 1
            if pending[j] == 0:
                ready.append(j)
    return seen == len(ops)


def shape_bytes(shape: Shape) -> int:
    """Bytes of a tensor of `shape` (0 for a tensor nothing is allocated for)."""
    dims, itemsize = shape
    return int(math.prod(dims)) * itemsize if itemsize else 0


def at_batch_size(first: StepGraph, second: StepGraph, batch_size: int) -> StepGraph | None:
    """The step at `batch_size`, made from traces of the same step at two other batch sizes.

    A traced step differs from one batch size to the next only in its tensors' shapes (same
    ops, wiring, grappler order and variables), and each dimension of a tensor is then a
    linear function of the batch size (the batch itself, `batch * height * width` once
    flattened, or a constant): the two traces give that function for every dimension, and
    the shapes at `batch_size` follow exactly, with no trace. Returns None where that does
    not hold and the step must be traced: the traces differ in anything but shapes, a
    dimension would not come out a whole number, a kernel's scratch differs between them,
    a batch size is 1 (kernels choose other algorithms for one sample), or `batch_size`
    equals a dimension that does not change with the batch (code that compares shapes can
    build other ops then: a softmax cross-entropy over 5 classes skips a reshape at batch 5).

    Args:
        first: the step traced at one batch size (`StepGraph.batch_size`).
        second: the same step traced at another.
        batch_size: the batch size wanted.

    Returns:
        A `StepGraph` at `batch_size` sharing the traces' ops' wiring, or None.

    Example:
        ```python
        graph = at_batch_size(trace_step(workload, 8), trace_step(workload, 16), 12)
        ```
    """
    b1, b2 = first.batch_size, second.batch_size
    if min(b1, b2, batch_size) < 2 or b1 == b2 or not _same_step(first, second):
        return None

    def scaled(one: Shape, other: Shape) -> Shape | None:
        (dims1, item1), (dims2, item2) = one, other
        if item1 != item2 or len(dims1) != len(dims2):
            return None
        dims = []
        for d1, d2 in zip(dims1, dims2, strict=True):
            change, rest = divmod((d2 - d1) * (batch_size - b1), b2 - b1)
            if rest or d1 + change < 0:
                return None
            dims.append(d1 + change)
        return tuple(dims), item1

    fixed = {
        d1
        for op1, op2 in zip(first.ops, second.ops, strict=True)
        for (dims1, _), (dims2, _) in zip(op1.output_shapes, op2.output_shapes, strict=True)
        for d1, d2 in zip(dims1, dims2, strict=False)
        if d1 == d2
    }
    if batch_size in fixed:
        return None
    ops = []
    for op1, op2 in zip(first.ops, second.ops, strict=True):
        if op1.scratch_bytes != op2.scratch_bytes:
            return None
        shapes = [scaled(a, b) for a, b in zip(op1.output_shapes, op2.output_shapes, strict=True)]
        if any(shape is None for shape in shapes):
            return None
        sizes = [shape_bytes(shape) for shape in shapes]  # type: ignore[arg-type]
        ops.append(dataclasses.replace(op1, output_bytes=sizes, output_shapes=shapes))
    pairs = zip(first.argument_shapes, second.argument_shapes, strict=True)
    arguments = [scaled(a, b) for a, b in pairs]
    if any(shape is None for shape in arguments):
        return None
    return dataclasses.replace(
        first,
        ops=ops,
        argument_bytes=[shape_bytes(shape) for shape in arguments],  # type: ignore[arg-type]
        argument_shapes=arguments,
        batch_size=batch_size,
    )


def _same_step(first: StepGraph, second: StepGraph) -> bool:
    """Whether two traces are the same step but for their tensors' shapes.

    Names may differ in their outermost scope alone: a name scope used before in the first
    trace (the optimizer's `sgd` taken while its variables were made) is `sgd_1` there and
    `sgd` in the next; such scopes must map one to one throughout.
    """
    if len(first.ops) != len(second.ops) or len(first.argument_shapes) != len(first.arguments):
        return False
    if len(first.argument_shapes) != len(second.argument_shapes):
        return False
    for graph in (first, second):
        if [shape_bytes(s) for s in graph.argument_shapes] != graph.argument_bytes:
            return False
    scopes: dict[str, str] = {}
    for a, b in zip(first.ops, second.ops, strict=True):
        head_a, _, rest_a = a.name.partition("/")
        head_b, _, rest_b = b.name.partition("/")
        if rest_a != rest_b or scopes.setdefault(head_b, head_a) != head_a:
            return False
    if len(set(scopes.values())) != len(scopes):
        return False

    def renamed(name: str) -> str:
        head, sep, rest = name.partition("/")
        return scopes.get(head, head) + sep + rest

    def names(items: list[str]) -> list[str]:
        return [renamed(name) for name in items]

    for a, b in zip(first.ops, second.ops, strict=True):
        if (
            a.type != b.type
            or a.inputs != names(b.inputs)
            or a.outputs != names(b.outputs)
            or set(a.control_inputs) != set(names(b.control_inputs))  # their order is not kept
            or a.alias != b.alias
            or a.forwards != b.forwards
            or a.variable != b.variable
            or len(a.output_shapes) != len(a.outputs)
            or len(b.output_shapes) != len(b.outputs)
            or [shape_bytes(s) for s in a.output_shapes] != a.output_bytes
            or [shape_bytes(s) for s in b.output_shapes] != b.output_bytes
        ):
            return False
    return (
        first.arguments == names(second.arguments)
        and first.fetches == names(second.fetches)
        and first.variables == second.variables
        and first.variable_layers == second.variable_layers
        and first.layers == second.layers
        and first.optimizer_name == second.optimizer_name
        and first.inter_op_threads == second.inter_op_threads
        and first.node_rank == {renamed(name): rank for name, rank in second.node_rank.items()}
        and first.variable_temps == second.variable_temps
    )
