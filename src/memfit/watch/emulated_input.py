"""Plain `model.fit` on a CPU-emulated card: what its input pipeline holds on the card.

A GPU keeps the input pipeline's buffers (shuffled and prefetched batches) in host memory; a
CPU-emulated card counts every tensor TensorFlow allocates, so plain `model.fit` there runs
out of memory sooner than the card it stands for (`memfit.fit` runs the pipeline on a tf.data
service worker instead). `memfit.Watch` says so once, after its warm-up, with the bytes: what
is in use between steps beyond the model's and optimizer's variables.

Example:
    ```python
    line = pipeline_warning(model, current_bytes=5 << 20, batch_bytes=1 << 20)
    ```
"""

from __future__ import annotations

import os
from typing import Any

from memfit.budget.budget import ENV_EMULATED_ON, emulated_budget
from memfit.sizes import format_size

# Less than this beyond the variables is not worth a line (a metric's state, RNG state).
MIN_PIPELINE_BYTES = 1 << 20


def variable_bytes(model: Any) -> int:
    """Bytes of the model's variables and its optimizer's, each counted once."""
    seen: dict[int, int] = {}
    optimizer = getattr(model, "optimizer", None)
    for variable in [*getattr(model, "variables", []), *getattr(optimizer, "variables", [])]:
        seen[id(variable)] = _nbytes(variable)
    return sum(seen.values())


def pipeline_warning(model: Any, current_bytes: int, batch_bytes: int | None) -> str | None:
    """The line to print when plain `model.fit`'s pipeline holds batches on an emulated card.

    Args:
        model: the model being trained.
        current_bytes: the emulated card's bytes in use between steps.
        batch_bytes: one batch's bytes, if known.

    Returns:
        The warning (without the `memfit: warning:` prefix), or None: no CPU-emulated card,
        or nothing worth saying.
    """
    if os.environ.get(ENV_EMULATED_ON) != "CPU" or emulated_budget() is None:
        return None
    held = current_bytes - variable_bytes(model)
    if held < max(MIN_PIPELINE_BYTES, batch_bytes or 0):
        return None
    batches = f" (about {held / batch_bytes:.1f} batches)" if batch_bytes else ""
    return (
        f"the input pipeline holds {format_size(held)}{batches} on the emulated card between "
        f"steps (prefetched and shuffled batches), which a GPU keeps in host memory: this run "
        f"runs out of memory sooner than the card it emulates; memfit.fit runs the pipeline "
        f"off the card (a tf.data service worker)"
    )


def batch_bytes(data: Any) -> int | None:
    """Bytes of a batch's tensors and arrays (None when it has none)."""
    from memfit.backend.tf import import_tf  # the batch is TensorFlow's: it is imported

    return sum(_nbytes(leaf) for leaf in import_tf().nest.flatten(data)) or None


def _nbytes(value: Any) -> int:
    """Bytes of a tensor, array or variable from its shape and dtype (0 without them)."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return 0
    size = 1
    for dim in shape:
        size *= int(dim or 0)
    return size * _itemsize(dtype)


def _itemsize(dtype: Any) -> int:
    name = str(getattr(dtype, "name", dtype))
    for bits in (64, 32, 16, 8):
        if name.endswith(str(bits)):
            return bits // 8
    return 1 if name == "bool" else 4
