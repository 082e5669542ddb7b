"""Largest batch search on real Keras models under emulated budgets (child processes)."""

import json

import pytest
from helpers import run_cli, run_isolated


@pytest.mark.slow
def test_search_brackets_the_limit_and_leaves_the_model_untouched():
    out = run_isolated(
        """
        import numpy as np, memfit, keras
        from memfit.backend import tf as tfb
        model = keras.applications.MobileNetV2(weights=None, input_shape=(64, 64, 3), classes=10)
        model.compile("adam", "sparse_categorical_crossentropy")
        model.optimizer.build(model.trainable_variables)
        before = [np.array(v.numpy()) for v in model.variables + model.optimizer.variables]
        baseline = tfb.memory_info("CPU:0")["current"]
        result = memfit.find_batch_size(model, margin=0.0, max_batch=96)
        after = [np.array(v.numpy()) for v in model.variables + model.optimizer.variables]
        emit({"result": result.to_dict(),
              "same": all(np.array_equal(a, b) for a, b in zip(before, after)),
              "iterations": int(model.optimizer.iterations.numpy()),
              "baseline": baseline, "after": tfb.memory_info("CPU:0")["current"]})
        """,
        env={"MEMFIT_MEMORY": "256MiB"},
    )
    result = out["result"]
    size, failing = result["batch_size"], result["failing_batch_size"]
    assert 8 < size < 96
    # Bracketed: the next size up failed for real (OOM or over the budget) in the search.
    assert failing == size + 1
    failed = next(t for t in result["trials"] if t["batch_size"] == failing)
    assert failed["fits"] is False and (failed["oom"] or failed["peak_bytes"] > 256 * 2**20)
    found = next(t for t in result["trials"] if t["batch_size"] == size)
    assert found["fits"] and found["peak_bytes"] <= 256 * 2**20 == result["limit_bytes"]
    # Far fewer trials than doubling + bisection from 2 would need, one step each.
    assert len(result["trials"]) <= 12
    # Never trained; memory back to where it was (up to BFC chunk rounding).
    assert out["same"] and out["iterations"] == 0
    assert abs(out["after"] - out["baseline"]) < 0.25 * out["baseline"]

    # The size found runs in a fresh process under the same budget.
    check = run_isolated(
        f"""
        import memfit, keras
        model = keras.applications.MobileNetV2(weights=None, input_shape=(64, 64, 3), classes=10)
        model.compile("adam", "sparse_categorical_crossentropy")
        emit(memfit.measure(model, {size}, repeats=1).oom)
        """,
        env={"MEMFIT_MEMORY": "256MiB"},
    )
    assert check is False


def test_batch_one_that_does_not_fit_is_a_clear_result():
    out = run_isolated(
        """
        import memfit, keras
        model = keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), classes=10)
        model.compile("adam", "sparse_categorical_crossentropy")
        r = memfit.find_batch_size(model)
        emit({"size": r.batch_size, "fits": r.fits, "stopped_by": r.stopped_by,
              "summary": r.summary(), "trials": len(r.trials)})
        """,
        env={"MEMFIT_MEMORY": "48MiB"},
    )
    assert out["size"] == 0 and out["fits"] is False
    assert out["stopped_by"] == "nothing_fits" and out["trials"] == 1
    assert "even batch size 1 does not fit" in out["summary"]
    assert "48.00 MiB" in out["summary"] and "memfit plan" in out["summary"]


def test_a_dataset_with_one_huge_image_is_searched_with_it():
    out = run_isolated(
        """
        import numpy as np, memfit, keras, tensorflow as tf
        inputs = keras.Input((None, None, 3))
        x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
        x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        outputs = keras.layers.Dense(4, activation="softmax")(x)
        model = keras.Model(inputs, outputs)
        model.compile("adam", "sparse_categorical_crossentropy")
        images = [np.zeros((32, 32, 3), "float32")] * 30
        images[17] = np.zeros((256, 256, 3), "float32")       # one huge image, deep inside
        ds = tf.data.Dataset.from_generator(
            lambda: ((img, np.int32(1)) for img in images),
            output_signature=(tf.TensorSpec((None, None, 3), tf.float32),
                              tf.TensorSpec((), tf.int32)))
        r = memfit.find_batch_size(model, data=ds, margin=0.0)
        first = memfit.measure(model, 1, data=ds, repeats=1)          # the first sample
        emit({"result": r.to_dict(), "first_peak": first.peak_bytes})
        """,
        env={"MEMFIT_MEMORY": "160MiB"},
    )
    result = out["result"]
    assert result["worst_case_samples"] is True
    assert result["largest_sample"]["index"] == 17
    assert result["largest_sample"]["input_shapes"] == [[256, 256, 3]]
    batch_one = result["trials"][0]
    assert batch_one["batch_size"] == 1 and batch_one["peak_bytes"] > 4 * out["first_peak"] / 2
    # Capped by the dataset's 30 samples; the huge image makes 30 too many.
    assert 1 <= result["batch_size"] < 30


@pytest.mark.slow
def test_cli_batch_json_and_errors():
    proc = run_cli(
        "batch",
        "keras.applications.MobileNetV2",
        "--input-shape",
        "32,32,3",
        "--memory",
        "160MiB",
        "--max-batch",
        "24",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert 1 <= data["batch_size"] <= 24
    assert data["budget"]["usable_bytes"] == 160 * 2**20
    assert data["trials"][0]["batch_size"] == 1

    for args, fragment in (
        (["--margin", "1.5"], "not a share of the budget"),
        (["--max-batch", "0"], "not a batch size"),
        (["--memory", "24MiB"], "weights and optimizer state alone"),
    ):
        proc = run_cli("batch", "keras.applications.MobileNetV2", "--input-shape", "32,32,3", *args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert lines[-1].startswith("memfit: error:") and fragment in lines[-1], proc.stderr
        assert "Traceback" not in proc.stderr
