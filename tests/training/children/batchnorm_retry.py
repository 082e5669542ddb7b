"""Child of test_fit.py:
test_batchnorm_statistics_and_dropout_seeds_move_once_per_micro_batch_after_an_oom.
"""

from child import emit

import memfit
import keras
import numpy as np
import tensorflow as tf


class Bomb(keras.layers.Layer):
    # Armed, it allocates far more than the budget once, after BatchNorm's forward ran.
    def __init__(self, **kw):
        super().__init__(**kw)
        self.armed = self.add_weight(shape=(), initializer="zeros", trainable=False)

    def call(self, x, training=False):
        def boom():
            with tf.control_dependencies([self.armed.assign(0.0)]):
                big = tf.random.uniform([512 * 1024 * 1024])
            return tf.minimum(tf.reduce_max(big), 0.0)
        hit = tf.cond(self.armed > 0, boom, lambda: 0.0)
        return x + hit

def build():
    keras.utils.set_random_seed(2)
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(16, 3, padding="same")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.Dropout(0.3)(h)
    h = Bomb(name="bomb")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(4)(h))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return model

rng = np.random.default_rng(5)
x = rng.uniform(size=(48, 32, 32, 3)).astype("float32")
y = rng.uniform(size=(48, 4)).astype("float32")
out = {}
for name, k, arm in (("clean", 2, False), ("recovered", 1, True)):
    m = build()
    if arm:
        m.get_layer("bomb").armed.assign(1.0)
    h = memfit.fit(m, x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
                   micro_batches=k)
    out[name] = {"vars": [[v.path, v.numpy().tolist()] for v in m.variables],
                 "summary": h.memfit.to_dict()}
emit(out)
