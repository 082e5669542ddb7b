"""Child of test_fit.py::test_oom_inside_the_optimizer_update_leaves_state_as_a_clean_step."""

from child import emit

import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import keras
import numpy as np
from factories import detector_cnn as build


def weights(model):
    return [w.tolist() for w in model.get_weights()]


import tensorflow as tf

class FlakyAdam(keras.optimizers.Adam):
    # On its armed step, after updating the third variable, it allocates far more than the
    # budget: a real allocator OOM in the middle of the update.
    def __init__(self, arm_at=-1, **kw):
        super().__init__(**kw)
        self.arm_at = arm_at
        self.armed = tf.Variable(0.0, trainable=False)

    def update_step(self, gradient, variable, learning_rate):
        super().update_step(gradient, variable, learning_rate)
        if self._get_variable_index(variable) != 2:
            return
        def boom():
            with tf.control_dependencies([self.armed.assign(0.0)]):
                big = tf.random.uniform([512 * 1024 * 1024])
            return tf.minimum(tf.reduce_max(big), 0.0)
        hit = tf.cond(
            tf.logical_and(self.armed > 0, tf.equal(self.iterations, self.arm_at)),
            boom, lambda: 0.0)
        with tf.control_dependencies([hit]):
            variable.assign_add(tf.zeros_like(variable))

rng = np.random.default_rng(5)
x = rng.uniform(size=(48, 32, 32, 3)).astype("float32")
y = rng.uniform(size=(48, 4)).astype("float32")
out = {}
for name, arm in (("clean", -1), ("injected", 1)):
    opt = FlakyAdam(arm_at=arm, learning_rate=1e-3)
    m = build(optimizer=opt)
    opt.armed.assign(1.0)
    h = memfit.fit(m, x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
                   guard_update=True)
    out[name] = {"weights": weights(m), "slots": [v.numpy().tolist() for v in opt.variables],
                 "summary": h.memfit.to_dict(), "loss": h.history["loss"]}
emit(out)
