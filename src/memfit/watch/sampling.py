"""What `memfit.Watch` reads from TensorFlow after each step: memory in use, its peak, traces.

Both reads are cheap (allocator statistics, a counter) and wait for nothing on the device.
With `memfit.fit` its guarded step knows the step's true peak (over all its micro-batches
and the update) and counts its own traces; `guarded` is that step, or None.

Example:
    ```python
    current, peak = memory_sample("GPU:0", guarded=None)
    traces = trace_count(None, tfb.traced_functions(model.train_function))
    ```
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.backend import tf as tfb


def memory_sample(device: str, guarded: Any = None) -> tuple[int | None, int | None]:
    """The device's memory in use now and its peak since the last reset, in bytes.

    Args:
        device: the TensorFlow device (`"GPU:0"`; `"CPU:0"` under memfit's emulated budget).
        guarded: `memfit.fit`'s step (its `last_peak_bytes` is the step's peak), or None.

    Returns:
        `(current, peak)`, or `(None, None)` when the device keeps no statistics.
    """
    info = tfb.memory_info(device)
    if info is None:
        return None, None
    current, peak = info["current"], info["peak"]
    guarded_peak = getattr(guarded, "last_peak_bytes", None)
    if guarded_peak is not None:
        peak = max(guarded_peak, current)
    return current, peak


def trace_count(guarded: Any, functions: Sequence[Any]) -> int | None:
    """How often the train function was traced so far, or None when it cannot be told.

    Args:
        guarded: `memfit.fit`'s step (it counts its traces), or None.
        functions: the `tf.function`s of Keras' train function (`tfb.traced_functions`).
    """
    if guarded is not None:
        return guarded.trace_count
    return tfb.tracing_count(functions) if functions else None
