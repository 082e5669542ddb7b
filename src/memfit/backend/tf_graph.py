"""The step graph: the ops of a traced training step and the passes that prune it.

`OpInfo` describes one op in backend-neutral terms for `memfit.estimate` (its outputs' byte
sizes, which input buffer an output aliases or may take over, the scratch memory its kernel
allocates while it runs); `StepGraph` is the whole step and what the caller holds. The passes
(`drop_identity_n`, `prune_dead`) remove what TensorFlow removes before the step runs;
`op_dependencies` and `is_acyclic` read the graph's edges.

The graph is made by `memfit.backend.tf_trace.trace_step`, its wiring corrected by
`memfit.backend.tf_grappler`, and replayed by `memfit.estimate.simulate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
        layer_tree: the model's layers as a `memfit.attribution.LayerTree`, its reading of
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


def drop_identity_n(ops: list[OpInfo], fetches: list[str]) -> list[OpInfo]:
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
    """
    fetched = set(fetches)
    renamed: dict[str, str] = {}
    control: dict[str, list[str]] = {}
    producer = {name: op.name for op in ops for name in op.outputs}
    kept: list[OpInfo] = []
    for op in ops:
        if (
            op.type == "IdentityN"
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
        for p in sorted(ps):
            succs[p].append(i)
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
