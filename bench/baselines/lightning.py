"""PyTorch Lightning's BatchSizeFinder (`tuner/batch_size_scaling.py`), modes power and binsearch.

Faithful to Lightning's control flow: start at `init_val=2`, run `steps_per_trial=3` training
steps per trial, count only successful trials against `max_trials=25`. `power` doubles until
an OOM, then halves once and stops. `binsearch` doubles until an OOM, then bisects between
the last success (`low`) and the failure (`high`) until they are one apart.

Source followed: Lightning-AI/pytorch-lightning, `src/lightning/pytorch/tuner/
batch_size_scaling.py` (`_run_power_scaling`, `_run_binary_scaling`),
https://github.com/Lightning-AI/pytorch-lightning/blob/master/src/lightning/pytorch/tuner/batch_size_scaling.py
"""

from __future__ import annotations

from collections.abc import Callable

INIT_VAL = 2
STEPS_PER_TRIAL = 3
MAX_TRIALS = 25


def power_scaling(
    runs: Callable[[int], bool], init_val: int = INIT_VAL, max_trials: int = MAX_TRIALS
) -> int:
    """Lightning `mode="power"`: the last size before the first OOM (a power of two)."""
    new_size = init_val
    for _ in range(max_trials):
        if runs(new_size):
            new_size *= 2
        else:
            new_size = max(1, new_size // 2)
            break
    return new_size


def binsearch_scaling(
    runs: Callable[[int], bool], init_val: int = INIT_VAL, max_trials: int = MAX_TRIALS
) -> int:
    """Lightning `mode="binsearch"`: double to the first OOM, then bisect to a 1-size bracket."""
    new_size, low, high, count = init_val, 1, None, 0
    while True:
        if runs(new_size):
            count += 1
            if count > max_trials:
                break
            low = new_size
            if high:
                if high - low <= 1:
                    break
                new_size = (high + low) // 2
            else:
                new_size *= 2
        else:
            high = new_size
            new_size = (high + low) // 2
            if high - low <= 1:
                break
    return new_size
