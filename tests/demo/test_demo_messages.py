"""The demo's "plain model.fit" step shows a real error as one clean line."""

from __future__ import annotations

from helpers import run_isolated

CODE = r"""
import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np, tensorflow as tf, keras
from memfit.demo import first_line

out = {}
m = keras.Sequential([keras.Input((None, None, 3)),
                      keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)])
m.compile("adam", "mse")
try:
    m.fit(np.ones((32, 256, 256, 3), "float32"), np.ones((32, 1)), batch_size=32, verbose=0)
except tf.errors.ResourceExhaustedError as exc:
    out["oom"] = [first_line(exc), str(exc)]
try:
    tf.function(lambda x: tf.reshape(x, (3,)), input_signature=[tf.TensorSpec(None)])(tf.zeros(4))
except tf.errors.InvalidArgumentError as exc:
    out["graph"] = [first_line(exc), str(exc)]
class Anchors(keras.layers.Layer):  # keras-hub's anchor generator on a relaxed shape
    def call(self, x):
        raise TypeError("must be real number, not SymbolicTensor")
try:
    Anchors()(np.ones((1, 2)))
except TypeError as exc:
    out["layer"] = [first_line(exc), str(exc)]
emit(out)
"""


def test_plain_fit_errors_are_one_line_without_the_graph_traceback() -> None:
    out = run_isolated(CODE, env={"MEMFIT_MEMORY": "128MiB"})
    line, raw = out["oom"]
    assert "Detected at node" in raw and 'File "' in raw  # what the demo used to cut off
    assert line.startswith("OOM when allocating tensor with shape[32,256,256,64]"), line
    assert "\n" not in line and "Detected at node" not in line and 'File "' not in line
    line, raw = out["graph"]
    assert "\n" not in line and "Detected at node" not in line and 'File "' not in line
    assert "reshape" in line.lower() and len(line) > 20, line
    line, raw = out["layer"]
    assert line == (
        "Exception encountered when calling Anchors.call(): must be real number, "
        "not SymbolicTensor"
    ), line
