"""What fits a budget: the limit a step's peak must stay under, and the largest size that fits it.

Pure arithmetic on peaks (bytes) by batch size: nothing here measures, starts a process or
imports TensorFlow. The batch-size search (`memfit.search.strategy`) guesses its next trial
with `next_guess`; the estimate (`memfit.estimation.largest_batch`) asks `largest_fitting`
the same guesses of its predicted peaks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# Without a cap, the search stops doubling here.
DEFAULT_MAX_BATCH = 65536
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
