"""The batch-size search's decisions (`memfit.search.strategy`): pure arithmetic, no TensorFlow.

Each case works its numbers out by hand in the comments; peaks are plain bytes (the functions
do not care about units), chosen so the lines through them have whole slopes.
"""

import ast
import inspect

import pytest

import memfit.search
from memfit.budget.fitting import bytes_per_sample, limit_bytes, next_guess, peak_envelope
from memfit.search import strategy
from memfit.search.strategy import (
    bracket_closed,
    first_soak_size,
    next_soak_size,
    predicted_peak,
    probe_size,
    search_cap,
    soak_rise,
    soak_size,
    spare_worth_starting,
)

# 1 -> 100, 5 -> 300 (50 a sample), 10 -> 500 (40 a sample).
PEAKS = {1: 100, 5: 300, 10: 500}


def _imports(module: object) -> set[str]:
    imported = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    return imported


def test_the_strategy_imports_nothing_but_math_and_types():
    import memfit.budget.fitting as fitting

    # No TensorFlow, no process: the fitting arithmetic, and the strategy on top of it.
    assert _imports(fitting) == {"__future__", "collections.abc", "math"}
    assert _imports(strategy) == {"__future__", "math", "memfit.budget.fitting"}


def test_the_package_still_exports_the_constants_it_had():
    for name in ("DEFAULT_MAX_BATCH", "PROBE_BATCH", "DEFAULT_SOAK_STEPS", "SOAK_RISE"):
        assert getattr(memfit.search, name) == getattr(strategy, name)
    assert memfit.search.DEFAULT_SOAK_STEPS == 20 and memfit.search.SOAK_RISE == 1.10
    assert memfit.search.CHILD_SAMPLES == 512


def test_the_limit_is_the_budget_less_the_margin_rounded_down():
    assert limit_bytes(1000, 0.0) == 1000
    assert limit_bytes(1000, 0.25) == 750
    assert limit_bytes(1001, 0.5) == 500  # 500.5, rounded down


def test_with_what_is_resident_the_margin_is_kept_on_the_steps_bytes():
    # 600 of 1000 resident, 5% margin: peak + 0.05 * (peak - 600) <= 1000 -> 980.9.
    limit = limit_bytes(1000, 0.05, resident_bytes=600)
    assert limit == 980
    assert limit + 0.05 * (limit - 600) <= 1000 < (limit + 1) + 0.05 * (limit + 1 - 600)
    # The room given up: 5% of the step's 380 (and a byte of rounding), where 5% of the
    # budget gave up 50 on a step of 350 (14%).
    assert 1000 - limit <= 0.05 * (limit - 600) + 1
    assert (1000 - limit_bytes(1000, 0.05)) / (limit_bytes(1000, 0.05) - 600) > 0.14
    # Nothing resident: the budget over 1.05; resident past the budget counts as the budget.
    assert limit_bytes(1050, 0.05, resident_bytes=0) == 1000
    assert limit_bytes(1000, 0.05, resident_bytes=5000) == 1000


def test_the_cap_is_max_batch_or_a_smaller_dataset():
    assert search_cap(None, None) == (65536, "max_batch")
    assert search_cap(64, None) == (64, "max_batch")
    assert search_cap(64, 50) == (50, "dataset_size")
    assert search_cap(64, 64) == (64, "max_batch")  # not smaller: max_batch caps it
    assert search_cap(None, 1000) == (1000, "dataset_size")


def test_the_probe_is_batch_4_unless_the_cap_is_lower():
    assert probe_size(100) == 4
    assert probe_size(2) == 2


def test_the_bracket_closes_at_neighbours_or_within_the_margin():
    assert not bracket_closed(8, None, 0.05)  # nothing failed yet
    assert bracket_closed(8, 9, 0.05)
    # 5% of 8 is 0.4 sizes: at least one, so 8 and 10 are still apart.
    assert not bracket_closed(8, 10, 0.05)
    # 5% of 40 is 2 sizes: 40 and 42 are close enough, 43 is not.
    assert bracket_closed(40, 42, 0.05)
    assert not bracket_closed(40, 43, 0.05)
    assert bracket_closed(100, 101, 0.0) and not bracket_closed(100, 102, 0.0)


