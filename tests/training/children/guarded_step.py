"""Child of test_fit.py::test_guarded_step_in_a_custom_loop_matches_the_tape_loop."""

from child import emit

import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import keras
import numpy as np
from factories import detector_cnn as build


def weights(model):
    return [w.tolist() for w in model.get_weights()]


import tensorflow as tf
rng = np.random.default_rng(11)
x = rng.normal(size=(32, 16, 16, 3)).astype("float32")
y = rng.uniform(size=(32, 4)).astype("float32")
mse = keras.losses.MeanSquaredError()
out = {}
for name in ("tape", "guarded"):
    m = build()
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    if name == "guarded":
        step = memfit.GuardedStep(m, micro_batches=4, optimizer=opt,
                                  loss_fn=lambda a, b, m=m: mse(b, m(a, training=True)))
    losses = []
    for i in range(0, 32, 8):
        xb, yb = x[i:i + 8], y[i:i + 8]
        if name == "tape":
            with tf.GradientTape() as tape:
                value = mse(yb, m(xb, training=True))
            opt.apply_gradients(zip(tape.gradient(value, m.trainable_variables),
                                    m.trainable_variables, strict=False))
        else:
            value = step((xb, yb))["loss"]
        losses.append(float(value))
    out[name] = {"w": weights(m), "losses": losses, "it": int(opt.iterations.numpy())}
emit(out)
