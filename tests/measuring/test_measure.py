"""One-step measurement on real Keras models under an emulated budget (child processes)."""

from pathlib import Path

import pytest
from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"

MOBILENET_CODE = CHILDREN / "mobilenet_steps.py"


@pytest.mark.slow
def test_mobilenetv2_peaks_oom_and_restoration():
    # One inter-op thread: ops run in one order, so the BFC peak of a step is repeatable
    # (with the default pool, batch 1 once peaked above batch 2: 118.3 vs 116.5 MB at 96x96).
    out = run_isolated(
        MOBILENET_CODE, env={"MEMFIT_MEMORY": "384MiB", "TF_NUM_INTEROP_THREADS": "1"}
    )
    fits = out["results"][:3]
    over = out["results"][3]

    # Peaks strictly increase with the batch.
    peaks = [r["peak_bytes"] for r in fits]
    assert all(not r["oom"] for r in fits)
    assert peaks[0] < peaks[1] < peaks[2]
    # Resident bytes hold the weights and Adam's two slots per trainable weight, all of them on
    # the device's allocator. (Before restores copied on the device, resident read 26.77 MB of
    # the 28.36 MB these add up to: restored variables had adopted host buffers; see
    # `memfit.backend.tf.assign_exact`.)
    for r in fits:
        assert r["resident_bytes"] >= out["weight_bytes"] + 2 * out["param_bytes"]
        assert r["step_seconds"] > 0
        assert len(r["peaks_bytes"]) == 3
        assert r["peak_bytes"] <= 384 * 2**20
    # A batch over the budget: a real ResourceExhaustedError, reported as such.
    assert over["oom"] is True
    assert "OOM" in over["oom_message"] or "allocat" in over["oom_message"]
    assert over["peak_bytes"] > peaks[2]
    # Nothing trained: weights, optimizer slots and iteration count as before.
    assert out["weights_same"] and out["opt_same"]
    assert out["iterations"] == 0
    # The device holds what it held before: the batch, activations and gradients are gone.
    # Restored variables get new buffers, and the BFC allocator counts a buffer's whole chunk
    # (up to twice what was asked for a small one), so `current` moves by that rounding: up to
    # +5.9 MB over four runs of this code. A leaked step would move it by its step_bytes,
    # 37 MB and more here.
    smallest_step = min(r["step_bytes"] for r in fits)
    tolerance = 0.5 * smallest_step
    assert abs(out["after"] - out["baseline"]) < tolerance
    for r in out["results"]:
        assert abs(r["leaked_bytes"]) < tolerance
    # Every restored variable is back on the device's allocator: none adopted a host buffer
    # outside it (a plain `assign` of NumPy arrays once left 7.4 MB of them uncounted).
    assert out["after"] >= out["weight_bytes"] + 2 * out["param_bytes"]


def test_measure_restores_rng_batchnorm_and_metrics_state():
    out = run_isolated(
        CHILDREN / "restores_state.py",
        env={"MEMFIT_MEMORY": "256MiB"},
    )
    assert out["same"] and out["n"] > 6
    assert out["oom"] is False and out["peak"] > 0
    assert out["kernel_bytes"] == 16 * 2**20 and out["copied"] < 2**20


def test_measure_from_a_dataset_of_samples():
    out = run_isolated(
        CHILDREN / "dataset_of_samples.py",
        env={"MEMFIT_MEMORY": "128MiB"},
    )
    assert out == {"shapes": [[16]], "oom": False}


def test_a_trace_that_has_run_is_measured_from_its_first_step():
    # The search's later trials skip the warm-up (`warm_up=False`): the steps run are the
    # measured ones, each counted, and the updates stay when `restore=False`.
    out = run_isolated(
        CHILDREN / "no_warm_up.py",
        env={"MEMFIT_MEMORY": "128MiB"},
    )
    assert out == [[3, 2], [2, 2]]


def test_isolated_measurement_of_a_model_object_and_spec():
    out = run_isolated(CHILDREN / "isolated.py")
    assert out["r1"]["oom"] is False
    assert out["r1"]["budget"]["usable_bytes"] == 128 * 2**20
    assert out["r1"]["peak_bytes"] > 0
    assert out["r2"]["oom"] is True
    # Answered when the step stalled in TensorFlow's 10 s allocator retry, not after it.
    assert "the child answered at once" in out["r2"]["oom_message"]


def test_measure_refuses_bad_arguments():
    out = run_isolated(
        CHILDREN / "bad_arguments.py",
        env={"MEMFIT_MEMORY": "64MiB"},
    )
    assert len(out) == 5
    assert "at least 1" in out[0] and "whole number" in out[2]
    assert "isolated=True" in out[4]


def test_measure_without_memory_statistics_explains_the_fix():
    out = run_isolated(CHILDREN / "no_statistics.py")
    assert out is not None and "isolated=True" in out and "memfit.emulate" in out


def test_a_batch_whose_inputs_alone_do_not_fit_is_an_oom():
    out = run_isolated(
        CHILDREN / "batch_too_big.py",
        env={"MEMFIT_MEMORY": "64MiB"},
    )
    assert out["oom"] is True and out["message"].startswith("the batch itself")
    assert out["ok"] is False and abs(out["leak"]) < 2**20
