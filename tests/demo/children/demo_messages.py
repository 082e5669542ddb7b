"""Child of test_demo_messages.py: the demo's plain `model.fit` step fails, and its error is one
clean line.
"""

from child import emit

import memfit  # noqa: F401 - first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np
import tensorflow as tf
import keras
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
