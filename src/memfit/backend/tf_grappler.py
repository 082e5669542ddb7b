"""Grappler: run TensorFlow's graph optimizer on the traced step and read its graph back.

A `tf.function` runs the graph grappler makes of the step, not the traced one: its node order
(the order the executor meets an op's consumers) and its wiring (multiplications by one
dropped) decide what is live when. `grappler_graph` runs the meta optimizer;
`rewire_as_grappler` gives the traced ops grappler's data inputs where both graphs agree.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend.tf_graph import OpInfo, is_acyclic


@dataclass
class GrapplerNode:
    """A node of the graph grappler makes of the step: position, op type, data inputs."""

    rank: int
    type: str
    inputs: list[str]


def grappler_graph(
    graph_def: Any, fetches: list[str], control_outputs: Sequence[str] = ()
) -> dict[str, GrapplerNode]:
    """The graph grappler's meta optimizer makes of `graph_def` (the graph TensorFlow runs).

    A `tf.function` runs that graph, not the traced one. Its node order matters: the
    executor meets an op's consumers in the order of their nodes (`Graph` adds an op's
    out-edges as it converts the nodes in order), and with one inter-op thread the last
    ready expensive consumer continues inline while the others wait on the pool's stack.
    Allocator traces of VGG16 and MobileNetV2 steps show a convolution's weight gradient
    (listed before its input gradient) waiting, and Adam's `square(gradient)` chain (listed
    after `gradient - m`) continuing inline. Its wiring matters too: grappler drops
    multiplications by a constant one (swish's `beta * features`), so what they made never
    exists. Returns {} when grappler cannot run on the graph (the caller keeps the trace).

    `control_outputs`: the ops the function runs for their effects (`FuncGraph.
    control_outputs`: variable reads and updates). The runtime hands grappler a function's
    control outputs as nodes to fetch, beside its outputs (the call's output control node);
    fetched here the same way (through one `NoOp`), grappler orders the nodes as the runtime's
    does. Without them it put 27 of MobileNetV2's 51 convolutions' two gradients in the other
    order in its recompute step (96 px b16), and with one inter-op thread the weight gradients
    TensorFlow leaves waiting ran at once in the replay (`_control_outputs_node`).

    Example:
        >>> nodes = grappler_graph(concrete.graph.as_graph_def(), ["Identity:0"])  # doctest: +SKIP
    """
    try:
        from tensorflow.core.protobuf import meta_graph_pb2
        from tensorflow.python.grappler import tf_optimizer

        meta = meta_graph_pb2.MetaGraphDef()
        meta.graph_def.CopyFrom(graph_def)
        fetch = meta_graph_pb2.CollectionDef()
        for name in fetches:
            fetch.node_list.value.append(name)
        controls = _control_outputs_node(meta.graph_def, control_outputs)
        if controls is not None:
            fetch.node_list.value.append(controls)
        meta.collection_def["train_op"].CopyFrom(fetch)
        optimized = tf_optimizer.OptimizeGraph(grappler_config(), meta)
    except Exception:  # noqa: BLE001 - a refinement; the replay falls back to the trace
        return {}
    nodes = {}
    for i, node in enumerate(optimized.node):
        if node.name == CONTROL_OUTPUTS_NODE:
            continue
        inputs = [
            name if ":" in name else f"{name}:0" for name in node.input if not name.startswith("^")
        ]
        nodes[node.name] = GrapplerNode(i, node.op, inputs)
    return nodes


# The `NoOp` through which `grappler_graph` fetches the function's control outputs.
CONTROL_OUTPUTS_NODE = "memfit_control_outputs"


def _control_outputs_node(graph_def: Any, control_outputs: Sequence[str]) -> str | None:
    """Add to `graph_def` a `NoOp` that waits on `control_outputs` (those in the graph).

    TensorFlow's function runtime gives grappler a function's control outputs to fetch
    (inlined into its caller, they are the call's output control node, which the caller's
    result waits on). They decide its node order: MobileNetV2's recompute step (96 px b16)
    optimised with them as the runtime's graph dump and executor log show it (51 of 51
    convolutions' gradients in the runtime's order, 5 adjacent nodes out of place in 9,000),
    without them 24 of 51 (461 out of place). The node waits on them in the graph's node
    order, so that every process gets the same graph. Returns the node's name, None if none
    is in the graph.
    """
    # In the graph's node order: `FuncGraph.control_outputs` comes from a set of ops, whose
    # order changes from one process to the next, and so would grappler's node order.
    wanted = set(control_outputs)
    inputs = [f"^{node.name}" for node in graph_def.node if node.name in wanted]
    if not inputs:
        return None
    node = graph_def.node.add()
    node.name = CONTROL_OUTPUTS_NODE
    node.op = "NoOp"
    node.input.extend(inputs)
    return CONTROL_OUTPUTS_NODE


def grappler_config(gpus: bool | None = None) -> Any:
    """The meta optimizer's `ConfigProto`: the default, less passes that cannot change the nodes.

    Two of the default passes never change what `grappler_graph` reads (the nodes, their
    order and their data inputs) and cost a third of grappler's time (ResNet50 224 px b32:
    3.0 instead of 4.2 CPU-s):

    - the TFG optimizer (MLIR passes: attribute round trips, shape annotations, a
      topological sort of a graph grappler's own passes keep sorted, sinking ops into
      control-flow branches, dropping unused functions), run in both iterations and after;
    - the layout optimizer, which converts convolutions to NCHW for GPUs only (with no GPU
      it converts nothing); it stays on when TensorFlow sees a GPU (`gpus`, default: asks).

    With both off the node dicts were equal, name for name, to the default config's on the
    16 steps of `bench/grappler_config.py`: ResNet50 (and under mixed_float16), MobileNetV2
    (and with recompute sqrt, and SGD), EfficientNetB0, DenseNet121, InceptionV3, VGG16,
    NASNetMobile, ConvNeXtTiny (XLA function calls), an LSTM/GRU model (while loops),
    keras-hub's RetinaNet (a cond; and with recompute), a dense MLP and a ViT. The other
    passes change nodes: without the remapper (it fuses nothing in these unplaced graphs)
    its topological sort is missing and nodes move (MobileNetV2: 140); without the memory
    optimizer RetinaNet's `AddN`s are not turned into accumulators.
    """
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2

    if gpus is None:
        gpus = sees_gpu()
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.disable_tfg_optimizer = True
    if not gpus:
        rewrite.layout_optimizer = rewriter_config_pb2.RewriterConfig.OFF
    return config


def sees_gpu() -> bool:
    """Whether grappler runs as for a process that sees a GPU (see `grappler_config`).

    What TensorFlow sees here (asked once: every traced step's grappler pass needs it),
    unless `describe_as` said otherwise.
    """
    return _described_as[-1] if _described_as else _tensorflow_sees_gpu()


def describe_as(gpus: bool) -> None:
    """Run grappler from now on as a process that sees a GPU (`gpus`) or none runs it.

    For a helper process that describes another process's steps with its GPUs hidden
    (`memfit.estimation.child.open_what_if_estimator`): its steps are then the other's.

    Example:
        ```python
        describe_as(gpus=True)  # the layout optimizer stays on, as beside a GPU
        ```
    """
    _described_as[:] = [bool(gpus)]


_described_as: list[bool] = []


@functools.cache
def _tensorflow_sees_gpu() -> bool:
    return bool(tfb.import_tf().config.list_physical_devices("GPU"))


def rewire_as_grappler(ops: list[OpInfo], nodes: dict[str, GrapplerNode]) -> int:
    """Give each op the data inputs grappler gave its node, where both graphs agree.

    Only an op whose node kept its type and whose inputs all exist in the trace is
    rewired; ops nothing reads any more are then pruned (`prune_dead`). An `IdentityN`
    grappler kept with fewer inputs loses the outputs it dropped, where nothing reads them
    (`_drop_unread_outputs`). Returns how many ops changed.
    """
    tensors = {name for op in ops for name in op.outputs}
    original = [list(op.inputs) for op in ops]
    changed = 0
    read = {name for op in ops for name in op.inputs}
    narrowed: list[tuple[OpInfo, dict[str, Any]]] = []
    for op in ops:
        node = nodes.get(op.name)
        if node is None or node.type != op.type or node.inputs == op.inputs:
            continue
        if not all(t in tensors for t in node.inputs):
            continue
        if len(node.inputs) < len(op.inputs) and op.type == "IdentityN":
            before = _drop_unread_outputs(op, len(node.inputs), read)
            if before is not None:
                narrowed.append((op, before))
        if len(node.inputs) != len(op.inputs):
            continue
        op.inputs = list(node.inputs)
        changed += 1
    if changed and not is_acyclic(ops):
        # Matched by name, a node grappler merged or rewrote can take an input from later in
        # the step (ConvNeXt's GELU gradients: a loop across blocks); keep the trace's wiring.
        for op, before in narrowed:
            vars(op).update(before)
        for op, inputs in zip(ops, original, strict=True):
            op.inputs = inputs
        return 0
    return changed


def _drop_unread_outputs(op: OpInfo, count: int, read: set[str]) -> dict[str, Any] | None:
    """Keep the first `count` inputs and outputs of an `IdentityN` whose others nothing reads.

    A custom gradient's `IdentityN` (`tf.recompute_grad`) passes the gradients of its
    segment's inputs and variables, then tensors nothing reads; grappler keeps the node and
    drops those. Returns the fields as they were (None: unchanged, a later output is read).
    """
    if any(name in read for name in op.outputs[count:]):
        return None
    fields = ("inputs", "outputs", "output_bytes", "alias", "output_shapes")
    before = {name: getattr(op, name) for name in fields}
    for name in fields:
        setattr(op, name, before[name][:count])
    return before
