"""What the children of test_watch_oom.py share: the net, batches of given sizes, and `run`,
which trains a fresh net on them watched (plain `fit` or `memfit.fit`) and keeps the outcome.

Imported first by those children: memfit applies MEMFIT_MEMORY before TensorFlow is imported.
"""

import gc

import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np
import tensorflow as tf
import keras


def net():
    keras.utils.set_random_seed(1)
    inp = keras.Input((None, None, 3))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inp)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    m = keras.Model(inp, keras.layers.Dense(4)(h))
    m.compile(keras.optimizers.Adam(1e-3), "mse")
    return m


rng = np.random.default_rng(0)


def batches(plan):
    # plan: [(batch, side, count), ...] -> a dataset of those batches, in order
    def gen():
        for b, side, count in plan:
            for _ in range(count):
                yield (rng.random((b, side, side, 3), dtype=np.float32),
                       rng.random((b, 4), dtype=np.float32))
    return tf.data.Dataset.from_generator(gen, output_signature=(
        tf.TensorSpec((None, None, None, 3)), tf.TensorSpec((None, 4))))


# Each scenario in turn: a fresh model, a Watch, plain `fit` (or memfit.fit), the outcome.
result = {}


def run(name, data, callbacks=(), guarded=False):
    w = memfit.Watch(verbose=False)
    m = net()
    outcome = "completed"
    try:
        if guarded:
            memfit.fit(m, data, epochs=1, verbose=0, callbacks=[*callbacks, w])
        else:
            m.fit(data, epochs=1, verbose=0, callbacks=[*callbacks, w])
    except tf.errors.ResourceExhaustedError:
        outcome = "oom"
    result[name] = {"outcome": outcome, "findings": [f.to_dict() for f in w.findings]}
    del m, w
    keras.backend.clear_session()
    gc.collect()
