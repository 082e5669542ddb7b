"""Real OOMs under an emulated budget: Watch names what changed, and its numbers train.

One child process runs the failing scenarios one after the other (a later shard of larger
images, an augmentation that doubles the side, a doubled batch, memory kept by a callback,
and memfit.fit recovering); fresh children then train at the batch and image side the
findings suggest, under the same budget. Another child runs a first step that never fits
(batch 128 under 400 MiB): plain `fit`'s finding names the batch the estimate fits, which
then trains, and `memfit.fit`'s recovery the K it went on with.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_isolated

BUDGET = {"MEMFIT_MEMORY": "200MiB", "TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "2"}

CHILDREN = Path(__file__).resolve().parent / "children"
FIRST_BUDGET = {**BUDGET, "MEMFIT_MEMORY": "400MiB"}


@pytest.fixture(scope="module")
def failures() -> dict:
    return run_isolated(CHILDREN / "failing.py", env=BUDGET, timeout=600)


def _oom(run: dict) -> dict:
    found = [f for f in run["findings"] if f["kind"] == "oom"]
    assert run["outcome"] == "oom" and found, run
    return found[0]


def _trains(batch: int, side: int, env: dict | None = None) -> bool:
    args = {"batch": batch, "side": side}
    try:
        return run_isolated(CHILDREN / "trains.py", env=env or BUDGET, args=args) == "trained"
    except AssertionError as error:
        if "ResourceExhaustedError" in str(error):
            return False
        raise


@pytest.mark.slow
def test_a_later_shard_of_larger_images_is_named_and_its_numbers_train(failures: dict) -> None:
    oom = _oom(failures["shard"])
    evidence = oom["evidence"]
    assert evidence["cause"] == "input_shape"
    assert "16x160x160x3, 6.25x the pixels of the earlier 16x64x64x3 batches" in oom["cause"]
    largest, side = evidence["largest_batch_size"], evidence["fitting_side"]
    assert 1 <= largest < 16 and side[0] < 160
    assert f"about {largest}" in oom["fix"] and f"{side[0]}x{side[1]}" in oom["fix"]
    assert f"micro_batches={evidence['micro_batches']}" in oom["fix"]
    assert _trains(largest, 160), f"the suggested batch {largest} at 160x160 did not train"
    assert _trains(16, side[0]), f"the suggested side {side} at batch 16 did not train"


@pytest.mark.slow
def test_an_augmentation_that_doubles_the_side_is_named(failures: dict) -> None:
    oom = _oom(failures["augmentation"])
    assert oom["evidence"]["cause"] == "input_shape"
    assert "16x160x160x3, 4x the pixels of the earlier 16x80x80x3 batches" in oom["cause"]
    side = oom["evidence"]["fitting_side"]
    assert _trains(16, side[0]), f"the suggested side {side} at batch 16 did not train"


@pytest.mark.slow
def test_a_doubled_batch_is_named_and_the_batch_it_suggests_trains(failures: dict) -> None:
    oom = _oom(failures["batch"])
    assert oom["evidence"]["cause"] == "batch_size"
    assert "the batch size rose from 16 to 64" in oom["cause"]
    largest = oom["evidence"]["largest_batch_size"]
    assert 16 <= largest < 64
    assert _trains(largest, 96), f"the suggested batch {largest} at 96x96 did not train"


@pytest.mark.slow
def test_memory_kept_from_step_to_step_is_named_as_growth(failures: dict) -> None:
    oom = _oom(failures["growth"])
    assert oom["evidence"]["cause"] == "memory_growth"
    assert "memory in use before the step rose" in oom["cause"]
    assert oom["evidence"]["growth_bytes"] > 32 * 2**20
    # Before it: near_budget predicted the step of the OOM from the memory trend.
    near = next(f for f in failures["growth"]["findings"] if f["kind"] == "near_budget")
    assert near["step"] < oom["step"] and "out of memory in about" in near["message"]
    assert abs(near["evidence"]["oom_step"] - oom["step"]) <= 0.2 * oom["step"], (near, oom)


@pytest.mark.slow
def test_memfit_fit_recovery_names_the_shape_and_the_k_to_start_with(failures: dict) -> None:
    run = failures["guarded"]
    assert run["outcome"] == "completed", run
    recovery = next(f for f in run["findings"] if f["kind"] == "oom_recovery")
    assert recovery["evidence"]["cause"] == "input_shape"
    assert "6.25x the pixels" in recovery["cause"]
    assert "nothing is lost" in recovery["fix"] and "micro_batches=" in recovery["fix"]


@pytest.fixture(scope="module")
def first_step() -> dict:
    return run_isolated(CHILDREN / "first_step.py", env=FIRST_BUDGET, timeout=600)


@pytest.mark.slow
def test_a_first_step_oom_names_a_batch_from_the_estimate_that_trains(first_step: dict) -> None:
    oom = _oom(first_step["plain"])
    evidence = oom["evidence"]
    assert evidence["cause"] == "first_step" and "never fitted" in oom["cause"]
    largest = evidence["largest_batch_size"]
    assert largest == evidence["estimated_batch_size"] and 8 <= largest < 128, evidence
    assert f"train at batch_size={largest}" in oom["fix"]
    assert f"micro_batches={evidence['micro_batches']}" in oom["fix"]
    assert evidence["estimated_high_bytes"] <= evidence["budget_bytes"]
    assert _trains(largest, 96, FIRST_BUDGET), f"the estimated batch {largest} did not train"


@pytest.mark.slow
def test_a_first_step_recovery_names_the_k_that_fitted(first_step: dict) -> None:
    run = first_step["guarded"]
    assert run["outcome"] == "completed", run
    recoveries = [f for f in run["findings"] if f["kind"] == "oom_recovery"]
    fitted = recoveries[-1]["evidence"]["new_micro_batches"]
    assert fitted >= 2 and f"micro_batches={fitted}" in recoveries[0]["fix"], recoveries
    assert "which fit" in recoveries[0]["fix"] and "even one sample" not in recoveries[0]["fix"]
