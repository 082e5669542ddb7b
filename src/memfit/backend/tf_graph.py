"""TensorFlow internals for estimating: trace a training step's graph without running it.

`trace_step` traces the model's `train_step` (forward, loss, gradients and the optimizer's
update, all in one graph) for a batch given as `TensorSpec`s, so no batch tensor is ever made,
and describes every op in backend-neutral terms for `memfit.estimate`: its outputs' byte sizes,
which input buffer an output aliases (views such as Reshape, variable reads) or may take over
(element-wise kernels that call `forward_input_or_allocate_output`), and the scratch memory its
CPU kernel allocates while it runs (`allocate_temp`).

The kernel facts encoded here are from TensorFlow 2.21's CPU kernels (oneDNN off, as under
emulation) and were checked against allocator traces (`tf.profiler` `MemoryAllocation` events,
region `temp`): see `conv_backprop_scratch_bytes`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend.tf_layers import layer_tree, variable_owners

# Ops whose output is a view of an input buffer (no allocation): output i aliases input i
# (or input 0).
ALIAS_OPS = frozenset(
    {
        "Identity",
        "IdentityN",
        "Reshape",
        "Squeeze",
        "ExpandDims",
        "StopGradient",
        "PreventGradient",
        "Snapshot",
        "EnsureShape",
        "Bitcast",
        "ReadVariableOp",
    }
)
# Kernels that reuse an input buffer for their output when nothing else holds that input
# (`OpKernelContext::forward_input_or_allocate_output`): element-wise ops and a few more.
FORWARDING_OPS = frozenset(
    {
        "Abs", "Add", "AddN", "AddV2", "BiasAdd", "Cast", "DivNoNan", "Elu", "EluGrad", "Erf",
        "Exp", "FloorDiv", "Gelu", "GeluGrad", "LeakyRelu", "LeakyReluGrad", "Log", "Maximum",
        "Minimum", "Mul", "MulNoNan", "Neg", "Pow", "RealDiv", "Reciprocal", "Relu", "Relu6",
        "Relu6Grad", "ReluGrad", "Rsqrt", "RsqrtGrad", "Select", "SelectV2", "Selu", "SeluGrad",
        "Sigmoid", "SigmoidGrad", "Sign", "Softplus", "SoftplusGrad", "Sqrt", "SqrtGrad",
        "Square", "SquaredDifference", "Sub", "Tanh", "TanhGrad", "ClipByValue", "Floor",
        "Round", "Ceil", "Inv", "InvGrad", "ReciprocalGrad", "Xdivy", "Xlogy", "Softsign",
        "SoftsignGrad", "Mish",
    }
)  # fmt: skip
# Ops that write a resource variable in place (the optimizer's update).
ASSIGN_OPS = frozenset(
    {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceScatterUpdate"}
)
# Kernels that allocate nothing the step keeps (constants live in the kernel, made once).
NO_ALLOC_OPS = frozenset({"Const", "NoOp", "Placeholder", "VarHandleOp"})

# Conv2DCustomBackprop{Input,Filter} (conv_grad_{input,filter}_ops.cc) size their im2col buffer
# by an L3 "target working set" of 30 MiB, not by the batch, and Conv2DBackpropInput skips it
# (one image at a time) when each thread's share of one image's work exceeds the L2 size that
# Eigen reports. Both constants were checked against allocator traces on this CPU.
TARGET_WORKING_SET_BYTES = 30 << 20
DEFAULT_L2_BYTES = 256 << 10


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


def _nbytes(shape: Any, dtype: Any) -> int:
    if shape.rank is None or dtype.name in ("resource", "variant", "string"):
        return 0
    dims = [d if d is not None and d >= 0 else 1 for d in shape.as_list()]
    try:
        size = dtype.size
    except (AttributeError, TypeError, ValueError):
        return 0
    return int(math.prod(dims)) * int(size)


def _l2_bytes() -> int:
    value = os.environ.get("MEMFIT_L2_BYTES")
    return int(value) if value and value.isdigit() else DEFAULT_L2_BYTES


def conv_backprop_scratch_bytes(op: Any, intra_threads: int) -> int:
    """Bytes of the im2col buffer TensorFlow's CPU Conv2D backprop kernels allocate.

    Follows `Conv2DCustomBackpropInputOp` / `Conv2DCustomBackpropFilterOp` (TF 2.21, NHWC):
    `shard = ceil(30 MiB / itemsize / work_unit)` images of `out_h*out_w x kh*kw*in_depth`,
    where `work_unit` sums the three matrices of one image's matmul; backprop-input uses one
    image at a time (shard 1) when the batch is 1 or one thread's share of the work is at
    least Eigen's L2 size.
    """
    if op.type == "Conv2DBackpropInput":
        input_shape = op.outputs[0].shape
        filter_shape = op.inputs[1].shape
    else:
        input_shape = op.inputs[0].shape
        filter_shape = op.outputs[0].shape
    backprop_shape = op.inputs[2].shape
    if not (
        input_shape.is_fully_defined()
        and filter_shape.is_fully_defined()
        and backprop_shape.is_fully_defined()
    ):
        return 0
    batch, out_h, out_w, _ = backprop_shape.as_list()
    kh, kw, in_depth, out_depth = filter_shape.as_list()
    itemsize = op.outputs[0].dtype.size
    image = out_h * out_w
    filter_total = kh * kw * in_depth
    work = image * filter_total + image * out_depth + filter_total * out_depth
    if work <= 0:
        return 0
    shard = -(-(TARGET_WORKING_SET_BYTES // itemsize) // work)
    if op.type == "Conv2DBackpropInput" and (
        batch == 1 or work // max(1, intra_threads) >= _l2_bytes() // itemsize
    ):
        shard = 1
    return int(shard * image * filter_total * itemsize)


def xla_grouped_conv_scratch_bytes(op: Any) -> int:
    """Bytes of the temporaries of an XLA-compiled call that backpropagates a grouped conv.

    Keras runs a grouped convolution (`Conv2D(groups=...)`, ConvNeXt's 7x7 "depthwise" one)
    through `tf.function(jit_compile=True)` on TensorFlow, since the CPU kernels do not take
    groups. XLA's CPU backend computes its gradients on the dense filter (kh x kw x all input
    channels x output channels, masked to the groups), holding two buffers of that size while
    the call runs (measured: 2 x 110 MiB for a 7x7, 768-channel one, whatever the batch and
    image size; the input and filter gradients of one call share them).
    """
    if op.type not in ("PartitionedCall", "StatefulPartitionedCall"):
        return 0
    try:
        if not op.get_attr("_XlaMustCompile"):
            return 0
        definition = op.graph._get_function(op.get_attr("f").name).cached_definition
    except (ValueError, AttributeError, TypeError):
        return 0
    args = [arg.name for arg in definition.signature.input_arg]

    def call_input(ref: str) -> Any:
        name = ref.split(":")[0]
        return op.inputs[args.index(name)] if name in args else None

    kernels, activations = [], []
    for node in definition.node_def:
        if node.op == "Conv2DBackpropInput" and len(node.input) > 2:
            kernels.append(call_input(node.input[1]))
            activations.append(call_input(node.input[2]))
        elif node.op == "Conv2DBackpropFilter" and len(node.input) > 2:
            activations.append(call_input(node.input[0]))
    kernel = next((k for k in kernels if k is not None and k.shape.is_fully_defined()), None)
    if kernel is None or kernel.shape.rank != 4:
        return 0
    kh, kw, in_per_group, out_depth = kernel.shape.as_list()
    channels = max(
        (a.shape.as_list()[-1] for a in activations if a is not None and a.shape.rank == 4),
        default=0,
    )
    if not channels or in_per_group >= channels:
        return 0
    return 2 * kh * kw * channels * out_depth * kernel.dtype.size


def schedulable_cpus() -> int:
    """CPUs this process may run on: TensorFlow's default for both thread pools.

    TensorFlow sizes its inter- and intra-op pools by `port::MaxParallelism()`, which counts
    the CPUs in the process's affinity mask (`sched_getaffinity`), not all CPUs of the machine:
    under `taskset -c 1` on a 2-core machine it runs one inter-op thread.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _intra_threads(tf: Any) -> int:
    configured = tf.config.threading.get_intra_op_parallelism_threads()
    return configured or schedulable_cpus()


