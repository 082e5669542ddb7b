"""Recompute on TensorFlow: a Keras layer graph cut at articulation points, segments under
`tf.recompute_grad`.

Everything here touches Keras' graph internals (nodes, `Arguments.fill_in`,
`StatelessScope`) or TensorFlow's (`tf.recompute_grad`); `memfit.recompute` chooses the
segments and is the public face.

How a segment runs during training:

- forward: its layers run inside a Keras `StatelessScope` under `tf.recompute_grad`, so only
  the segment's inputs are kept for backward. The scope swallows every variable update (a
  BatchNorm's moving statistics, a Dropout's seed-generator state); they are applied once,
  after the segment, from the values the scope collected.
- backward: TensorFlow runs the segment again (same function, same inputs). The scope again
  swallows the updates, which are now dropped: the moving statistics move once per step.
  Seed generators read the state they had before the forward (it is mapped in the scope), so
  every Dropout draws the mask it drew in the forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memfit.backend import tf as tfb

# A cut keeps the tensors that cross it; more than this many make a poor boundary (inside a
# residual block two cross already, a feature pyramid's inputs add one per level).
MAX_BOUNDARY_TENSORS = 4


@dataclass
class Step:
    """One operation of the flattened layer graph (nested functional models are expanded).

    `node` is the Keras node to run; alias steps (`node is None`) copy tensors across the
    boundary of an expanded nested model (`aliases`: pairs of destination and source id).
    """

    node: Any
    inputs: list[int]
    outputs: list[int]
    aliases: list[tuple[int, int]] = field(default_factory=list)

    @property
    def operation(self) -> Any:
        return None if self.node is None else self.node.operation


@dataclass
class LayerGraph:
    """A Keras model's layer graph, flattened and topologically ordered.

    Attributes:
        steps: operations in execution order.
        input_ids: ids of the model's (flattened) input tensors.
        output_ids: ids of the model's (flattened) output tensors.
        tensors: id -> KerasTensor, for every tensor in the graph.
        functional: the top-level `Functional` the graph was read from.
    """

    steps: list[Step]
    input_ids: list[int]
    output_ids: list[int]
    tensors: dict[int, Any]
    functional: Any

    def cuts(self, max_tensors: int = MAX_BOUNDARY_TENSORS) -> list[tuple[int, tuple[int, ...]]]:
        """Where the graph can be cut: `(step index, boundary tensor ids)` after each step.

        After step `i` the live tensors are those already computed that a later step or
        the output still needs: the boundary a cut there keeps for backward. One tensor is an
        articulation point (between ResNet blocks); a backbone that hands several stage
        outputs to a feature pyramid is cut where a few tensors cross (C3 and C4 are live
        while stage 5 runs). Points where more than `max_tensors` cross are not returned.
        The model's inputs do not count: the batch is held for the whole step anyway (a
        detector's anchors read the image's shape at the end), so a later segment may read
        them too (`held_inputs`). Only points between two computing steps are returned, one
        per run of alias steps; boundaries are in the order their tensors were computed.
        """
        self._held: dict[int, list[int]] = {}
        last_use = self._last_use()
        inputs = self._input_like()
        order = {t: i for i, s in enumerate(self.steps) for t in s.outputs}
        live = {t for t in self.input_ids if t in last_use}
        computing = [i for i, s in enumerate(self.steps) if s.node is not None]
        if not computing:
            return []
        first, last = computing[0], computing[-1]
        result: list[tuple[int, tuple[int, ...]]] = []
        since_cut = 0
        for index, step in enumerate(self.steps):
            for tensor in step.inputs:
                if last_use.get(tensor) == index:
                    live.discard(tensor)
            for tensor in step.outputs:
                if last_use.get(tensor, -1) > index:
                    live.add(tensor)
            since_cut += step.node is not None
            computed = sorted((t for t in live if t not in inputs), key=lambda t: order[t])
            if first <= index < last and 1 <= len(computed) <= max_tensors and since_cut:
                if step.node is None:
                    continue
                result.append((index, tuple(computed)))
                self._held[index] = sorted((t for t in live if t in inputs), key=self._order)
                since_cut = 0
        return result

    def boundary_bytes(self, tensors: Sequence[int], batch_size: int = 1) -> int:
        """Bytes of a boundary's tensors at `batch_size` (undefined shapes count 0)."""
        return sum(self.tensor_bytes(t, batch_size) or 0 for t in tensors)

    def held_inputs(self, index: int) -> list[int]:
        """Model inputs (or their aliases) still needed after the cut at step `index`."""
        if not hasattr(self, "_held"):
            self.cuts()
        return list(self._held.get(index, []))

    def _order(self, tensor: int) -> int:
        return self.input_ids.index(tensor) if tensor in self.input_ids else len(self.input_ids)

    def _last_use(self) -> dict[int, float]:
        last_use: dict[int, float] = {}
        for index, step in enumerate(self.steps):
            for tensor in step.inputs:
                last_use[tensor] = index
        for tensor in self.output_ids:
            last_use[tensor] = math.inf
        return last_use

    def _input_like(self) -> set[int]:
        inputs = set(self.input_ids)
        for step in self.steps:
            for dst, src in step.aliases:
                if src in inputs:
                    inputs.add(dst)
        return inputs

    def tensor_bytes(self, tensor_id: int, batch_size: int = 1) -> int | None:
        """Bytes of a tensor at `batch_size` from its symbolic shape (None: undefined dims)."""
        return _tensor_bytes(self.tensors.get(tensor_id), batch_size)

    def step_bytes(self, index: int, batch_size: int = 1) -> int:
        """Bytes of what step `index` produces (0 for alias steps or undefined shapes)."""
        step = self.steps[index]
        if step.node is None:
            return 0
        return sum(self.tensor_bytes(t, batch_size) or 0 for t in step.outputs)

    def layer_name(self, index: int) -> str:
        """Name of the layer step `index` runs ('' for alias steps)."""
        op = self.steps[index].operation
        return "" if op is None else str(op.name)


