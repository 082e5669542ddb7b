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
        """
        import numpy as np, memfit, keras
        inputs = keras.Input((32, 32, 3))
        x = keras.layers.Conv2D(8, 3)(inputs)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.Dropout(0.5)(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        outputs = keras.layers.Dense(10, activation="softmax")(x)
        model = keras.Model(inputs, outputs)
        model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
        state = lambda: [np.array(v.numpy()) for v in model.variables]
        before = state()
        r = memfit.measure(model, 8, repeats=2)
        after = state()
        # Reading a weight after the restore must not copy it: a sparse restore
        # (scatter_update) would leave every variable copy-on-read for good.
        from memfit.backend import tf as tfb
        big = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2048),
                                keras.layers.Dense(2048)])
        big.compile("sgd", "mse")
        memfit.measure(big, 2, repeats=1)
        kernel = big.layers[1].kernel.value
        held = tfb.memory_info("CPU:0")["current"]
        tfb.reset_peak("CPU:0")
        read = kernel.read_value()
        copied = tfb.memory_info("CPU:0")["peak"] - held
        emit({"same": all(np.array_equal(a, b) for a, b in zip(before, after)),
              "n": len(before), "oom": r.oom, "peak": r.peak_bytes, "copied": copied,
              "kernel_bytes": int(read.shape[0] * read.shape[1] * 4)})
        """,
        env={"MEMFIT_MEMORY": "256MiB"},
    )
    assert out["same"] and out["n"] > 6
    assert out["oom"] is False and out["peak"] > 0
    assert out["kernel_bytes"] == 16 * 2**20 and out["copied"] < 2**20


def test_measure_from_a_dataset_of_samples():
    out = run_isolated(
        """
        import memfit, keras, tensorflow as tf
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
        model.compile("adam", "mse")
        ds = tf.data.Dataset.from_tensor_slices((tf.ones((5, 16)), tf.zeros((5, 4))))
        r = memfit.measure(model, 12, data=ds, repeats=1)
        emit({"shapes": r.input_shapes, "oom": r.oom})
        """,
        env={"MEMFIT_MEMORY": "128MiB"},
    )
    assert out == {"shapes": [[16]], "oom": False}


def test_a_trace_that_has_run_is_measured_from_its_first_step():
    # The search's later trials skip the warm-up (`warm_up=False`): the steps run are the
    # measured ones, each counted, and the updates stay when `restore=False`.
    out = run_isolated(
        """
        import memfit, keras, tensorflow as tf
        from memfit.measuring.measurer import measure_workload
        from memfit.workload.workload import Workload
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
        model.compile("adam", "mse")
        work = Workload(model)
        runs = []
        for warm_up in (True, False):
            before = int(model.optimizer.iterations.numpy())
            m = measure_workload(work, 8, repeats=2, device="CPU:0", budget=None, exact=False,
                                 restore=False, warm_up=warm_up)
            runs.append([int(model.optimizer.iterations.numpy()) - before, len(m.peaks_bytes)])
        emit(runs)
        """,
        env={"MEMFIT_MEMORY": "128MiB"},
    )
    assert out == [[3, 2], [2, 2]]


def test_isolated_measurement_of_a_model_object_and_spec():
    out = run_isolated(
        """
        import memfit, keras
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile("adam", "sparse_categorical_crossentropy")
        r1 = memfit.measure(model, 16, isolated=True, budget="128MiB", repeats=1)
        r2 = memfit.measure("keras.applications.MobileNetV2", 64, isolated=True,
                            budget="96MiB", input_shape=(64, 64, 3), repeats=1)
        emit({"r1": r1.to_dict(), "r2": r2.to_dict()})
        """
    )
    assert out["r1"]["oom"] is False
    assert out["r1"]["budget"]["usable_bytes"] == 128 * 2**20
    assert out["r1"]["peak_bytes"] > 0
    assert out["r2"]["oom"] is True
    # Answered when the step stalled in TensorFlow's 10 s allocator retry, not after it.
    assert "the child answered at once" in out["r2"]["oom_message"]


def test_measure_refuses_bad_arguments():
    out = run_isolated(
        """
        import memfit, keras
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        messages = []
        for bad in (0, -3, 2.5, "8"):
            try:
                memfit.measure(model, bad)
            except memfit.MemfitError as exc:
                messages.append(str(exc))
        try:
            memfit.measure("not a model object", 4)
        except memfit.MemfitError as exc:
            messages.append(str(exc))
        emit(messages)
        """,
        env={"MEMFIT_MEMORY": "64MiB"},
    )
    assert len(out) == 5
    assert "at least 1" in out[0] and "whole number" in out[2]
    assert "isolated=True" in out[4]


def test_measure_without_memory_statistics_explains_the_fix():
    out = run_isolated(
        """
        import tensorflow as tf, keras, memfit
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("adam", "mse")
        try:
            memfit.measure(model, 2)
            emit(None)
        except memfit.MeasurementError as exc:
            emit(str(exc))
        """
    )
    assert out is not None and "isolated=True" in out and "memfit.emulate" in out


def test_a_batch_whose_inputs_alone_do_not_fit_is_an_oom():
    out = run_isolated(
        """
        import memfit, keras
        model = keras.Sequential([keras.Input((1024, 1024)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        r = memfit.measure(model, 64, repeats=1)      # inputs alone: 256 MiB
        ok = memfit.measure(model, 1, repeats=1)      # and the process goes on
        emit({"oom": r.oom, "message": r.oom_message, "leak": r.leaked_bytes, "ok": ok.oom})
        """,
        env={"MEMFIT_MEMORY": "64MiB"},
    )
    assert out["oom"] is True and out["message"].startswith("the batch itself")
    assert out["ok"] is False and abs(out["leak"]) < 2**20