def _inter_threads(tf: Any) -> int:
    configured = tf.config.threading.get_inter_op_parallelism_threads()
    return configured or schedulable_cpus()


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


@dataclass
class GrapplerNode:
    """A node of the graph grappler makes of the step: position, op type, data inputs."""

    rank: int
    type: str
    inputs: list[str]


def grappler_graph(graph_def: Any, fetches: list[str]) -> dict[str, GrapplerNode]:
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

    Example:
        >>> nodes = grappler_graph(concrete.graph.as_graph_def(), ["Identity:0"])  # doctest: +SKIP
    """
    try:
        from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
        from tensorflow.python.grappler import tf_optimizer

        meta = meta_graph_pb2.MetaGraphDef()
        meta.graph_def.CopyFrom(graph_def)
        fetch = meta_graph_pb2.CollectionDef()
        for name in fetches:
            fetch.node_list.value.append(name)
        meta.collection_def["train_op"].CopyFrom(fetch)
        optimized = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)
    except Exception:  # noqa: BLE001 - a refinement; the replay falls back to the trace
        return {}
    nodes = {}
    for i, node in enumerate(optimized.node):
        inputs = [
            name if ":" in name else f"{name}:0" for name in node.input if not name.startswith("^")
        ]
        nodes[node.name] = GrapplerNode(i, node.op, inputs)
    return nodes


def rewire_as_grappler(ops: list[OpInfo], nodes: dict[str, GrapplerNode]) -> int:
    """Give each op the data inputs grappler gave its node, where both graphs agree.

    Only an op whose node kept its type and whose inputs all exist in the trace is
    rewired; ops nothing reads any more are then pruned (`prune_dead`). Returns how many
    ops changed.
    """
    tensors = {name for op in ops for name in op.outputs}
    original = [list(op.inputs) for op in ops]
    changed = 0
    for op in ops:
        node = nodes.get(op.name)
        if node is None or node.type != op.type or node.inputs == op.inputs:
            continue
        if len(node.inputs) != len(op.inputs) or not all(t in tensors for t in node.inputs):
            continue
        op.inputs = list(node.inputs)
        changed += 1
    if changed and not _acyclic(ops):
        # Matched by name, a node grappler merged or rewrote can take an input from later in
        # the step (ConvNeXt's GELU gradients: a loop across blocks); keep the trace's wiring.
        for op, inputs in zip(ops, original, strict=True):
            op.inputs = inputs
        return 0
    return changed


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


def _acyclic(ops: list[OpInfo]) -> bool:
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


def batch_specs(workload: Any, batch_size: int) -> Any:
    """`TensorSpec`s of a batch of `batch_size` (made from a one-sample batch)."""
    tf = tfb.import_tf()
    x, y = workload.batch(1)
    return tf.nest.map_structure(
        lambda t: tf.TensorSpec([batch_size, *t.shape[1:]], t.dtype), (x, y)
    )


def trace_step(workload: Any, batch_size: int) -> StepGraph:
    """Trace the workload's training step at `batch_size` and describe its ops (no run)."""
    tf = tfb.import_tf()
    model = workload.model
    specs = batch_specs(workload, batch_size)
    function = tf.function(model.train_step, jit_compile=False)
    concrete = function.get_concrete_function(specs)
    graph = concrete.graph
    intra = _intra_threads(tf)

    # Resource placeholders -> variable names.
    handle_to_var: dict[str, str] = {}
    variables: dict[str, tuple[int, str]] = {}
    variable_layers: dict[str, str] = {}
    kinds: dict[int, str] = {}
    for var in model.variables:
        kinds[id(var)] = "weight"
    for var in getattr(model.optimizer, "variables", []) or []:
        kinds.setdefault(id(var), "optimizer")
    for var in workload.state_variables():
        kinds.setdefault(id(var), "other")
    by_handle: dict[int, Any] = {}
    for var in workload.state_variables():
        inner = getattr(var, "value", var)
        handle = getattr(inner, "handle", None)
        if handle is not None:
            by_handle[id(handle)] = var
    tree = layer_tree(model)
    owners = variable_owners(model, tree)
    temps = _initializer_temps(model)
    variable_temps: dict[str, int] = {}
    for external, internal in graph.captures:
        var = by_handle.get(id(external))
        if var is None:
            continue
        name = getattr(var, "path", None) or var.name
        handle_to_var[internal.name] = name
    for var in workload.state_variables():
        name = getattr(var, "path", None) or var.name
        nbytes = int(math.prod(var.shape)) * tf.as_dtype(var.dtype).size
        variables[name] = (nbytes, kinds.get(id(var), "other"))
        if id(var) in owners:
            variable_layers[name] = owners[id(var)]
        variable_temps[name] = temps.get(id(var), 0)

    ops: list[OpInfo] = []
    effects: set[str] = set()
    for op in graph.get_operations():
        if op.type in ASSIGN_OPS or (op.op_def is not None and op.op_def.is_stateful):
            effects.add(op.name)
        outputs = [t.name for t in op.outputs]
        sizes = [_nbytes(t.shape, t.dtype) for t in op.outputs]
        alias: list[int | None] = [None] * len(outputs)
        variable = None
        if op.type in ALIAS_OPS and op.inputs:
            alias = [min(i, len(op.inputs) - 1) for i in range(len(outputs))]
        if op.type in NO_ALLOC_OPS:
            sizes = [0] * len(outputs)
        if op.type == "ReadVariableOp" or op.type in ASSIGN_OPS:
            variable = _resolve_handle(op.inputs[0], handle_to_var) if op.inputs else None
        scratch = 0
        if op.type in ("Conv2DBackpropInput", "Conv2DBackpropFilter"):
            scratch = conv_backprop_scratch_bytes(op, intra)
        else:
            scratch = xla_grouped_conv_scratch_bytes(op)
        ops.append(
            OpInfo(
                name=op.name,
                type=op.type,
                inputs=[t.name for t in op.inputs],
                outputs=outputs,
                output_bytes=sizes,
                control_inputs=[c.name for c in op.control_inputs],
                alias=alias,
                forwards=op.type in FORWARDING_OPS,
                scratch_bytes=scratch,
                variable=variable,
            )
        )
    fetches = [t.name for t in concrete.outputs]
    optimized = grappler_graph(graph.as_graph_def(), fetches)
    rewire_as_grappler(ops, optimized)
    ops = prune_dead(drop_identity_n(ops, fetches), fetches, effects)
    tree.choose_policy(op.name for op in ops)
    arguments = [t.name for t in graph.inputs if t.dtype != tf.resource]
    argument_bytes = [
        _nbytes(graph.get_tensor_by_name(n).shape, graph.get_tensor_by_name(n).dtype)
        for n in arguments
    ]
    return StepGraph(
        ops=ops,
        arguments=arguments,
        argument_bytes=argument_bytes,
        fetches=fetches,
        variables=variables,
        variable_layers=variable_layers,
        layers=_layer_names(model),
        optimizer_name=str(getattr(model.optimizer, "name", "optimizer")),
        # Ops run at once only on different CPUs: more threads than CPUs interleave.
        inter_op_threads=min(_inter_threads(tf), schedulable_cpus()),
        node_rank={name: node.rank for name, node in optimized.items()},
        variable_temps=variable_temps,
        layer_tree=tree,
    )


