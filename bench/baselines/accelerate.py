"""HF Accelerate's `find_executable_batch_size`: start high, shrink by 10% on every OOM.

Source followed: huggingface/accelerate, `src/accelerate/utils/memory.py`
(`find_executable_batch_size`, `reduce_batch_size_fn`),
https://github.com/huggingface/accelerate/blob/main/src/accelerate/utils/memory.py
"""

from __future__ import annotations

from collections.abc import Callable

STARTING_BATCH_SIZE = 128
STEPS_PER_TRIAL = 3


def find_executable_batch_size(
    runs: Callable[[int], bool], starting_batch_size: int = STARTING_BATCH_SIZE
) -> int:
    """The first size, going down from `starting_batch_size` by `int(size * 0.9)`, that runs.

    Accelerate runs the user's whole training function at each size; the benchmark runs
    `STEPS_PER_TRIAL` steps instead, the same work Lightning gives a trial. Returns 0 when no
    size runs (Accelerate raises "No executable batch size found, reached zero").
    """
    batch_size = starting_batch_size
    while batch_size > 0:
        if runs(batch_size):
            return batch_size
        batch_size = int(batch_size * 0.9)
    return 0
