"""The batch-size search's decisions: pure arithmetic on the trial peaks seen so far.

Nothing here measures, starts a process or imports TensorFlow: each function takes sizes,
peaks (bytes) and limits and returns the next size to try, a predicted peak, a size to soak
or whether the bracket is closed. `memfit.search` runs the trials (`memfit.search.trials`)
and asks these what to do next, so every decision has fast tests of its own.
"""

from __future__ import annotations

import math

from memfit.budget.fitting import (
    DEFAULT_MAX_BATCH,
    bytes_per_sample,
    peak_envelope,
)

PROBE_BATCH = 4
# Steps the size found trains before it is the answer (a soak, the step `model.fit` runs, in a
# fresh process): near the limit a step's peak rises over the first steps of training as the
# allocator's free chunks split up (BFC hands a request a whole free chunk up to twice its
# size), so a size that ran two steps can run out of memory a few steps later (MobileNetV2
# 224 px under 2.3 GiB: 35 ran 3 steps and ran out at the 4th, 33 at the 6th). Under one
# region the rise went on past 15 steps (MobileNetV2 160 px, batch 32, 20 steps of
# `model.fit`: 1009 MiB at the first, 1042-1062 at steps 2-6, 1088-1107 at steps 13-18).
DEFAULT_SOAK_STEPS = 20
# How much a size's peak over the soak's steps, back to back in a fresh process, comes above
# its one-step trial peak, as the first soak assumes. MobileNetV2 96 px under 500 MiB:
# trials 31 at 425.6 MiB and 33 at 443.1, soaks 454.3 (x1.067) and 499.8
# (x1.128); on a roomy card (2 GiB) the rise is larger, x1.12-1.22 at batch 32, as the
# allocator has free chunks up to twice a request's size to hand out whole.
SOAK_RISE = 1.10


def search_cap(max_batch: int | None, dataset_size: int | None) -> tuple[int, str]:
    """The largest size the search may try, and what caps it (`"max_batch"`, the default
    `DEFAULT_MAX_BATCH` included, or `"dataset_size"` when the dataset is smaller)."""
    cap = int(max_batch) if max_batch is not None else DEFAULT_MAX_BATCH
    if dataset_size is not None and dataset_size < cap:
        return dataset_size, "dataset_size"
    return cap, "max_batch"


def probe_size(cap: int) -> int:
    """The second size tried, after batch 1 (only when `cap >= 2`)."""
    return min(cap, PROBE_BATCH)


def bracket_closed(lo: int, hi: int | None, margin: float) -> bool:
    """Whether the largest size that fits (`lo`) and the smallest that fails (`hi`) are next
    to each other, or within the margin's share of `lo`."""
    return hi is not None and hi - lo <= max(1, math.floor(margin * lo))


def spare_worth_starting(guess: int, lo: int, hi: int | None, near: bool) -> bool:
    """Whether to get a fresh process ready before trying `guess`: an OOM is likely (a size
    has failed, or the guess is near the limit) and more trials would follow it (not for
    `lo + 1`, whose OOM ends the search)."""
    return (hi is not None or near) and guess > lo + 1


def predicted_peak(peaks: dict[int, int], size: int, rise: float = 1.0) -> int | None:
    """A size's one-step trial peak, from the measured ones, times `rise`.

    Measured sizes give their envelope peak (see `peak_envelope`); others lie on the line
    through the two nearest measured sizes below and above (or `bytes_per_sample` beyond the
    largest).
    """
    envelope = peak_envelope(peaks)
    if not envelope:
        return None
    if size in envelope:
        return int(envelope[size] * rise)
    below = [s for s in envelope if s < size]
    above = [s for s in envelope if s > size]
    if below and above:
        a, b = max(below), min(above)
        slope = (envelope[b] - envelope[a]) / (b - a)
        return int((envelope[a] + slope * (size - a)) * rise)
    anchor = max(below) if below else min(above)
    return int((envelope[anchor] + bytes_per_sample(envelope) * (size - anchor)) * rise)


def soak_size(peaks: dict[int, int], upper: int, limit: int, rise: float) -> int:
    """The largest size up to `upper` whose trial peak times `rise` stays within `limit`.

    Peaks between measured sizes are interpolated (`predicted_peak`), which keeps them
    non-decreasing in the size, so the size is bisected; 0 when even batch 1 is predicted
    over the limit.
    """
    if not peaks:
        return upper
    lo, hi = 0, upper  # lo holds (or is 0), every size above hi fails
    while lo < hi:
        middle = (lo + hi + 1) // 2
        if (predicted_peak(peaks, middle, rise) or 0) <= limit:
            lo = middle
        else:
            hi = middle - 1
    return lo


def first_soak_size(peaks: dict[int, int], lo: int, limit: int, rise: float = SOAK_RISE) -> int:
    """The size the first soak trains: the largest up to `lo` (the largest size whose trial
    fitted) predicted to stay within `limit` with `rise`, and at least batch 1, which fitted
    its trial (only a soak may say it does not train)."""
    return max(1, soak_size(peaks, lo, limit, rise))


def soak_rise(rise: float, soaked_peak: int | None, trial_peak: int | None) -> float:
    """The rise the next soak assumes after one failed: the failed soak's own peak over its
    trial peak (predicted), when larger than `rise`; else `rise`."""
    if soaked_peak and trial_peak and soaked_peak / trial_peak > rise:
        return soaked_peak / trial_peak
    return rise


def next_soak_size(peaks: dict[int, int], failed: int, limit: int, rise: float) -> int:
    """The size the next soak trains after `failed` did not hold: smaller than `failed`, and
    the largest predicted to stay within `limit` with `rise`; at least batch 1 (only a soak
    may say it does not train: a rise measured at a large size, applied to the whole peak,
    can predict every size over the limit), 0 once batch 1 itself failed."""
    if failed <= 1:
        return 0
    return max(1, min(failed - 1, soak_size(peaks, failed, limit, rise)))


