"""The batch-size search's decisions: pure arithmetic on the trial peaks seen so far.

Nothing here measures, starts a process or imports TensorFlow: each function takes sizes,
peaks (bytes) and limits and returns the next size to try, a predicted peak, a size to soak
or whether the bracket is closed. `memfit.search` runs the trials (`memfit.search.trials`)
and asks these what to do next, so every decision has fast tests of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# Without a cap, the search stops doubling here.
DEFAULT_MAX_BATCH = 65536
PROBE_BATCH = 4
# How far short of a long extrapolation's prediction the search aims (see next_guess): its
# peak has come out 5% either side of the prediction, about two samples at 20-30 sizes on, and
# a size past the limit costs a fresh process (3-5 steps' time) where one short costs a step.
FAR_SHORTFALL = 0.12
# A calibration trial goes at most this many times further than the largest size measured.
CALIBRATION_GROWTH = 3
# Near the limit, the next size goes at most this share further than the largest that fits,
# and one short of the largest predicted to fit (a prediction can overshoot: an OOM costs a
# trial in a fresh process).
NEAR_STEP = 0.125
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


def limit_bytes(usable_bytes: int, margin: float, resident_bytes: int | None = None) -> int:
    """The most a fitting peak may reach: the budget less the margin (`margin` a share).

    With `resident_bytes` (what is in use before a step: weights, optimizer state), the
    margin is kept on what varies, the step's own bytes (peak less resident), not on the
    whole budget: a peak fits when `peak + margin * (peak - resident) <= budget`. A model
    whose weights and optimizer state fill most of the card gives up a margin's share of
    its step, not of its weights (60% resident, 5% margin: 12.5% of the step's bytes on
    the budget's share, 5% on the step's).

    Example:
        >>> limit_bytes(1000, 0.25)
        750
        >>> limit_bytes(1050, 0.05, resident_bytes=0)
        1000
    """
    if resident_bytes is None:
        return int(usable_bytes * (1 - margin))
    resident = min(max(0, int(resident_bytes)), usable_bytes)
    return int((usable_bytes + margin * resident) / (1 + margin))


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


def next_guess(
    peaks: dict[int, int], lo: int, hi: int | None, cap: int, limit: int
) -> tuple[int, int | None, bool]:
    """Next size to try, predicted from the measured peaks, kept inside the bracket.

    Far from the limit (more than half again the largest size that fits), the guess aims a
    little short and goes at most `CALIBRATION_GROWTH` times further: peaks are not linear
    in the batch, and a size that fits teaches the slope over a longer range, where an OOM
    would also cost a fresh process. Near the limit it goes one short of the largest size
    predicted to fit, and then up one at a time: peaks there grow faster than the line
    through smaller sizes predicts (ResNet50 under 3.25 GiB: 33 predicted at 3152 MiB from
    1, 4 and 12, measured 3290), a size that fits costs one more step in the same process,
    and one that fails a fresh process besides (its graph optimised again, a warm-up step),
    so the size above the last that fitted usually closes the bracket. A size that failed
    more than two above the largest that fits shows the peaks overestimated the room: the
    guess then stays a tenth of the gap below it, and no higher than halfway for small gaps
    (each OOM costs a fresh process; a size that fits lets the next ones run in the same
    process).

    Returns the guess, its predicted peak, and whether it is near the limit.
    """
    upper = min(cap, (hi - 1) if hi is not None else cap)
    peaks = peak_envelope(peaks)
    sizes = sorted(peaks)
    slope = bytes_per_sample(peaks)
    guess: int | None = None
    near = False
    if slope > 0:
        b = sizes[-1]
        reach = (limit - peaks[b]) / slope
        near = reach <= b / 2
        if not near:
            reach *= 1 - FAR_SHORTFALL
            guess = b + min(math.floor(reach), (CALIBRATION_GROWTH - 1) * b)
        else:
            guess = b + max(1, min(math.floor(reach) - 1, math.floor(b * NEAR_STEP)))
    if guess is None:
        # Prediction unusable (flat or falling peaks): double, or bisect.
        guess = lo * 2 if hi is None else (lo + hi) // 2
    if hi is not None and hi - lo > 2:
        guess = min(guess, max((lo + hi) // 2, hi - 1 - math.ceil((hi - lo) / 10)))
    guess = max(lo + 1, min(guess, upper))
    predicted = int(peaks[sizes[-1]] + slope * (guess - sizes[-1])) if slope > 0 else None
    return guess, predicted, near


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


def peak_envelope(peaks: dict[int, int]) -> dict[int, int]:
    """Peaks made non-decreasing in the batch size (each the largest measured at or below it).

    A step's true peak does not fall as the batch grows; a measured one can, near the limit,
    by about a sample's worth (MobileNetV2 64 px under 256 MiB, one search: 237.8 MiB at 34,
    232.6 MiB at 35, about 5.5 MiB a sample). Predicting from the lower one overshoots the
    limit, and each OOM costs a trial in a fresh process.
    """
    envelope, top = {}, 0
    for size in sorted(peaks):
        top = max(top, peaks[size])
        envelope[size] = top
    return envelope


def bytes_per_sample(peaks: dict[int, int]) -> float:
    """Bytes per sample: between the two largest fitting sizes when far enough apart (they
    follow any curvature; the allocator's jitter of a few MiB barely moves it), else between
    the smallest and the largest."""
    sizes = sorted(peaks)
    if len(sizes) < 2:
        return 0.0
    a, b = sizes[-2], sizes[-1]
    if b - a < max(3, b // 4):
        a = sizes[0]
    return (peaks[b] - peaks[a]) / (b - a)


def largest_fitting(
    peak_at: Callable[[int], int],
    known: dict[int, int],
    limit: int,
    *,
    cap: int = DEFAULT_MAX_BATCH,
    tolerance: float = 1 / 32,
    max_probes: int = 8,
) -> tuple[int | None, int | None]:
    """The largest size whose peak fits `limit`, guessed as the search guesses (`next_guess`).

    For peaks that cost no out-of-memory error to learn (a prediction such as
    `memfit.estimate`'s): `peak_at(size)` gives one, and each answer narrows the bracket
    between the largest size that fits and the smallest that does not, until it is within
    `tolerance` of the size that fits or `max_probes` sizes were asked about.

    Args:
        peak_at: a size's peak in bytes.
        known: peaks already known (size -> bytes); at least one size. Filled in as it goes.
        limit: the most a fitting peak may reach.
        cap: never a size above this.
        tolerance: stop once the bracket is within this share of the size that fits.
        max_probes: ask `peak_at` at most this many times.

    Returns:
        The largest size that fits and its peak, or `(None, None)` when the smallest known
        size does not fit.

    Example:
        >>> largest_fitting(lambda size: 100 + 10 * size, {1: 110, 4: 140}, limit=500)
        (40, 500)
    """
    fits = {size: peak for size, peak in known.items() if peak <= limit}
    if not fits or min(known) < min(fits):
        return None, None
    lo = max(fits)
    hi = min((size for size, peak in known.items() if peak > limit and size > lo), default=None)
    for _ in range(max_probes):
        if lo >= cap or (hi is not None and hi - lo <= max(1, math.floor(tolerance * lo))):
            break
        guess, _, _ = next_guess(fits, lo, hi, cap, limit)
        if guess <= lo or (hi is not None and guess >= hi):
            break
        known[guess] = peak_at(guess)
        if known[guess] <= limit:
            fits[guess] = known[guess]
            lo = guess
        else:
            hi = guess
    return lo, known[lo]
