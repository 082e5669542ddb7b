"""Child of test_garden_task.py: a tf_keras model's own GradientTape step, given as `step_fn`,
measured and estimated in this process under an emulated 1 GiB card.
"""

from child import emit

import memfit
memfit.emulate("1GiB")
import tensorflow as tf
import tf_keras
model = tf_keras.Sequential([tf_keras.Input((32, 32, 3)), tf_keras.layers.Conv2D(8, 3),
                             tf_keras.layers.Flatten(), tf_keras.layers.Dense(4)])
optimizer = tf_keras.optimizers.legacy.Adam()
loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
def step_fn(data, optimizer):
    x, y = data
    with tf.GradientTape() as tape:
        value = loss(y, model(x, training=True))
    grads = tape.gradient(value, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # noqa: B905
    return {"loss": value}
samples = tf.data.Dataset.from_tensor_slices(
    (tf.random.normal((64, 32, 32, 3)), tf.zeros((64,), tf.int32)))
before = [v.numpy().copy() for v in model.variables]
m = memfit.measure(model, 16, optimizer=optimizer, step_fn=step_fn, data=samples)
e = memfit.estimate(model, 16, optimizer=optimizer, step_fn=step_fn, data=samples,
                    options=memfit.Options(samples=0))
same = all((a == b.numpy()).all() for a, b in zip(before, model.variables, strict=True))
emit({"peak": m.peak_bytes, "resident": m.resident_bytes, "estimate": e.peak_bytes,
      "restored": bool(same), "iterations": int(optimizer.iterations.numpy())})