def test_a_spare_process_is_started_when_an_oom_is_likely_and_trials_would_follow():
    assert not spare_worth_starting(10, 8, None, near=False)  # far, nothing failed
    assert spare_worth_starting(10, 8, None, near=True)
    assert spare_worth_starting(10, 8, 12, near=False)  # a size failed already
    # lo + 1: its OOM closes the bracket, nothing would run in the spare.
    assert not spare_worth_starting(9, 8, 12, near=True)


def test_the_envelope_never_lets_a_peak_fall_as_the_batch_grows():
    assert peak_envelope({1: 10, 4: 40, 6: 35, 8: 50}) == {1: 10, 4: 40, 6: 40, 8: 50}
    assert peak_envelope({}) == {}


def test_bytes_per_sample_between_the_two_largest_when_far_enough_apart():
    assert bytes_per_sample({1: 100}) == 0.0
    assert bytes_per_sample({1: 100, 4: 160}) == 20.0  # 60 over 3 sizes
    # 4 and 12 are 8 apart (at least 3 and a quarter of 12): (400 - 160) / 8.
    assert bytes_per_sample({1: 100, 4: 160, 12: 400}) == 30.0
    # 12 and 13 are too close (jitter would dominate): from 1 instead, (460 - 100) / 12.
    assert bytes_per_sample({1: 100, 12: 400, 13: 460}) == 30.0


def test_a_peak_is_predicted_by_interpolation_and_beyond_by_the_last_slope():
    assert predicted_peak({}, 4) is None
    assert predicted_peak(PEAKS, 5) == 300  # measured
    assert predicted_peak(PEAKS, 5, rise=1.1) == 330
    assert predicted_peak(PEAKS, 3) == 200  # 1 -> 5 at 50 a sample: 100 + 2 * 50
    assert predicted_peak(PEAKS, 8) == 420  # 5 -> 10 at 40 a sample: 300 + 3 * 40
    assert predicted_peak(PEAKS, 12) == 580  # beyond 10, 40 a sample: 500 + 2 * 40
    # A peak that fell (6 under 5) counts as 5's: 6 predicts 300, and 7 goes on at
    # (300 - 100) / 5 = 40 a sample from 1 (5 and 6 are too close for a slope).
    fell = {1: 100, 5: 300, 6: 280}
    assert predicted_peak(fell, 6) == 300
    assert predicted_peak(fell, 7) == 340


def test_the_soak_size_is_the_largest_whose_risen_peak_stays_within_the_limit():
    # No rise: 8 at 420 fits 450, 9 at 460 does not.
    assert soak_size(PEAKS, 10, 450, 1.0) == 8
    # Raised 25%: 6 at 340 * 1.25 = 425 fits, 7 at 380 * 1.25 = 475 does not.
    assert soak_size(PEAKS, 10, 450, 1.25) == 6
    assert soak_size(PEAKS, 5, 450, 1.0) == 5  # never above `upper`
    assert soak_size({1: 500}, 1, 450, 1.0) == 0  # even batch 1 over the limit
    assert soak_size({}, 7, 450, 1.0) == 7  # nothing measured: `upper`


def test_the_first_soak_assumes_the_default_rise_and_is_at_least_batch_1():
    # x1.1: 7 at 380 * 1.1 = 418 fits 450, 8 at 420 * 1.1 = 462 does not.
    assert first_soak_size(PEAKS, 10, 450) == 7
    # Batch 1 predicted at 550 with the rise: still soaked, only a soak says it fails.
    assert first_soak_size({1: 500}, 1, 450) == 1


def test_a_failed_soak_raises_the_rise_to_its_own_never_lowers_it():
    assert soak_rise(1.1, 480, 400) == pytest.approx(1.2)
    assert soak_rise(1.1, 300, 400) == 1.1  # rose less than assumed: keep the assumption
    assert soak_rise(1.1, None, 400) == 1.1  # an OOM without a peak
    assert soak_rise(1.1, 480, None) == 1.1


