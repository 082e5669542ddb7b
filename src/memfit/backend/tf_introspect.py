"""Looking inside TensorFlow objects: a train function's `tf.function`s, a dataset's graph."""

from __future__ import annotations

from typing import Any

from memfit.backend.tf_import import import_tf
from memfit.errors import MeasurementError


def traced_functions(fn: Any, depth: int = 4) -> list[Any]:
    """The `tf.function`s a (Keras) train function calls, found through its closures.

    Keras 3 builds `model.train_function` as a Python closure over `tf.function`s (wrapped
    with `functools.wraps`); their tracing counts say how often the step was retraced.
    """
    found: list[Any] = []
    seen: set[int] = set()

    def visit(obj: Any, level: int) -> None:
        if obj is None or id(obj) in seen or level > depth:
            return
        seen.add(id(obj))
        if hasattr(obj, "experimental_get_tracing_count"):
            found.append(obj)
            return
        visit(getattr(obj, "__wrapped__", None), level + 1)
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(value):
                visit(value, level + 1)

    visit(fn, 0)
    return found


def tracing_count(functions: list[Any]) -> int:
    """How many times these `tf.function`s have been traced, together."""
    return sum(int(f.experimental_get_tracing_count()) for f in functions)


def dataset_graph(dataset: Any) -> Any:
    """The `GraphDef` a `tf.data.Dataset` is built from (its ops and the functions it maps).

    Uses `Dataset._as_serialized_graph()`, a private TensorFlow API (stable since TF 2.3);
    raises `MeasurementError` when this TensorFlow no longer has it.
    """
    tf = import_tf()
    serialize = getattr(dataset, "_as_serialized_graph", None)
    if serialize is None:
        raise MeasurementError(
            f"this TensorFlow ({tf.__version__}) cannot serialise a tf.data graph; "
            f"memfit data audit needs TensorFlow 2.3 or later"
        )
    return tf.compat.v1.GraphDef.FromString(serialize().numpy())
