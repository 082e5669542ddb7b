"""What the children of test_tf_keras_watch.py share: a tiny tf_keras model and 64 samples.

Imported first by those children: memfit applies MEMFIT_MEMORY before TensorFlow is imported.
"""

import memfit  # noqa: F401 - first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np
import tf_keras

tf_keras.utils.set_random_seed(1)
inputs = tf_keras.Input((16, 16, 3))
h = tf_keras.layers.Conv2D(8, 3, activation="relu")(inputs)
h = tf_keras.layers.GlobalAveragePooling2D()(h)
model = tf_keras.Model(inputs, tf_keras.layers.Dense(4)(h))
rng = np.random.default_rng(0)
x = rng.random((64, 16, 16, 3), dtype=np.float32)
y = rng.integers(0, 4, (64,))