def _tensor_bytes(tensor: Any, batch_size: int) -> int | None:
    if tensor is None:
        return None
    import numpy as np

    dims = list(tensor.shape)
    if not dims:
        return _itemsize(tensor.dtype)
    rest = dims[1:]
    if any(d is None for d in rest):
        return None
    first = batch_size if dims[0] is None else dims[0]
    return int(first * int(np.prod(rest)) * _itemsize(tensor.dtype))


def _itemsize(dtype: Any) -> int:
    import numpy as np

    name = str(getattr(dtype, "name", dtype))
    if name == "bfloat16":
        return 2
    try:
        return int(np.dtype(name).itemsize)
    except TypeError:
        return 4


class NoLayerGraphError(Exception):
    """The model has no layer graph memfit can read (raised to `memfit.recompute`)."""


def top_functional(model: Any) -> Any:
    """The Functional whose graph `model.call` runs: the model, or a Sequential's inner one.

    Raises `NoLayerGraphError` for models whose call is their own Python code.
    """
    from keras.src.models.functional import Functional
    from keras.src.models.sequential import Sequential

    if isinstance(model, Sequential):
        inner = getattr(model, "_functional", None)
        if inner is None:
            raise NoLayerGraphError(
                f"Sequential model {model.name!r} is not built yet (no layer graph): build it "
                f"or call it on a batch first"
            )
        return inner
    if isinstance(model, Functional) and type(model).call is Functional.call:
        return model
    if isinstance(model, Functional):
        raise NoLayerGraphError(
            f"model {model.name!r} ({type(model).__name__}) overrides call(), so its forward "
            f"pass is Python code, not its layer graph"
        )
    raise NoLayerGraphError(
        f"model {model.name!r} is a subclassed {type(model).__name__}: its forward pass is "
        f"Python code in call(), with no layer graph to cut into segments"
    )


def layer_graph(model: Any) -> LayerGraph:
    """Flatten `model`'s layer graph (nested plain functional models expanded)."""
    functional = top_functional(model)
    steps: list[Step] = []
    tensors: dict[int, Any] = {}
    expanded: set[int] = set()
    _flatten(functional, steps, tensors, expanded)
    for tensor in functional.inputs:
        tensors[id(tensor)] = tensor
    return LayerGraph(
        steps=steps,
        input_ids=[id(t) for t in functional.inputs],
        output_ids=[id(t) for t in functional.outputs],
        tensors=tensors,
        functional=functional,
    )


def _ordered_nodes(functional: Any) -> list[Any]:
    by_depth = functional._nodes_by_depth
    nodes = []
    for depth in sorted(by_depth, reverse=True):
        nodes.extend(by_depth[depth])
    return nodes


