"""Child of test_tf_keras_step.py: steps that return no loss or make no update, each one error line.
"""

from child import emit

from tf_keras_model import build, x, y  # first: memfit, then TensorFlow
import tensorflow as tf

import memfit

model = build("adam")
out = {}
def no_loss(data, optimizer):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(data[0], training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # noqa: B905
    return {"total": loss}
def no_update(data, optimizer):
    return {"loss": tf.reduce_mean(model(data[0], training=True))}
cases = {"no_loss": dict(optimizer=model.optimizer, step_fn=no_loss),
         "no_update": dict(optimizer=model.optimizer, step_fn=no_update),
         "both": dict(optimizer=model.optimizer, step_fn=no_loss, loss_fn=no_loss)}
for name, kwargs in cases.items():
    try:
        memfit.GuardedStep(model, **kwargs)((tf.constant(x[:4]), tf.constant(y[:4])))
        out[name] = "no error"
    except memfit.MemfitError as exc:
        out[name] = str(exc)
try:
    memfit.GuardedStep.from_task(object(), model, model.optimizer)
except memfit.MemfitError as exc:
    out["task"] = str(exc)
try:
    memfit.GuardedStep("model.keras")
except memfit.MemfitError as exc:
    out["model"] = str(exc)
emit(out)