def test_the_next_soak_is_never_the_size_that_failed_nor_above_it():
    # x1.25 puts the largest at 6 (see above): after 7 failed, 6.
    assert next_soak_size(PEAKS, 7, 450, 1.25) == 6
    # After 6 failed at the same rise: 5, though 6 is predicted to hold.
    assert next_soak_size(PEAKS, 6, 450, 1.25) == 5
    # x2: 3 at 200 * 2 = 400 fits, 4 at 250 * 2 = 500 does not.
    assert next_soak_size(PEAKS, 6, 450, 2.0) == 3
    # x5: batch 1 predicted at 500, over; it fitted its trial, so a soak of it decides (a
    # rise from a large size's soak, on the whole peak, overstates a small size's). Seen: an
    # in-process search under 64 MiB answered 0 where batch 1 peaked at 48 MiB.
    assert next_soak_size(PEAKS, 6, 450, 5.0) == 1
    # Only after batch 1's own soak failed is nothing left.
    assert next_soak_size(PEAKS, 1, 450, 1.0) == 0


def test_far_from_the_limit_the_guess_grows_at_most_3x():
    # 20 a sample from 4 at 160: 42 sizes of room, 12% short is 36.96, but 3x 4 caps it at 12.
    assert next_guess({1: 100, 4: 160}, 4, None, 1000, 1000) == (12, 320, False)
    # 30 a sample from 12 at 400: 20 sizes of room, 12% short is 17.6: 12 + 17 = 29.
    assert next_guess({1: 100, 4: 160, 12: 400}, 12, None, 1000, 1000) == (29, 910, False)


def test_near_the_limit_the_guess_goes_one_short_and_at_most_an_eighth_further():
    # 30 a sample from 29 at 910: 3 sizes of room (near: at most half of 29), one short: 31.
    peaks = {1: 100, 4: 160, 12: 400, 29: 910}
    assert next_guess(peaks, 29, None, 1000, 1000) == (31, 970, True)
    # 20 a sample from 32 at 720: 14 sizes of room, one short is 13, an eighth of 32 is 4.
    assert next_guess({1: 100, 32: 720}, 32, None, 1000, 1000) == (36, 800, True)
    # One size of room, or half of one: the next size up.
    assert next_guess({1: 100, 32: 720}, 32, None, 1000, 740) == (33, 740, True)
    assert next_guess({1: 100, 32: 720}, 32, None, 1000, 730) == (33, 740, True)


def test_the_guess_stays_below_a_size_that_failed_and_within_the_cap():
    peaks = {1: 100, 4: 160}  # 20 a sample; unbounded the guess would be 12
    # 8 failed: halfway, and a tenth of the gap below 8 (8 - 1 - 1): 6.
    assert next_guess(peaks, 4, 8, 1000, 1000) == (6, 200, False)
    # 6 failed: the only size between, 5.
    assert next_guess(peaks, 4, 6, 1000, 1000) == (5, 180, False)
    # 10 failed: at most max(halfway 7, 10 - 1 - 1 = 8) = 8.
    assert next_guess(peaks, 4, 10, 1000, 10000) == (8, 240, False)
    assert next_guess(peaks, 4, None, 10, 1000) == (10, 280, False)


def test_flat_or_falling_peaks_double_or_bisect():
    assert next_guess({1: 100, 4: 100}, 4, None, 1000, 1000) == (8, None, False)
    assert next_guess({1: 100, 4: 90}, 4, None, 1000, 1000) == (8, None, False)
    # Bisect between 4 and 10: 7 (under the tenth-of-the-gap bound, 8).
    assert next_guess({1: 100, 4: 100}, 4, 10, 1000, 1000) == (7, None, False)
    assert next_guess({1: 100}, 1, None, 1000, 1000) == (2, None, False)  # at least lo + 1


