"""TensorBoard output of `memfit.Watch`: step records as `memfit/...` scalar series.

With `Watch(log_dir=...)` each epoch's steps go to TensorBoard as the scalars
`memfit/memory_current_bytes`, `memfit/memory_peak_bytes`, `memfit/step_seconds`,
`memfit/input_wait_seconds` and `memfit/loss`, one whole series per tag and call (see
`memfit.backend.tf_summary.ScalarWriter`: one call per record would cost more than a step).

Example:
    ```python
    writer = tfb.ScalarWriter("logs")
    write_scalars(writer, watch.steps, loss_of=lambda step: None)
    ```
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

# The step record keys written as scalars (the loss comes from `loss_of`).
SCALARS = ("memory_current_bytes", "memory_peak_bytes", "step_seconds", "input_wait_seconds")


def scalar_series(
    records: Sequence[dict[str, Any]], loss_of: Callable[[int], float | None]
) -> dict[str, tuple[list[int], list[float]]]:
    """The finite values of `records` per TensorBoard tag: `{tag: (steps, values)}`.

    Args:
        records: step records (log step lines).
        loss_of: the loss of a step, or None when it has none (yet).
    """
    series: dict[str, tuple[list[int], list[float]]] = {}

    def add(key: str, step: int, value: Any) -> None:
        if value is not None and math.isfinite(value):
            steps, values = series.setdefault(f"memfit/{key}", ([], []))
            steps.append(step)
            values.append(float(value))

    for r in records:
        for key in SCALARS:
            add(key, r["step"], r.get(key))
        add("loss", r["step"], loss_of(r["step"]))
    return series


def write_scalars(
    writer: Any, records: Sequence[dict[str, Any]], loss_of: Callable[[int], float | None]
) -> None:
    """Write the series of `records` with `writer` (a `tfb.ScalarWriter`) and flush it.

    Args:
        writer: has `write(tag, steps, values)` and `flush()`.
        records: step records (log step lines) not written before.
        loss_of: the loss of a step, or None when it has none (yet).
    """
    for tag, (steps, values) in scalar_series(records, loss_of).items():
        writer.write(tag, steps, values)
    writer.flush()
