"""Recompute on TensorFlow: segments of a Keras layer graph run under `tf.recompute_grad`.

Everything here touches Keras' graph internals (nodes, `Arguments.fill_in`,
`StatelessScope`) or TensorFlow's (`tf.recompute_grad`); the graph is read by
`memfit.backend.tf_layer_graph`, and `memfit.recompute` chooses the segments and is the public
face.

How a segment runs during training:

- forward: its layers run inside a Keras `StatelessScope` under `tf.recompute_grad`, so only
  the segment's inputs are kept for backward. The scope swallows every variable update (a
  BatchNorm's moving statistics, a Dropout's seed-generator state); they are applied once,
  after the segment, from the values the scope collected.
- backward: TensorFlow runs the segment again (same function, same inputs). The scope again
  swallows the updates, which are now dropped: the moving statistics move once per step.
  Seed generators read the state they had before the forward (it is mapped in the scope), so
  every Dropout draws the mask it drew in the forward.
- a segment kept whole (not recomputed): each call of a composite layer in it (a layer that
  holds layers with weights, whose activations the layer graph cannot see: a feature pyramid,
  a detector's head applied once per pyramid level) runs as a recomputed part of its own, and
  the parts' backward is chained (`_backward_before`) so they are recomputed one at a time,
  the last call's first, not all at once when the loss's gradient reaches them together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend.tf_layer_graph import LayerGraph, Step


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
        inner: for a segment kept whole, the parts it runs in training: each call of a
            composite layer (`composite`) in a part of its own, recomputed, and the steps
            between in parts kept whole (empty: run the steps as they are).

    `after`, set by `segments_from_cuts` on the parts of a kept segment: the id of an earlier
    recomputed part's output whose gradient must wait for this part's backward, so that the
    parts are recomputed one after another, not all at once.
    """

    def __init__(
        self,
        steps: list[Step],
        inputs: list[int],
        outputs: list[int],
        recompute: bool = True,
        held: list[int] | None = None,
        inner: list[Segment] | None = None,
    ) -> None:
        self.steps = steps
        self.inner = list(inner or [])
        self.after: int | None = None
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
            if self.inner and training is True:
                for part in self.inner:
                    part(values, training)
                return
            run_steps(self.steps, values, training)
            return
        tf = tfb.import_tf()
        from keras.src.backend.common.stateless_scope import StatelessScope

        inputs = [values[t] for t in self.inputs]
        held = {t: values[t] for t in self.held}
        if not all(_is_float(v) for v in inputs):  # recompute_grad differentiates its inputs
            run_steps(self.steps, values, training)
            return
        if self.after is not None and inputs and _is_float(values.get(self.after)):
            inputs[0] = _backward_before(inputs[0], values[self.after])
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


def _backward_before(tensor: Any, earlier: Any) -> Any:
    """`tensor`, unchanged; in backward, `earlier`'s gradient waits for `tensor`'s.

    The gradient to `earlier` is a zero made after the gradient of `tensor` arrives: the
    segment that computed `earlier` (whose recompute waits on its output's gradient) is
    recomputed only after the backward of the part that reads `tensor` has finished.
    Forward values and gradients are unchanged.
    """
    tf = tfb.import_tf()

    @tf.custom_gradient
    def tie(x: Any, e: Any) -> Any:
        def grad(dy: Any) -> Any:
            with tf.control_dependencies([dy]):
                return tf.identity(dy), tf.zeros_like(e)

        return tf.identity(x), grad

    return tie(tensor, earlier)


def _is_float(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    return bool(dtype is not None and getattr(dtype, "is_floating", False))


def _sublayers(operation: Any) -> list[Any]:
    flatten = getattr(operation, "_flatten_layers", None)
    if flatten is None:
        return [operation]
    return list(flatten(include_self=True))


def composite(operation: Any) -> bool:
    """Whether a layer holds other layers with weights (a feature pyramid, a detector's head).

    Such a layer's own activations are invisible in the layer graph (only its outputs are
    graph tensors) and can be large: keras-hub's RetinaNet heads run four 256-channel
    convolutions on every pyramid level, more bytes than the whole backbone's activations.
    """
    flatten = getattr(operation, "_flatten_layers", None)
    if flatten is None:
        return False
    return any(getattr(layer, "weights", None) for layer in flatten(include_self=False))


def _segment(
    graph: LayerGraph,
    start: int,
    end: int,
    flag: bool,
    last_use: dict[int, float],
    input_like: set[int],
    inner: list[Segment] | None = None,
) -> Segment:
    """The segment of steps `start..end`: what it reads, what it hands on, what it holds."""
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
    return Segment(steps, inputs, outputs, recompute=flag, held=held, inner=inner)


def _parts(
    graph: LayerGraph, start: int, end: int, last_use: dict[int, float], input_like: set[int]
) -> list[Segment]:
    """A kept segment's parts: each composite layer's call recomputed alone, the rest kept.

    Empty where the segment calls no composite layer (it then runs as one piece).
    """
    calls = [
        i
        for i in range(start, end + 1)
        if graph.steps[i].node is not None and composite(graph.steps[i].operation)
    ]
    if not calls:
        return []
    parts = []
    begin = start
    for index in calls:
        if index > begin:
            parts.append(_segment(graph, begin, index - 1, False, last_use, input_like))
        parts.append(_segment(graph, index, index, True, last_use, input_like))
        begin = index + 1
    if begin <= end:
        parts.append(_segment(graph, begin, end, False, last_use, input_like))
    previous = None
    for part in parts:
        if not part.recompute:
            continue
        if previous is not None and previous.outputs:
            part.after = previous.outputs[0]
        previous = part
    return parts


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
    last_use = graph.last_use()
    input_like = graph.input_like()
    bounds = sorted(set(cut_steps))
    ends = [*bounds, len(graph.steps) - 1]
    flags = list(recompute) if recompute is not None else [True] * len(ends)
    segments = []
    start = 0
    for end, flag in zip(ends, flags, strict=True):
        inner = [] if flag else _parts(graph, start, end, last_use, input_like)
        segments.append(_segment(graph, start, end, flag, last_use, input_like, inner))
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
