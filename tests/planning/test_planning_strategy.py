"""The planner's decisions (`memfit.planning.strategy`): pure arithmetic, no TensorFlow.

Each case works its numbers out by hand in the comments; peaks are plain bytes (the functions
do not care about units).
"""

import ast
import inspect
import math
from dataclasses import dataclass

import pytest

from memfit.budget.fitting import limit_bytes
from memfit.planning import strategy
from memfit.planning.strategy import (
    first_k_index,
    k_values,
    near_limit,
    queue_position,
    scaled_seconds,
    skipped_note,
    smallest_fitting_k,
    step_cost,
)


def test_the_strategy_imports_nothing_but_the_standard_library():
    tree = ast.parse(inspect.getsource(strategy))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert imported == {"__future__", "math", "collections.abc", "typing"}


@pytest.mark.parametrize(
    ("batch_size", "ks"),
    [
        (1, [1]),
        (2, [1, 2]),
        (3, [1, 2, 3]),
        (12, [1, 2, 4, 8, 12]),  # 8 micro-batches of 2 (the last 0 short) before 12 of 1
        (16, [1, 2, 4, 8, 16]),
    ],
)
def test_k_values_double_then_end_at_one_sample(batch_size, ks):
    assert k_values(batch_size) == ks


def test_the_limit_is_the_budget_less_the_margin_rounded_down():
    assert limit_bytes(1000, 0.05) == 950
    assert limit_bytes(999, 0.1) == 899  # 899.1
    assert limit_bytes(1000, 0.0) == 1000


def test_step_cost_by_device_precision_recompute_and_k():
    assert step_cost("CPU", "float32", None, 1) == 1.0
    # 1.6 (mixed_float16 on a CPU) x 1.25 (memfit's recompute) x (1 + 0.15 x log2 4 = 1.3).
    assert step_cost("CPU", "mixed_float16", "memfit", 4) == pytest.approx(2.6)
    # On a GPU reduced precision is the cheaper one.
    assert step_cost("GPU", "mixed_float16", None, 1) == pytest.approx(0.6)
    assert step_cost("GPU", "mixed_float16", None, 1) < step_cost("GPU", "float32", None, 1)
    # Unknown names cost what float32 without recompute costs.
    assert step_cost("CPU", "float64", "something", 1) == 1.0


def test_a_larger_k_is_expected_slower_by_its_cost():
    # 0.191 s at K=2 (cost 1.15) -> K=4 (cost 1.3): 0.191 x 1.3 / 1.15 = 0.2159 s.
    basis, bigger = step_cost("CPU", "float32", None, 2), step_cost("CPU", "float32", None, 4)
    assert scaled_seconds(0.191, basis, bigger) == pytest.approx(0.215913, abs=1e-6)
    assert scaled_seconds(0.5, 2.0, 2.0) == 0.5


def test_the_first_k_guess_is_linear_in_the_micro_batch():
    # Batch 64, 100 bytes resident, K=1 predicted at 100 + 64 x 10 = 740: 10 bytes a sample.
    # Under 300: ceil(64 / K) x 10 <= 200 needs micro-batches of at most 20: K=4 (16 each),
    # not K=2 (32 each). Index 2 of [1, 2, 4, 8, 16, 32, 64].
    ks = k_values(64)
    assert first_k_index(ks, 64, 740, 100, 300) == 2
    # Under 1000 the whole batch fits: index 0.
    assert first_k_index(ks, 64, 740, 100, 1000) == 0
    # Under 100 not even one sample (110) fits: the last index, one sample per micro-batch.
    assert first_k_index(ks, 64, 740, 100, 100) == len(ks) - 1
    # Only the K below a bound (the caller cuts the list): [1, 2] -> the last, 1.
    assert first_k_index([1, 2], 64, 740, 100, 300) == 1


def test_near_the_limit_is_within_eight_percent_over_it():
    assert near_limit(100, 100)
    assert near_limit(108, 100)  # 8% over
    assert not near_limit(109, 100)
    assert not near_limit(None, 100)  # never estimated


def test_a_candidate_queues_before_the_first_slower_one():
    assert queue_position([1.0, 2.0, 3.0], 2.5) == 2
    assert queue_position([1.0, 2.0, 3.0], 2.0) == 2  # after an equal one
    assert queue_position([1.0, 2.0, 3.0], 0.5) == 0
    assert queue_position([1.0, math.inf], 2.0) == 1  # before one never measured
    assert queue_position([], 2.0) == 0


@dataclass
class Tried:
    k: int
    fits: bool


def walk(fits_from: int | None, ks, hint, up_only=False):
    """smallest_fitting_k over K that fit from `fits_from` up; the K measured, in order."""
    measured = []

    def measure_k(k):
        measured.append(k)
        return Tried(k, fits_from is not None and k >= fits_from)

    found = smallest_fitting_k(measure_k, ks, hint, up_only=up_only)
    return (found.k if found else None), measured


def test_the_walk_goes_down_while_it_fits():
    # K >= 4 fits; from 16: 16, 8, 4 fit, 2 does not -> 4.
    assert walk(4, [1, 2, 4, 8, 16], 16) == (4, [16, 8, 4, 2])


def test_the_walk_goes_up_until_it_fits():
    assert walk(4, [1, 2, 4, 8, 16], 1) == (4, [1, 2, 4])


def test_the_walk_up_only_stops_at_the_first_that_fits():
    # A finalist's K fits: the smaller K is not tried (it was predicted not to fit).
    assert walk(4, [1, 2, 4, 8, 16], 8, up_only=True) == (8, [8])
    assert walk(4, [1, 2, 4, 8, 16], 2, up_only=True) == (4, [2, 4])


def test_the_walk_starts_at_the_nearest_k_and_can_find_none():
    assert walk(1, [1, 2, 4, 8, 16], 5)[1][0] == 4  # |4 - 5| = 1 < |8 - 5| = 3
    assert walk(1, [1, 2, 4, 8, 16], 6)[1][0] == 4  # a tie goes to the smaller
    assert walk(None, [1, 2, 4, 8, 16], 4) == (None, [4, 8, 16])


def test_the_skipped_note_names_what_was_not_estimated():
    assert skipped_note([], "CPU") == ""
    assert skipped_note([("float32", "memfit")], "CPU") == (
        "Not estimated: 1 configuration (remat memfit): more time per step on this CPU, "
        "and none can need fewer micro-batches than the one found"
    )
    three = [("mixed_float16", None), ("mixed_bfloat16", "memfit"), ("float32", "activations")]
    assert skipped_note(three, "GPU").startswith(
        "Not estimated: 3 configurations (mixed_bfloat16, mixed_float16 and remat "
        "activations, memfit): more time per step on this GPU"
    )
