"""Input timing: how long each training step waits for its batch, and what the batch was.

Keras (TensorFlow backend) reads the next batch *inside* its compiled train function
(`iterator.get_next()` in `multi_step_on_iterator`), so nothing in the callback hooks can see
the wait. While training, `Watch` swaps `model.train_function` for `timed_train_function`: it
takes the next batch itself (`next(iterator)`, timed: that is the wait), then runs Keras' own
compiled step on it (the path Keras takes for Python iterators). This needs
`steps_per_execution=1` and one replica; otherwise input wait is not measured.

Example:
    ```python
    fn = timed_train_function(model.train_function, on_step, on_error)
    model.train_function = fn
    ```
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from memfit.backend import tf as tfb


def first_input_shape(data: Any) -> list[int | None] | None:
    """The shape of a batch's first tensor (the first input: images, tokens), as a list.

    Walks the batch as `tf.nest` orders it (sequences in order, dicts by sorted key) without
    flattening it all: this runs on every step.

    Args:
        data: a batch as Keras' iterator yields it (`(x, y)`, `(x, y, w)`, dicts, or
            per-replica values).
    """
    leaf = _first_leaf(data, 0)
    shape = getattr(leaf, "shape", None) if leaf is not None else None
    if shape is None:
        return None
    return [None if d is None else int(d) for d in shape]


def _first_leaf(data: Any, depth: int) -> Any:
    if depth > 8:
        return None
    if isinstance(data, dict):
        items: Any = (data[key] for key in sorted(data))
    elif isinstance(data, (tuple, list)):
        items = data
    else:
        values = getattr(data, "values", None)  # per-replica values
        if isinstance(values, tuple) and values:
            data = values[0]
        shape = getattr(data, "shape", None)
        return data if shape is not None and len(shape) else None
    for item in items:
        leaf = _first_leaf(item, depth + 1)
        if leaf is not None:
            return leaf
    return None


def timed_train_function(
    original: Callable[[Any], Any],
    on_step: Callable[[float, float, float, Any], None],
    on_error: Callable[[BaseException, Any], None],
    before_step: Callable[[], None] | None = None,
) -> Callable[[Any], Any]:
    """Wrap Keras' train function so that it takes (and times) each batch itself.

    Args:
        original: Keras' (or memfit.fit's) train function, `fn(iterator) -> logs`.
        on_step: called after each step with `(started, ready, ended, data)`:
            `perf_counter` times when it asked for the batch, got it and finished the step.
        on_error: called with the exception and the batch when the step raised (then the
            exception goes on).
        before_step: called between getting the batch and running the step (e.g. to reset
            the device's peak memory).
    """

    def train_function(iterator: Any) -> Any:
        started = time.perf_counter()
        data = next(iterator)  # StopIteration ends the epoch, as in Keras' own function
        ready = time.perf_counter()
        if before_step is not None:
            before_step()
        try:
            outputs = original(iter([data]))
        except BaseException as exc:
            on_error(exc, data)
            raise
        on_step(started, ready, time.perf_counter(), data)
        return outputs

    train_function.guarded_step = getattr(original, "guarded_step", None)  # type: ignore[attr-defined]
    return train_function


def oom_of(exc: BaseException | None) -> BaseException | None:
    """TensorFlow's OOM error behind `exc`: itself, or the one a memfit error was raised from.

    `memfit.fit` answers an OOM it cannot recover from (one sample per micro-batch) with a
    `MemfitError` raised `from None`; the OOM is still its `__context__`.
    """
    seen = 0
    while exc is not None and seen < 5:
        if tfb.is_oom(exc):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None