def _expandable(operation: Any, node: Any, expanded: set[int]) -> bool:
    from keras.src.models.functional import Functional

    if id(operation) in expanded or not isinstance(operation, Functional):
        return False
    if type(operation).call is not Functional.call:
        return False
    import keras

    args = node.arguments
    # `mask=None` (keras-hub passes it to its backbones) changes nothing.
    if any(v is not None for v in args.kwargs.values()) or len(args.args) != 1:
        return False
    flat_in = keras.tree.flatten(node.input_tensors)
    return len(flat_in) == len(operation.inputs) and len(node.outputs) == len(operation.outputs)


def _flatten(functional: Any, steps: list[Step], tensors: dict[int, Any], expanded: set) -> None:
    import keras

    for node in _ordered_nodes(functional):
        if node.operation is None or node.is_input:
            continue
        op = node.operation
        inputs = [id(t) for t in keras.tree.flatten(node.input_tensors)]
        outputs = [id(t) for t in node.outputs]
        for t in node.outputs:
            tensors[id(t)] = t
        if _expandable(op, node, expanded):
            expanded.add(id(op))
            inner_in = [id(t) for t in op.inputs]
            for t in op.inputs:
                tensors[id(t)] = t
            steps.append(Step(None, inputs, inner_in, list(zip(inner_in, inputs, strict=True))))
            _flatten(op, steps, tensors, expanded)
            inner_out = [id(t) for t in op.outputs]
            steps.append(Step(None, inner_out, outputs, list(zip(outputs, inner_out, strict=True))))
        else:
            steps.append(Step(node, inputs, outputs))


# -- running segments -------------------------------------------------------------------------
def run_steps(steps: list[Step], values: dict[int, Any], training: Any) -> None:
    """Run `steps` as Keras' Functional does, filling `values` (tensor id -> tensor)."""
    from keras.src.models.functional import operation_fn

    for step in steps:
        if step.node is None:
            for dst, src in step.aliases:
                values[dst] = values[src]
            continue
        args, kwargs = step.node.arguments.fill_in(values)
        outputs = operation_fn(step.operation, training=training)(*args, **kwargs)
        import keras

        for tensor_id, value in zip(step.outputs, keras.tree.flatten(outputs), strict=False):
            values[tensor_id] = value


class SegmentError(Exception):
    """A segment cannot be recomputed as built (raised to `memfit.recompute`)."""


class Segment:
    """A run of steps with its inputs and outputs; runs under `tf.recompute_grad` in training.

    Args:
        steps: the steps, in order.
        inputs: ids of the tensors the segment reads from earlier segments.
        outputs: ids of the tensors later segments (or the model's outputs) read.
        recompute: whether to recompute the segment in backward (False: keep everything).
        held: ids of model inputs the segment also reads (captured, not differentiated).
    """

    def __init__(
        self,
        steps: list[Step],
        inputs: list[int],
        outputs: list[int],
        recompute: bool = True,
        held: list[int] | None = None,
    ) -> None:
        self.steps = steps
        self.held = list(held or [])
        self.inputs = inputs
        self.outputs = outputs
        self.recompute = recompute
        seen: set[int] = set()
        self.variables: list[Any] = []
        self.seed_states: list[Any] = []
        for step in steps:
            op = step.operation
            if op is None:
                continue
            for var in getattr(op, "variables", []):
                if id(var) not in seen:
                    seen.add(id(var))
                    self.variables.append(var)
            for layer in _sublayers(op):
                for generator in getattr(layer, "_seed_generators", []) or []:
                    state = generator.state
                    if id(state) not in {id(s) for s in self.seed_states}:
                        self.seed_states.append(state)

    def __call__(self, values: dict[int, Any], training: Any) -> None:
        """Run the segment on `values`, adding its outputs (recomputed in backward)."""
        if not self.recompute or training is not True:
            run_steps(self.steps, values, training)
            return
        tf = tfb.import_tf()
        from keras.src.backend.common.stateless_scope import StatelessScope

        inputs = [values[t] for t in self.inputs]
        held = {t: values[t] for t in self.held}
        if not all(_is_float(v) for v in inputs):  # recompute_grad differentiates its inputs
            run_steps(self.steps, values, training)
            return
        # Seed states before the forward: both passes draw from them (same dropout masks).
        seeds = [tf.identity(state.value) for state in self.seed_states]
        mapping = list(zip(self.seed_states, seeds, strict=True))
        passes: list[int] = []
        updates: list[tuple[Any, Any]] = []
        steps, input_ids, output_ids = self.steps, self.inputs, self.outputs

        def segment(*tensors: Any) -> list[Any]:
            first = not passes
            passes.append(1)
            local = dict(zip(input_ids, tensors, strict=True))
            local.update(held)
            with StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
                run_steps(steps, local, True)
            if scope.losses:
                raise SegmentError(
                    "a layer adds a loss in its forward pass (activity regularization), "
                    "which recompute cannot keep"
                )
            if first:  # the forward: keep the updates to apply once; the recompute's are dropped
                mapped = {id(k): v for k, v in mapping}
                for var in self.variables + self.seed_states:
                    new = scope.get_current_value(var)
                    if new is not None and new is not mapped.get(id(var)):
                        updates.append((var, new))
            return [local[t] for t in output_ids]

        results = tf.recompute_grad(segment)(*inputs)
        for var, value in updates:
            var.assign(value)
        for tensor_id, value in zip(output_ids, results, strict=True):
            values[tensor_id] = value