def test_a_linear_model_is_bracketed_in_8_trials_and_soaked_below_it():
    # Peaks 100 + 20 a sample under a limit of 1000 (margin 0): 45 is the largest that fits.
    def peak(size):
        return 100 + 20 * size

    limit, cap = 1000, 65536
    peaks, tried = {}, []

    def trial(size):
        tried.append(size)
        if peak(size) <= limit:
            peaks[size] = peak(size)
            return True
        return False

    trial(1)
    lo, hi = (probe_size(cap), None) if trial(probe_size(cap)) else (1, probe_size(cap))
    while not bracket_closed(lo, hi, 0.0):
        guess, predicted, _ = next_guess(peaks, lo, hi, cap, limit)
        assert predicted == peak(guess)  # the line is exact here
        if trial(guess):
            lo = guess
        else:
            hi = guess
    # 4 -> 12 (3x), 12 -> 36 (3x), then near: 40 (9 sizes of room, an eighth of 36 is 4),
    # 44 (5 sizes of room, one short), 45 (one size of room), 46 fails.
    assert tried == [1, 4, 12, 36, 40, 44, 45, 46]
    assert (lo, hi) == (45, 46)
    # The first soak: x1.1 keeps 40 within (900 * 1.1 = 990), not 41 (920 * 1.1 = 1012).
    size = first_soak_size(peaks, lo, limit)
    assert size == 40
    # 40's soak peaked at 1035, x1.15 its trial peak: 38 holds (860 * 1.15 = 989), 39 not.
    rise = soak_rise(strategy.SOAK_RISE, 1035, predicted_peak(peaks, size))
    assert rise == pytest.approx(1.15)
    assert next_soak_size(peaks, size, limit, rise) == 38


def test_largest_fitting_closes_on_the_largest_size_that_fits_predicted_peaks():
    # A prediction with a curve (peaks grow faster than the line through small sizes): the
    # answer is within the tolerance below the true largest (418), never above it, in a few
    # predictions, as memfit.estimate's largest-batch what-if asks them.
    from memfit.budget.fitting import largest_fitting

    asked: list[int] = []

    def peak_at(size: int) -> int:
        asked.append(size)
        return 1000 + 37 * size + size * size // 50

    known = {32: peak_at(32), 64: peak_at(64)}
    size, peak = largest_fitting(peak_at, known, 20_000)
    assert 418 - 418 // 32 <= size <= 418 and peak == peak_at(size) <= 20_000
    assert len(asked) - 3 <= 8 and known[size] == peak
    # Nothing fits: no answer; a cap holds; a line is solved exactly.
    assert largest_fitting(peak_at, {32: peak_at(32)}, 100) == (None, None)
    assert largest_fitting(peak_at, {32: peak_at(32)}, 20_000, cap=100)[0] == 100
    assert largest_fitting(lambda s: 100 + 10 * s, {1: 110, 4: 140}, 500) == (40, 500)


class _LinearRunner:
    """A `TrialRunner` stand-in: 600 bytes resident, 10 a sample, 1000 usable.

    `child=True` reads the resident bytes itself before the search sees the measurement, as
    `TrialRunner` does from a child's resident mark; `child=False` leaves them to the search,
    as the in-process path does.
    """

    dataset_size = None
    worst_case = False
    largest_sample = None
    samples_read = None

    def __init__(self, child: bool) -> None:
        self.in_child = child
        self.resident_bytes: int | None = None

    def measure(self, size: int, repeats: int = 1, soak: bool = False):
        from memfit.measuring.measurement import Measurement

        if self.in_child:
            self.resident_bytes = 600
        peak = 600 + 10 * size
        oom = peak > 1000
        m = Measurement(size, "CPU:0", oom, None if oom else peak, 600, None if oom else 0.1)
        return m, False, False

    def expect_oom(self) -> None:
        pass

    def fresh_process(self) -> None:
        pass


@pytest.mark.parametrize("child", [True, False], ids=["child", "in_process"])
def test_the_search_keeps_the_margin_on_the_steps_bytes_in_a_child_as_in_process(child):
    from memfit.budget.budget import Budget
    from memfit.search.finder import _search

    budget = Budget(usable_bytes=1000, name="test", source="test")
    result = _search(_LinearRunner(child), budget, None, 0.05, 0, None)
    # 600 + 10 b + 0.05 * 10 b <= 1000 -> b <= 38.1: 38 (on the whole budget: 35).
    assert result.limit_bytes == limit_bytes(1000, 0.05, resident_bytes=600)
    assert result.batch_size == 38
