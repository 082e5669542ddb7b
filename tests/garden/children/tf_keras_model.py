"""What the children of test_tf_keras_step.py share: a small tf_keras conv net with a legacy or
a new tf_keras optimizer, its weights as lists, and 64 samples (`x`, `y`).

Imported first by those children: memfit applies MEMFIT_MEMORY before TensorFlow starts.
"""

import memfit  # noqa: F401 - first: applies MEMFIT_MEMORY before TensorFlow starts
import numpy as np
import tf_keras

def build(optimizer="legacy_sgd", size=None):
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([
        tf_keras.layers.Conv2D(16, 3, padding="same", activation="relu",
                               input_shape=(size, size, 3)),
        tf_keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        tf_keras.layers.GlobalAveragePooling2D(),
        tf_keras.layers.Dense(4),
    ])
    optimizers = {
        "legacy_sgd": lambda: tf_keras.optimizers.legacy.SGD(0.05, momentum=0.9),
        "adam": lambda: tf_keras.optimizers.Adam(1e-3),
    }
    model.compile(optimizer=optimizers[optimizer](), loss="mse")
    return model

def weights(model):
    return [w.tolist() for w in model.get_weights()]

rng = np.random.default_rng(3)
x = rng.normal(size=(64, 32, 32, 3)).astype("float32")
y = rng.uniform(size=(64, 4)).astype("float32")
