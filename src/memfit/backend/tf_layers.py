"""A Keras model's layers and which layer owns each variable (weights and optimizer slots).

Shared by `memfit.estimate` (per-layer breakdown of the predicted peak) and
`memfit.measuring.explain`
(per-layer live set at the measured peak), so that both name layers alike: innermost layers,
labelled by the shortest unique path (`memfit.backend.attribution.LayerTree`).
"""

from __future__ import annotations

from typing import Any

from memfit.backend.attribution import LayerTree

Path = tuple[str, ...]


def _children(layer: Any) -> list[Any]:
    return list(getattr(layer, "layers", None) or getattr(layer, "_layers", None) or [])


def layers_by_path(model: Any) -> list[tuple[Path, Any]]:
    """Every layer of `model` (nested models' layers too) with its path of names, outer first.

    Example:
        ```python
        [path for path, _ in layers_by_path(model)][:2]  # [("input_layer",), ("conv2d",)]
        ```
    """
    found: list[tuple[Path, Any]] = []
    seen: set[int] = set()
    stack: list[tuple[Any, Path]] = [(model, ())]
    while stack:
        layer, path = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if path:
            found.append((path, layer))
        for child in reversed(_children(layer)):
            stack.append((child, (*path, str(child.name))))
    return found


def layer_tree(model: Any) -> LayerTree:
    """The model's layers as a `LayerTree` (for attributing op names)."""
    return LayerTree(path for path, _ in layers_by_path(model))


def variable_owners(model: Any, tree: LayerTree | None = None) -> dict[int, str]:
    """`id(variable)` -> label of the layer it belongs to, for weights and optimizer slots.

    A weight belongs to the innermost layer that holds it. An optimizer slot belongs to the
    layer of the variable it was made for: Keras keeps one list per slot kind aligned with
    the optimizer's trainable variables (Adam's `_momentums`, `_velocities`); otherwise the
    slot's name decides (Keras names it `<optimizer>/<variable path, / as _>_<slot>`).

    Example:
        ```python
        owners = variable_owners(model)
        owners[id(model.layers[1].kernel)]  # "conv2d"
        ```
    """
    tree = tree or layer_tree(model)
    owner: dict[int, str] = {}
    for path, layer in sorted(layers_by_path(model), key=lambda item: len(item[0])):
        for var in getattr(layer, "weights", None) or []:
            owner[id(var)] = tree.label(path)  # deeper layers overwrite their parents
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        owner.update(_slot_owners(optimizer, owner, model))
    return owner


def _slot_owners(optimizer: Any, owner: dict[int, str], model: Any) -> dict[int, str]:
    """Optimizer variable id -> the layer of the model variable it is a slot of."""
    result: dict[int, str] = {}
    optimizer = getattr(optimizer, "inner_optimizer", None) or optimizer
    trainables = list(getattr(optimizer, "_trainable_variables", None) or [])
    if trainables:
        for value in vars(optimizer).values():
            if not isinstance(value, list) or len(value) != len(trainables):
                continue
            if not all(v is None or hasattr(v, "shape") for v in value):
                continue
            for var, slot in zip(trainables, value, strict=True):
                if slot is not None and slot is not var and id(var) in owner:
                    result[id(slot)] = owner[id(var)]
    keys = sorted(
        (
            (str(getattr(v, "path", None) or v.name).replace("/", "_"), owner[id(v)])
            for v in model.trainable_variables
            if id(v) in owner
        ),
        key=lambda kv: -len(kv[0]),
    )
    for slot in getattr(optimizer, "variables", None) or []:
        if id(slot) in result or id(slot) in owner:
            continue
        tail = str(getattr(slot, "path", None) or slot.name).split("/", 1)[-1]
        for key, layer in keys:
            if tail.startswith(key + "_"):
                result[id(slot)] = layer
                break
    return result
