"""A Keras model's layer graph, flattened: its steps, their bytes, and where it can be cut.

Reads Keras' graph internals (nodes by depth, a nested `Functional`'s inputs and outputs);
nested plain functional models are expanded into the steps of their layers. `memfit.recompute`
cuts this graph into segments (`memfit.recomputation.cuts`), which
`memfit.backend.tf_recompute` runs under `tf.recompute_grad`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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
        last_use = self.last_use()
        inputs = self.input_like()
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

    def last_use(self) -> dict[int, float]:
        """Per tensor id, the index of the last step that reads it (infinity for outputs)."""
        last_use: dict[int, float] = {}
        for index, step in enumerate(self.steps):
            for tensor in step.inputs:
                last_use[tensor] = index
        for tensor in self.output_ids:
            last_use[tensor] = math.inf
        return last_use

    def input_like(self) -> set[int]:
        """Ids of the model's inputs and of the tensors that alias them."""
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
