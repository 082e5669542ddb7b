"""Child of test_accumulate_detectors.py:
test_a_classifier_s_micro_batches_give_the_full_batch_gradient.
"""

from child import emit

import keras
import numpy as np
from memfit.workload.accumulate import AccumulatingStep


def difference(model, data):
    step = AccumulatingStep(model)
    full, split = step.gradients(data, 1), step.gradients(data, 2)
    a = np.concatenate([g.numpy().ravel() for g in full])
    b = np.concatenate([g.numpy().ravel() for g in split])
    return float(np.linalg.norm(b - a) / np.linalg.norm(a))


import tensorflow as tf
keras.utils.set_random_seed(0)
inputs = keras.Input((32, 32, 3))
h = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
h = keras.layers.GlobalAveragePooling2D()(h)
model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(h))
model.compile("adam", "sparse_categorical_crossentropy")
rng = np.random.default_rng(0)
x = tf.constant(rng.uniform(0, 1, (4, 32, 32, 3)), tf.float32)
emit(difference(model, (x, tf.constant(rng.integers(0, 10, 4)))))