def _is_float(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    return bool(dtype is not None and getattr(dtype, "is_floating", False))


def _sublayers(operation: Any) -> list[Any]:
    flatten = getattr(operation, "_flatten_layers", None)
    if flatten is None:
        return [operation]
    return list(flatten(include_self=True))


def segments_from_cuts(
    graph: LayerGraph, cut_steps: list[int], recompute: Sequence[bool] | None = None
) -> list[Segment]:
    """Split the graph after each step index in `cut_steps` (each one of `graph.cuts()`).

    A segment reads the tensors its steps use that earlier segments computed (differentiated
    through `tf.recompute_grad`) and the model inputs (held, captured); it returns what it
    computes that a later segment or the model's output reads. A tensor that crosses several
    cuts (a pyramid's C3) is returned once, by the segment that computes it. `recompute`
    says, per segment, whether to recompute it (default: all).
    """
    last_use = graph._last_use()
    input_like = graph._input_like()
    bounds = sorted(set(cut_steps))
    ends = [*bounds, len(graph.steps) - 1]
    flags = list(recompute) if recompute is not None else [True] * len(ends)
    segments = []
    start = 0
    for end, flag in zip(ends, flags, strict=True):
        steps = graph.steps[start : end + 1]
        produced: set[int] = set()
        reads: list[int] = []
        outputs: list[int] = []
        for step in steps:
            for tensor in step.inputs:
                if tensor not in produced and tensor not in reads:
                    reads.append(tensor)
            for tensor in step.outputs:
                produced.add(tensor)
                if last_use.get(tensor, -1) > end and tensor not in outputs:
                    outputs.append(tensor)
        held = [t for t in reads if t in input_like]
        inputs = [t for t in reads if t not in input_like]
        if not inputs:  # the first segment: differentiated through the model's inputs
            inputs, held = held, []
        segments.append(Segment(steps, inputs, outputs, recompute=flag, held=held))
        start = end + 1
    return segments


def segmented_call(model: Any, graph: LayerGraph, segments: list[Segment]) -> Callable[..., Any]:
    """A replacement for `model.call`: the segmented forward when training, else the original.

    Inputs are standardised as Keras' Functional does; outputs keep the model's structure.
    """
    import keras

    original = type(model).call.__get__(model)
    functional = graph.functional

    def call(inputs: Any, training: Any = None, mask: Any = None, **kwargs: Any) -> Any:
        if training is not True or mask is not None or kwargs:
            return original(inputs, training=training, mask=mask, **kwargs)
        flat = functional._standardize_inputs(inputs)
        values = dict(zip(graph.input_ids, flat, strict=True))
        for segment in segments:
            segment(values, training)
        outputs = [values[t] for t in graph.output_ids]
        packed = keras.tree.pack_sequence_as(functional._outputs_struct, outputs)
        if isinstance(packed, (list, tuple)) and len(packed) == 1:
            return packed[0]
        return packed

    return call


def patch_call(model: Any, call: Callable[..., Any] | None) -> None:
    """Make `call` the model's `call` (None: give it back its class's), forcing a retrace."""
    if call is None:
        model.__dict__.pop("call", None)
    else:
        object.__setattr__(model, "call", call)
    # A train function Keras traced holds the old forward: make Keras trace it again. (Not
    # memfit.fit's own, which traces per input shape inside its GuardedStep.)
    function = getattr(model, "train_function", None)
    if function is not None and not hasattr(function, "guarded_step"):
        object.__setattr__(model, "train_function", None)
