"""PyTorch Lightning's batch-size finder (`Tuner.scale_batch_size`), modes power and binsearch.

Followed line by line: Lightning 2.6.5 (the current release, tag `2.6.5`),
`src/lightning/pytorch/tuner/batch_size_scaling.py` (`_scale_batch_size`,
`_run_power_scaling`, `_run_binsearch_scaling`, `_adjust_batch_size`),
https://github.com/Lightning-AI/pytorch-lightning/blob/2.6.5/src/lightning/pytorch/tuner/batch_size_scaling.py

Defaults as `Tuner.scale_batch_size` and the `BatchSizeFinder` callback have them:
`mode="power"`, `init_val=2`, `steps_per_trial=3`, `max_trials=25`, `margin=0.05`,
`max_val=8192`.

- power: double after every success; after an OOM halve, and stop if any trial succeeded
  (otherwise go on halving: a first size that fails is not the end). Every trial, success or
  OOM, counts against `max_trials`. A size at or above `max_val` stops the search untried.
- binsearch: double until the first OOM, then bisect between the last success (`low`, from 1)
  and the failure (`high`) until they are one apart; only successes count against
  `max_trials`; a size at or above `max_val` stops the search untried. The size the loop ends
  on is then reduced by the margin: `max(1, int(size * (1 - margin)))`.

Lightning's own quirks are kept, as users meet them: binsearch can end on a size that failed
or was never tried (an OOM at `init_val` ends on 1 untried; an OOM at 1 ends on 1), power's
doubling is capped at 8192 whatever `max_val` is (`_adjust_batch_size`'s default), and a batch
size at or above the dataset's length stops the growth (`dataset_length`). One deviation:
power's halving below 1 gives 0, where Lightning would go on to build a DataLoader with
`batch_size=0` (which raises); here the search stops and answers 0.
"""

from __future__ import annotations

from collections.abc import Callable

VERSION = "2.6.5"
INIT_VAL = 2
STEPS_PER_TRIAL = 3
MAX_TRIALS = 25
MARGIN = 0.05
MAX_VAL = 8192


def _adjust(
    size: int,
    *,
    factor: float = 1.0,
    value: int | None = None,
    max_val: int = MAX_VAL,
    dataset_length: int | None = None,
) -> tuple[int, bool]:
    """Lightning's `_adjust_batch_size`: the next size, and whether it differs from `size`.

    Args:
        size: the current batch size.
        factor: multiply `size` by this (truncated to an int) when `value` is not given.
        value: the next size, overriding `factor`.
        max_val: cap on the next size.
        dataset_length: samples in the dataset; at or above it the size does not change.

    Example:
        >>> _adjust(16, factor=2.0)
        (32, True)
        >>> _adjust(6000, factor=2.0)
        (8192, True)
    """
    if dataset_length is not None and size >= dataset_length:
        return size, False
    new_size = value if value is not None else int(size * factor)
    new_size = min(new_size, max_val)
    return new_size, new_size != size


def power_scaling(
    runs: Callable[[int], bool],
    init_val: int = INIT_VAL,
    max_trials: int = MAX_TRIALS,
    max_val: int = MAX_VAL,
    dataset_length: int | None = None,
) -> int:
    """Lightning `mode="power"` (`_run_power_scaling`): the size after the first OOM's halving.

    Args:
        runs: trains `STEPS_PER_TRIAL` steps at a size; True when there was no OOM.
        init_val: first size tried.
        max_trials: trials (successes and OOMs) before the search stops.
        max_val: a size at or above this stops the search untried.
        dataset_length: samples in the dataset (None: an iterable dataset without a length).

    Returns:
        The size Lightning would continue with (0 when even size 1 ran out of memory).

    Example:
        >>> power_scaling(lambda size: size <= 40)
        32
    """
    new_size = min(init_val, MAX_VAL)  # `_adjust_batch_size(trainer, value=init_val)`
    any_success = False
    for i in range(max_trials):
        if new_size >= max_val:
            break
        if new_size < 1:
            break  # Lightning would build a DataLoader with batch_size=0 here (and raise)
        if runs(new_size):
            last_successful_size = new_size
            if i + 1 >= max_trials:
                new_size = last_successful_size
                break
            # `_adjust_batch_size(trainer, batch_arg_name, factor=2.0, ...)`: no max_val given.
            new_size, changed = _adjust(new_size, factor=2.0, dataset_length=dataset_length)
            if not changed:
                break
            any_success = True
        else:
            new_size, _ = _adjust(new_size, factor=0.5, dataset_length=dataset_length)
            if any_success:
                break
    return new_size


def binsearch_scaling(
    runs: Callable[[int], bool],
    init_val: int = INIT_VAL,
    max_trials: int = MAX_TRIALS,
    margin: float = MARGIN,
    max_val: int = MAX_VAL,
    dataset_length: int | None = None,
) -> int:
    """Lightning `mode="binsearch"` (`_run_binsearch_scaling`): bisect, then take off the margin.

    Args:
        runs: trains `STEPS_PER_TRIAL` steps at a size; True when there was no OOM.
        init_val: first size tried.
        max_trials: successful trials before the search stops.
        margin: share taken off the size the search ends on (Lightning's default 0.05).
        max_val: a size at or above this stops the search untried.
        dataset_length: samples in the dataset (None: an iterable dataset without a length).

    Returns:
        The batch size Lightning sets on the model.

    Example:
        >>> binsearch_scaling(lambda size: size <= 40)
        38
        >>> binsearch_scaling(lambda size: size <= 40, margin=0.0)
        40
    """
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"`margin` should be between 0 and 1. Found margin={margin}")
    new_size = min(init_val, MAX_VAL)  # `_adjust_batch_size(trainer, value=init_val)`
    low, high, count = 1, None, 0
    while True:
        if new_size >= max_val:
            break
        if runs(new_size):
            last_successful_size = new_size
            count += 1
            if count >= max_trials:
                new_size = last_successful_size
                break
            low = new_size
            if high:
                if high - low <= 1:
                    break
                new_size, changed = _adjust(
                    new_size,
                    value=(high + low) // 2,
                    max_val=max_val,
                    dataset_length=dataset_length,
                )
            else:
                new_size, changed = _adjust(
                    new_size, factor=2.0, max_val=max_val, dataset_length=dataset_length
                )
            if not changed:
                break
        else:
            high = new_size
            new_size, _ = _adjust(new_size, value=(high + low) // 2, dataset_length=dataset_length)
            if high - low <= 1:
                break
    if margin > 0:
        new_size = max(1, int(new_size * (1 - margin)))
    return new_size
