"""memfit.estimate: predicted peak of a training step without running it, and its breakdown."""

from __future__ import annotations

import os

import pytest
from helpers import run_cli, run_isolated

TESTS = os.path.dirname(__file__)

CHECKS = """
import memfit, keras
from memfit.backend import tf as tfb
tf = tfb.import_tf()

def est(*args, **kwargs):
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    e = memfit.estimate(*args, **kwargs)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return e, peak - before

model = memfit.load_model("factories:small_cnn")
e8, used8 = est(model, 8)
e16, _ = est(model, 16)
sgd, _ = est(model, 8, optimizer=keras.optimizers.SGD(momentum=0.9))
mixed, _ = est("factories:small_cnn", 8, precision="mixed_float16")
weights = sum(int(v.numpy().nbytes) for v in model.trainable_variables)
measured = memfit.measure(model, 8, repeats=2)
emit({
    "e8": e8.to_dict(), "e16": e16.to_dict(), "sgd": sgd.to_dict(), "mixed": mixed.to_dict(),
    "used_during_estimate": used8, "weights": weights, "measured": measured.peak_bytes,
    "str": str(e8),
})
"""


@pytest.fixture(scope="module")
def results():
    return run_isolated(CHECKS, env={"MEMFIT_MEMORY": "2GiB", "PYTHONPATH": TESTS})


def test_breakdown_sums_to_the_peak(results):
    for key in ("e8", "e16", "sgd", "mixed"):
        est = results[key]
        assert sum(est["breakdown"].values()) == est["peak_bytes"]
        assert sum(row["bytes"] for row in est["per_layer"]) == est["peak_bytes"]
    moment = results["e8"]["peak_moment"]
    assert moment["phase"] in ("forward", "backward", "update")
    assert moment["op"]
    assert "predicted peak" in results["str"]


def test_doubling_the_batch_doubles_activations_not_weights(results):
    b8, b16 = results["e8"]["breakdown"], results["e16"]["breakdown"]
    assert 1.7 <= b16["activations_bytes"] / b8["activations_bytes"] <= 2.3
    assert b16["weights_bytes"] == b8["weights_bytes"]
    assert b16["optimizer_slots_bytes"] == b8["optimizer_slots_bytes"]
    assert results["e16"]["peak_bytes"] > results["e8"]["peak_bytes"]


def test_mixed_precision_shrinks_activations(results):
    assert (
        results["mixed"]["breakdown"]["activations_bytes"]
        < 0.75 * results["e8"]["breakdown"]["activations_bytes"]
    )


def test_adam_keeps_one_more_copy_of_the_weights_than_momentum_sgd(results):
    adam = results["e8"]["breakdown"]["optimizer_slots_bytes"]
    sgd = results["sgd"]["breakdown"]["optimizer_slots_bytes"]
    weights = results["weights"]
    # Adam: m and v per weight; SGD with momentum: one velocity. BFC granules add < 256 B each.
    assert adam - sgd == pytest.approx(weights, rel=0.02)
    assert sgd == pytest.approx(weights, rel=0.02)


def test_estimate_allocates_none_of_the_steps_tensors(results):
    assert results["used_during_estimate"] < 0.1 * results["e8"]["peak_bytes"]


def test_estimate_is_close_to_the_measured_peak(results):
    predicted, measured = results["e8"]["peak_bytes"], results["measured"]
    assert abs(predicted - measured) / measured < 0.25


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["factories:small_cnn", "--batch-size", "0"], "batch size must be at least 1"),
        (["factories:small_cnn", "-b", "4", "--precision", "float8"], "unknown precision"),
        (["factories:small_cnn", "-b", "4", "--remat", "sometimes"], "unknown remat"),
    ],
)
def test_bad_input_is_one_clear_line(args, message):
    proc = run_cli("estimate", *args, "--no-what-ifs", env={"PYTHONPATH": TESTS})
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("memfit: error:")]
    assert lines and message in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_undefined_input_shape_needs_input_shape(tmp_path):
    factory = tmp_path / "open_shape.py"
    factory.write_text(
        "import keras\n"
        "def model():\n"
        "    inputs = keras.Input((None, None, 3))\n"
        "    h = keras.layers.Conv2D(4, 3)(inputs)\n"
        "    h = keras.layers.GlobalAveragePooling2D()(h)\n"
        "    return keras.Model(inputs, keras.layers.Dense(2)(h))\n"
    )
    proc = run_cli(
        "estimate",
        "open_shape:model",
        "-b",
        "2",
        "--no-what-ifs",
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--input-shape" in proc.stderr
    assert "Traceback" not in proc.stderr
