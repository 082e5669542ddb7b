"""Child of test_tf_keras_step.py: a user's step_fn with a LossScaleOptimizer under mixed_float16.
"""

from child import emit

from tf_keras_model import build, x, y  # first: memfit, then TensorFlow
import tensorflow as tf
import tf_keras

import memfit

from memfit.backend.tf_keras_compat import optimizer_variables
tf_keras.mixed_precision.set_global_policy("mixed_float16")
model = build("adam")
optimizer = tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.legacy.Adam(1e-3))
mse = tf_keras.losses.MeanSquaredError()

def step_fn(data, optimizer):  # a user's own step, as written for tf_keras
    a, b = data
    with tf.GradientTape() as tape:
        loss = mse(b, tf.cast(model(a, training=True), tf.float32))
        scaled = optimizer.get_scaled_loss(loss)
    grads = optimizer.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # noqa: B905
    return {"loss": loss}

step = memfit.GuardedStep(model, micro_batches=2, optimizer=optimizer, step_fn=step_fn,
                          guard_update=True)
losses = [float(step((tf.constant(x[:16]), tf.constant(y[:16])))["loss"]) for _ in range(3)]
names = [v.name for v in optimizer_variables(optimizer)]
emit({"losses": losses, "iterations": int(optimizer.iterations), "names": names,
      "guarded": step.summary.guarded_updates})