def _resolve_handle(tensor: Any, handle_to_var: dict[str, str]) -> str | None:
    seen = 0
    while tensor.name not in handle_to_var and tensor.op.inputs and seen < 8:
        tensor = tensor.op.inputs[0]
        seen += 1
    return handle_to_var.get(tensor.name)


def _layer_names(model: Any) -> set[str]:
    names: set[str] = set()
    stack = [model]
    while stack:
        layer = stack.pop()
        for child in getattr(layer, "layers", None) or []:
            names.add(child.name)
            stack.append(child)
    return names


RANDOM_INITIALIZER_TEMPS = 2


def _initializer_temps(model: Any) -> dict[int, int]:
    """Temporary buffers of a variable's size that creating each model variable made.

    Keras draws a random initial value and scales it in separate eager ops (uniform, then
    multiply and add: three buffers of the variable's size, the last one becoming the
    variable's), while constant initializers make the value in one. Allocator traces of
    VGG16, MobileNetV2 and EfficientNetB0 builds show exactly this, and replaying it gives
    their resident bytes to the byte; the holes those temporaries leave decide where the
    step's tensors go. Keyed by `id(variable)`; variables not found are left out (0).
    """
    result: dict[int, int] = {}
    stack = [model]
    seen: set[int] = set()
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        stack.extend(getattr(layer, "layers", None) or [])
        stack.extend(getattr(layer, "_layers", None) or [])
        for var in getattr(layer, "_trainable_variables", []) + getattr(
            layer, "_non_trainable_variables", []
        ):
            base = str(getattr(var, "name", "")).rsplit("/", 1)[-1]
            initializer = None
            for attribute in (f"{base}_initializer", f"{base.replace('_kernel', '')}_initializer"):
                initializer = getattr(layer, attribute, None)
                if initializer is not None:
                    break
            if initializer is None:
                random = base in ("kernel", "embeddings") or base.endswith("_kernel")
            else:
                random = "random" in type(initializer).__module__
            result.setdefault(id(var), RANDOM_INITIALIZER_TEMPS if random else 0)
    return result
