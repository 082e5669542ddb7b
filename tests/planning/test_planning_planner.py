"""The planner's flow (`memfit.planning.planner`) over fake trials: no child process.

The trials are replaced by arithmetic: a configuration's peak at K is 100 bytes resident plus
its bytes a sample times the micro-batch, and the limit is 300. The real processes are
tested in test_plan.py.
"""

import contextlib
import math

import pytest

from memfit.budget.budget import Budget
from memfit.planning.planner import Planner

LIMIT = 300
RESIDENT = 100
PER_SAMPLE = {"float32": 20, "mixed_float16": 10}
SECONDS = {("float32", 2): 0.2, ("mixed_float16", 1): 0.3}


def peak(candidate) -> int:
    return RESIDENT + PER_SAMPLE[candidate.precision] * candidate.micro_batch_size


class FakeEstimator:
    device = "CPU"

    def predict(self, candidate):
        candidate.predicted_peak_bytes = peak(candidate)
        candidate.fits = candidate.predicted_peak_bytes <= LIMIT
        return RESIDENT


class FakeTrials:
    def __init__(self, holds):
        self.holds, self.estimated, self.measured, self.confirmed = holds, [], [], []

    @contextlib.contextmanager
    def estimator(self):
        yield FakeEstimator()

    def measure(self, candidate):
        self.measured.append((candidate.precision, candidate.micro_batches))
        candidate.measured = True
        candidate.peak_bytes = peak(candidate)
        candidate.step_seconds = SECONDS.get((candidate.precision, candidate.micro_batches))
        candidate.fits = candidate.peak_bytes <= LIMIT

    def confirm(self, candidate, steps):
        key = (candidate.precision, candidate.micro_batches)
        self.confirmed.append(key)
        candidate.confirmed = candidate.fits = key in self.holds
        candidate.recoveries = [] if candidate.confirmed else ["out of memory: OOM"]
        return candidate.confirmed


def planner(holds, seen=None) -> Planner:
    p = Planner(16, Budget.from_size("1GiB"), LIMIT, {}, 1, seen)
    p.trials = FakeTrials(holds)
    return p


CONFIGS = [("float32", None), ("mixed_float16", None)]


def test_estimates_find_the_smallest_k_per_configuration_cheapest_first():
    # float32: K=1 peaks 100 + 16 x 20 = 420; the linear guess (micro-batches of at most
    # 10) jumps to K=2 (8 a micro-batch, 260). mixed_float16 is dearer on a CPU and only
    # K=1 could beat K=2: 100 + 16 x 10 = 260 fits.
    p = planner(holds=set())
    finalists = p.estimate(CONFIGS)
    assert [(c.precision, c.micro_batches) for c in finalists] == [
        ("float32", 2),
        ("mixed_float16", 1),
    ]
    estimated = [(c.precision, c.micro_batches) for c in p.candidates]
    assert estimated == [("float32", 1), ("float32", 2), ("mixed_float16", 1)]
    assert p.resident == {("float32", None): RESIDENT, ("mixed_float16", None): RESIDENT}


def test_a_failed_confirmation_gives_way_to_more_k_when_it_is_expected_faster():
    # Two finalists: both measured; float32 K=2 (0.2 s) goes first and does not hold. K=4 of
    # float32 is expected 0.2 x 1.3 / 1.15 = 0.226 s, before mixed_float16's 0.3 s.
    seen = []
    p = planner(holds={("float32", 4)}, seen=seen.append)
    chosen, how = p.run(CONFIGS, confirm_steps=20)
    assert p.trials.measured == [("float32", 2), ("mixed_float16", 1)]
    assert p.trials.confirmed == [("float32", 2), ("float32", 4)]
    assert (chosen.precision, chosen.micro_batches) == ("float32", 4)
    assert how.startswith("confirmed: trained 20 steps") and "K=2 float32 did not hold" in how
    assert len(seen) == 3 + 2 + 2  # estimated, measured, confirmed


def test_without_confirmation_the_fastest_measured_is_chosen():
    p = planner(holds=set())
    chosen, how = p.run(CONFIGS, confirm_steps=0)
    assert (chosen.precision, chosen.micro_batches, how) == ("float32", 2, "")
    assert p.trials.confirmed == []


def test_nothing_holds_says_what_was_tried():
    p = planner(holds=set())
    chosen, how = p.run(CONFIGS, confirm_steps=20)
    assert chosen is None
    assert how.startswith("no configuration trained 20 steps of memfit.fit without a recovery")
    assert len(p.trials.confirmed) == 4  # MAX_CONFIRMATIONS


def test_expected_seconds_measured_scaled_or_unknown():
    p = planner(holds=set())
    two, four = p.candidate("float32", None, 2), p.candidate("float32", None, 4)
    assert p.expected_seconds(four) == math.inf
    two.step_seconds = 0.2
    assert p.expected_seconds(two) == 0.2
    assert p.expected_seconds(four, basis=two) == pytest.approx(0.2 * 1.3 / 1.15)
