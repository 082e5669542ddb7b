"""Tracing: describe a training step's graph without running it.

`trace_step` traces the model's `train_step` (forward, loss, gradients and the optimizer's
update, all in one graph) for a batch given as `TensorSpec`s, so no batch tensor is ever made,
and describes every op as a `memfit.backend.tf_graph.OpInfo` (sizes from its shapes, aliasing
and scratch from `memfit.backend.tf_kernels`), rewired as grappler runs it
(`memfit.backend.tf_grappler`) and pruned as TensorFlow prunes it. `start_trace` does the same
in two halves: grappler (C++, without Python's lock) runs on a thread while the caller goes on,
describing the ops or tracing the next step.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend.tf_devices import tf_variable
from memfit.backend.tf_graph import (
    OpInfo,
    Shape,
    StepGraph,
    drop_identity_n,
    prune_dead,
    shape_bytes,
)
from memfit.backend.tf_grappler import GrapplerNode, grappler_graph, rewire_as_grappler
from memfit.backend.tf_kernels import (
    ALIAS_OPS,
    ASSIGN_OPS,
    FORWARDING_OPS,
    NO_ALLOC_OPS,
    concurrent_ops,
    conv_backprop_scratch_bytes,
    intra_threads,
    xla_grouped_conv_scratch_bytes,
)
from memfit.backend.tf_layers import layer_tree, variable_owners
from memfit.errors import WorkloadError


def batch_specs(workload: Any, batch_size: int | None) -> Any:
    """`TensorSpec`s of a batch of `batch_size` (made from a one-sample batch; None: any)."""
    tf = tfb.import_tf()
    x, y = workload.batch(1)
    return tf.nest.map_structure(
        lambda t: tf.TensorSpec([batch_size, *t.shape[1:]], t.dtype), (x, y)
    )


def with_shapes(
    graph_def: Any,
    arguments: dict[str, Any],
    variables: dict[str, Any],
    *,
    runtime: bool,
    batched: frozenset[str] = frozenset(),
) -> Any:
    """A copy of the step traced for any batch size that says its inputs' shapes: a `GraphDef`.

    `model.fit` feeds batches whose first dimension is undefined, so TensorFlow runs the
    step traced for any batch size (see `start_trace`), and knows, as it runs it, the
    shapes of what it is fed. A graph's placeholders carry none of that: each captured
    variable's placeholder (`variables`: op name -> variable) becomes a `VarHandleOp` of
    the variable's shape and dtype, and each batch argument's (`arguments`: op name ->
    `TensorSpec` at the batch size; captured constants at their own) gets its shape.
    `runtime=True` gives grappler the graph as the runtime optimises it: each argument a
    read of a variable of its shape, the first dimension undefined for those in `batched`
    (the batch's), which grappler takes as given where it takes a placeholder as a feed of
    any shape (with such feeds it folds none of the shape arithmetic of a residual `Add`'s
    gradient that the runtime folds). Names and order stay as traced.
    """
    tf = tfb.import_tf()
    shaped = type(graph_def)()
    shaped.CopyFrom(graph_def)
    handles = []
    for node in shaped.node:
        spec = arguments.get(node.name)
        if spec is not None and not runtime:
            node.attr["shape"].shape.CopyFrom(tf.TensorShape(spec.shape).as_proto())
        elif spec is not None:
            dtype = node.attr["dtype"].type
            node.op = "ReadVariableOp"
            node.ClearField("attr")
            node.attr["dtype"].type = dtype
            node.input.append(f"{node.name}/memfit_feed")
            shape = list(spec.shape)
            if node.name in batched:
                shape[0] = None
            handles.append((f"{node.name}/memfit_feed", dtype, shape))
        elif node.name in variables:
            var = variables[node.name]
            handles.append((node.name, tf.as_dtype(var.dtype).as_datatype_enum, var.shape))
    where = {node.name: node for node in shaped.node}
    for name, dtype, shape in handles:
        node = where.get(name) or shaped.node.add()
        node.name, node.op = name, "VarHandleOp"
        node.ClearField("attr")
        node.attr["dtype"].type = dtype
        node.attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())
        node.attr["shared_name"].s = name.encode()
    return shaped


def import_graph(graph_def: Any) -> Any:
    """`graph_def` as a `tf.Graph`: TensorFlow's shape inference sizes every tensor; no run."""
    tf = tfb.import_tf()
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return graph


def trace_step(workload: Any, batch_size: int) -> StepGraph:
    """Trace the workload's training step at `batch_size` and describe its ops (no run)."""
    return start_trace(workload, batch_size).result()


class TracedStep:
    """A traced step whose grappler pass may still be running: `result()` waits for it.

    Made by `start_trace`. Grappler is TensorFlow's C++ optimizer and runs without Python's
    lock, so on two cores it costs little while the caller describes the ops or traces the
    next step.
    """

    def __init__(
        self, graph_def: Any, fetches: list[str], control_outputs: Sequence[str] = ()
    ) -> None:
        self._nodes: dict[str, GrapplerNode] = {}
        self._rank: dict[str, int] | None = None
        self._kept: set[str] = set()  # the IdentityNs grappler keeps (`drop_identity_n`)
        self._describe: Callable[[int], tuple[StepGraph, set[str]]] | None = None
        self._thread = threading.Thread(
            target=self._optimize,
            args=(graph_def, fetches, control_outputs),
            name="memfit-grappler",
            daemon=True,
        )
        self._thread.start()
        self._step: StepGraph | None = None
        self._effects: set[str] = set()
        self._done = False

    def _optimize(self, graph_def: Any, fetches: list[str], control_outputs: Sequence[str]) -> None:
        self._nodes = grappler_graph(graph_def, fetches, control_outputs)

    def described(
        self,
        step: StepGraph,
        effects: set[str],
        describe: Callable[[int], tuple[StepGraph, set[str]]] | None = None,
    ) -> None:
        """Give the step as traced (before grappler) and the ops that run for their effects.

        `describe(batch_size)` gives the same two at another batch size (see `at_batch`).
        """
        self._step, self._effects, self._describe = step, effects, describe

    def result(self) -> StepGraph:
        """The step graph, rewired and pruned as TensorFlow runs it (waits for grappler)."""
        step = self._step
        if step is None:
            raise RuntimeError("the step was not described yet")
        if not self._done:
            self._thread.join()
            self._as_run(step, self._effects)
            self._done = True
        return step

    def at_batch(self, batch_size: int) -> StepGraph:
        """The same step at another batch size: sized again, not traced again.

        The step is traced for batches of any size and grappler optimises it for any size
        (see `start_trace`), so only the tensors' sizes change: TensorFlow's shape inference
        gives them at `batch_size` (an import of the traced graph; no Keras trace, no
        grappler pass). Waits for grappler like `result`.

        Example:
            ```python
            pending = start_trace(workload, 32)
            graph, doubled = pending.result(), pending.at_batch(64)
            ```
        """
        self.result()
        if self._describe is None:
            raise RuntimeError("this step can be described at its own batch size only")
        step, effects = self._describe(int(batch_size))
        self._as_run(step, effects)
        return step

    def _as_run(self, step: StepGraph, effects: set[str]) -> None:
        """Rewire and prune `step` as grappler's graph runs (grappler has finished)."""
        if self._rank is None:  # grappler's graph is the same at every batch size
            self._rank = {name: node.rank for name, node in self._nodes.items()}
            self._kept = {name for name, node in self._nodes.items() if node.type == "IdentityN"}
        rewire_as_grappler(step.ops, self._nodes)
        kept = drop_identity_n(step.ops, step.fetches, self._kept)
        step.ops = prune_dead(kept, step.fetches, effects)
        if step.layer_tree is not None:
            step.layer_tree.choose_policy(op.name for op in step.ops)
        step.node_rank = self._rank


def start_trace(workload: Any, batch_size: int) -> TracedStep:
    """Trace the workload's step at `batch_size`; grappler goes on on a thread (see `TracedStep`).

    Example:
        ```python
        pending = start_trace(workload, 32)   # grappler runs from here
        graph = pending.result()              # ... until here
        ```
    """
    tf = tfb.import_tf()
    model = workload.model
    stepped = getattr(workload, "is_step", False)
    if stepped:
        # A step spec (a Model Garden task): `tf.function` of its step function, traced for
        # the batch its data gives at this size, as its training loop traces it (the task's
        # input pipeline drops the remainder: every dimension is static).
        function = workload.traced_function()
        specs = tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape, t.dtype), workload.batch(batch_size)
        )
        optimizer = workload.optimizer
    else:
        # Traced as `model.fit` traces it: for batches of any size. Grappler then keeps what
        # a fixed size lets it fold away (a residual `Add`'s gradient becomes an `Identity`
        # that waits on both branches' shapes), and that graph is the one TensorFlow runs.
        function = tf.function(model.train_step, jit_compile=False)
        specs = batch_specs(workload, None)  # made from one sample, once
        optimizer = model.optimizer
    concrete = function.get_concrete_function(specs)
    # Read after the trace: the first trace builds the optimizer's slots.
    if stepped:
        optimizer_vars = workload.optimizer_variables()
    else:
        optimizer_vars = getattr(optimizer, "variables", []) or []
    traced = concrete.graph
    fetches = [t.name for t in concrete.outputs]
    graph_def = traced.as_graph_def()
    intra = intra_threads(tf)

    # Resource placeholders -> variable names.
    handle_to_var: dict[str, str] = {}
    variables: dict[str, tuple[int, str]] = {}
    variable_layers: dict[str, str] = {}
    kinds: dict[int, str] = {}
    for var in model.variables:
        kinds[id(var)] = "weight"
    for var in optimizer_vars:
        kinds.setdefault(id(var), "optimizer")
    for var in workload.state_variables():
        kinds.setdefault(id(var), "other")
    by_handle: dict[int, Any] = {}
    for var in workload.state_variables():
        inner = tf_variable(var)
        handle = getattr(inner, "handle", None)
        if handle is not None:
            by_handle[id(handle)] = var
    captured: dict[str, Any] = {}  # placeholder op -> the variable whose handle it holds
    for external, internal in traced.captures:
        var = by_handle.get(id(external))
        if var is None:
            continue
        name = getattr(var, "path", None) or var.name
        handle_to_var[internal.name] = name
        captured[internal.op.name] = var
    arguments = [t.name for t in traced.inputs if t.dtype != tf.resource]
    inside = {internal.name for _, internal in traced.captures}
    batch = [t for t in traced.inputs if t.name not in inside]  # the step's own arguments
    constants = {  # captured constants: the runtime knows their shapes
        internal.op.name: tf.TensorSpec(internal.shape, internal.dtype)
        for _, internal in traced.captures
        if internal.op.type == "Placeholder" and internal.dtype != tf.resource
    }

    def fed(size: int) -> dict[str, Any]:
        """Each argument's placeholder -> its `TensorSpec` at `size` samples."""
        if stepped:
            if size != batch_size:
                raise WorkloadError(
                    f"a step spec is traced at its own batch ({batch_size}), not at {size}: "
                    f"estimate batch {size} on its own"
                )
            shapes = dict(zip((t.op.name for t in batch), tf.nest.flatten(specs), strict=True))
            return {**constants, **shapes}
        sized = [
            tf.TensorSpec([size, *spec.shape[1:]], spec.dtype) for spec in tf.nest.flatten(specs)
        ]
        shapes = {t.op.name: spec for t, spec in zip(batch, sized, strict=True)}
        return {**constants, **shapes}

    # A step spec's batch is static: its placeholders keep their size in grappler's graph.
    batched = frozenset() if stepped else frozenset(t.op.name for t in batch)
    # The runtime fetches the function's control outputs too: they decide grappler's order.
    controls = [op.name for op in traced.control_outputs]
    pending = TracedStep(
        with_shapes(graph_def, fed(batch_size), captured, runtime=True, batched=batched),
        fetches,
        controls,
    )
    tree = layer_tree(model)
    owners = variable_owners(model, tree)
    temps = initializer_temps(model)
    variable_temps: dict[str, int] = {}
    for var in workload.state_variables():
        name = getattr(var, "path", None) or var.name
        nbytes = int(math.prod(var.shape)) * tf.as_dtype(var.dtype).size
        variables[name] = (nbytes, kinds.get(id(var), "other"))
        if id(var) in owners:
            variable_layers[name] = owners[id(var)]
        variable_temps[name] = temps.get(id(var), 0)
    layers = _layer_names(model)
    optimizer_name = str(getattr(optimizer, "name", "optimizer"))

    def describe(size: int) -> tuple[StepGraph, set[str]]:
        """The step's ops sized at `size` samples, and those that run for their effects."""
        graph = import_graph(with_shapes(graph_def, fed(size), captured, runtime=False))
        ops: list[OpInfo] = []
        effects: set[str] = set()
        for op in graph.get_operations():
            if op.name in captured:  # a placeholder, made a VarHandleOp for its shape only
                ops.append(
                    OpInfo(
                        op.name,
                        "Placeholder",
                        [],
                        [op.outputs[0].name],
                        [0],
                        alias=[None],
                        output_shapes=[((), 0)],
                    )
                )
                continue
            if op.type in ASSIGN_OPS or (op.op_def is not None and op.op_def.is_stateful):
                effects.add(op.name)
            outputs = [t.name for t in op.outputs]
            shapes = [tensor_shape(t) for t in op.outputs]
            alias: list[int | None] = [None] * len(outputs)
            variable = None
            if op.type in ALIAS_OPS and op.inputs:
                alias = [min(i, len(op.inputs) - 1) for i in range(len(outputs))]
            if op.type in NO_ALLOC_OPS:
                shapes = [(dims, 0) for dims, _ in shapes]
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
                    output_bytes=[shape_bytes(shape) for shape in shapes],
                    control_inputs=[c.name for c in op.control_inputs],
                    alias=alias,
                    forwards=op.type in FORWARDING_OPS,
                    scratch_bytes=scratch,
                    variable=variable,
                    output_shapes=shapes,
                )
            )
        argument_shapes = [tensor_shape(graph.get_tensor_by_name(n)) for n in arguments]
        step = StepGraph(
            ops=ops,
            arguments=arguments,
            argument_bytes=[shape_bytes(shape) for shape in argument_shapes],
            fetches=fetches,
            variables=variables,
            variable_layers=variable_layers,
            layers=layers,
            optimizer_name=optimizer_name,
            inter_op_threads=concurrent_ops(tf),
            variable_temps=variable_temps,
            layer_tree=tree,
            batch_size=int(size),
            argument_shapes=argument_shapes,
        )
        return step, effects

    step, effects = describe(batch_size)
    pending.described(step, effects, describe)
    return pending


def tensor_shape(tensor: Any) -> Shape:
    """A tensor's `Shape` as the allocator sizes it (see `memfit.backend.tf_kernels`).

    Unknown dimensions count as 1; resources, variants and strings allocate nothing here.
    """
    shape, dtype = tensor.shape, tensor.dtype
    if shape.rank is None or dtype.name in ("resource", "variant", "string"):
        return (), 0
    dims = tuple(d if d is not None and d >= 0 else 1 for d in shape.as_list())
    try:
        itemsize = int(dtype.size)
    except (AttributeError, TypeError, ValueError):
        return dims, 0
    return dims, itemsize


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


def initializer_temps(model: Any) -> dict[int, int]:
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
