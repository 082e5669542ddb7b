"""memfit.fit and GuardedStep: micro-batching, equivalence, real OOM recovery, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"
# Most children (children/*.py) train factories.detector_cnn (convolutions, global pooling, a
# box head) on factories.box_shards / box_dataset (two shards, the later at twice the
# resolution).


def _max_rel(a: list, b: list) -> float:
    """Relative difference of two weight lists: ||a - b|| / ||b|| over all weights."""
    x = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in a])
    y = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in b])
    return float(np.linalg.norm(x - y) / (np.linalg.norm(y) + 1e-30))


def test_k4_equals_k1_at_the_same_effective_batch() -> None:
    result = run_isolated(CHILDREN / "k4_equals_k1.py")
    k1, k4 = result["runs"]["1"], result["runs"]["4"]
    assert k1["it"] == k4["it"] == 8  # one update per effective batch
    assert _max_rel(k4["w"], k1["w"]) < 1e-5
    assert _max_rel(k1["w"], result["plain"]) == 0.0  # K=1 is Keras' own step
    assert np.allclose(k4["loss"], result["plain_loss"], rtol=1e-5)
    assert k4["summary"]["micro_batches"] == {"16x16x16x3|16x4": 4}


@pytest.mark.slow
def test_seed_scenario_plain_fit_dies_memfit_fit_recovers() -> None:
    budget = {"MEMFIT_MEMORY": "128MiB"}
    code = CHILDREN / "seed_scenario.py"
    tight = run_isolated(code, env=budget, args={"mode": "plain"})
    roomy = run_isolated(code, env={"MEMFIT_MEMORY": "4GiB"}, args={"mode": "roomy"})
    assert tight["plain"] == "ResourceExhaustedError"
    assert tight["epochs"] == 2
    assert tight["iterations"] == roomy["iterations"] == 8
    recoveries = tight["summary"]["recoveries"]
    assert recoveries and recoveries[0]["phase"] == "gradients"
    assert recoveries[0]["input_shapes"][0][1:] == [128, 128, 3]
    assert tight["summary"]["micro_batches"]["16x64x64x3|16x4"] == 1
    assert tight["summary"]["micro_batches"]["16x128x128x3|16x4"] > 1
    assert roomy["summary"]["recoveries"] == []
    assert _max_rel(tight["weights"], roomy["weights"]) < 1e-5


@pytest.mark.slow
def test_oom_inside_the_optimizer_update_leaves_state_as_a_clean_step() -> None:
    result = run_isolated(
        CHILDREN / "oom_in_update.py",
        env={"MEMFIT_MEMORY": "512MiB"},
    )
    clean, injected = result["clean"], result["injected"]
    recoveries = injected["summary"]["recoveries"]
    assert [r["phase"] for r in recoveries] == ["apply"]
    assert recoveries[0]["update"] == 1
    assert injected["weights"] == clean["weights"]  # bit for bit
    assert injected["slots"] == clean["slots"]
    assert injected["loss"] == clean["loss"]


def test_batchnorm_statistics_and_dropout_seeds_move_once_per_micro_batch_after_an_oom() -> None:
    """An OOM after the forward pass (the backward's, or the update's) has moved BatchNorm's
    moving statistics and the dropout seeds; the retry starts from where they were, so a
    recovered run ends as a run that trained at the final K from the start."""
    result = run_isolated(
        CHILDREN / "batchnorm_retry.py",
        env={"MEMFIT_MEMORY": "512MiB"},
    )
    clean, recovered = result["clean"], result["recovered"]
    recoveries = recovered["summary"]["recoveries"]
    assert [(r["phase"], r["new_micro_batches"]) for r in recoveries] == [("gradients", 2)]
    paths = [path for path, _ in clean["vars"]]
    assert sum(p.endswith(("moving_mean", "moving_variance")) for p in paths) == 2, paths
    assert any("seed_generator" in p for p in paths), paths
    for (path, value), (_, got) in zip(clean["vars"], recovered["vars"], strict=True):
        if not path.endswith("armed"):  # the same model built twice: its variables in order
            assert np.allclose(got, value, rtol=1e-6, atol=1e-7), path


@pytest.mark.slow
def test_mirrored_strategy_two_cpus_recovers_and_replicas_agree() -> None:
    result = run_isolated(
        CHILDREN / "mirrored.py",
        env={"MEMFIT_MEMORY": "160MiB"},
    )
    assert result["replicas"] == 2
    assert result["it"] == 1
    assert result["summary"]["recoveries"], "the per-replica step of 16 should not fit at K=1"
    assert result["agree"]


@pytest.mark.slow
def test_loss_scale_optimizer_skips_the_whole_update_on_a_non_finite_micro_batch() -> None:
    result = run_isolated(CHILDREN / "loss_scale.py")
    assert result["memfit"]["lso"] == "LossScaleOptimizer"
    assert result["keras"]["changed"] is False
    assert result["memfit"] == result["keras"]


def test_bad_input_is_one_clear_memfit_error() -> None:
    result = run_isolated(CHILDREN / "bad_input.py")
    for bad in ("zero", "text", "float"):
        assert "batch size must be a whole number of at least 1" in result[bad]
    assert "never compiled" in result["uncompiled"]
    assert "already batched by 8" in result["batched"]
    assert "expected a Keras model (keras.Model or tf_keras.Model)" in result["not_a_model"]
    assert "repeats for ever" in result["endless"] and "steps_per_epoch=N" in result["endless"]
    assert result["with_steps"] == 1  # with steps_per_epoch it trains, and the epoch ends


@pytest.mark.slow
def test_one_sample_per_micro_batch_still_too_big_is_a_clear_error() -> None:
    result = run_isolated(
        CHILDREN / "one_sample_too_big.py",
        env={"MEMFIT_MEMORY": "96MiB"},
    )
    assert "even one sample per micro-batch does not fit" in result["error"]
    assert "512x512x3" in result["error"]


def test_guarded_step_in_a_custom_loop_matches_the_tape_loop() -> None:
    result = run_isolated(CHILDREN / "guarded_step.py")
    tape, guarded = result["tape"], result["guarded"]
    assert tape["it"] == guarded["it"] == 4
    assert _max_rel(guarded["w"], tape["w"]) < 1e-5
    assert np.allclose(guarded["losses"], tape["losses"], rtol=1e-5)


def test_a_plan_for_another_precision_or_remat_is_refused_and_build_scope_obeys_it() -> None:
    result = run_isolated(
        CHILDREN / "plan_refused.py",
    )
    error = result["mixed_plan_float32_model"]["error"]
    assert "plan is for precision mixed_float16" in error and "built with float32" in error
    assert 'set_dtype_policy("mixed_float16")' in error and "float32" in error
    assert "\n" not in error
    error = result["remat_plan_plain_model"]["error"]
    assert "remat) 'larger_than'" in error and "without it" in error
    assert 'RematScope(mode="larger_than")' in error and "remat_modes=[None]" in error
    assert "built with mixed_bfloat16" in result["float32_plan_mixed_model"]["error"]
    # Built in the plan's scope, the model trains at the plan's K; the global policy is back.
    assert result["built_for_mixed_float16_None"] == {"micro_batches": [2]}
    assert result["built_for_float32_larger_than"] == {"micro_batches": [2]}
    assert result["policy_after_mixed_float16"] == "float32"
    assert result["deprecated"]["micro_batches"] == [2]
    assert any("pass the plan as plan=plan" in m for m in result["deprecated"]["warned"])
