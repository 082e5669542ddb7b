"""Child of test_watch_custom_loop.py: a GradientTape loop watched as Keras calls a callback;
`log` is the Watch's log path.
"""

from child import arguments, emit

LOG = arguments()["log"]

import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np
import tensorflow as tf
import keras

keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
optimizer = keras.optimizers.Adam(1e-3)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
rng = np.random.default_rng(0)
dataset = tf.data.Dataset.from_tensor_slices(
    (rng.random((48, 16, 16, 3), dtype=np.float32), rng.integers(0, 4, (48,)))).batch(8)

@tf.function
def train_step(images, labels):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # noqa: B905
    return loss

watch = memfit.Watch(log_path=LOG, verbose=False)
watch.set_model(model)
mean = keras.metrics.Mean()
watch.on_train_begin()
own = []
for epoch in range(2):
    watch.on_epoch_begin(epoch)
    mean.reset_state()
    for batch, (images, labels) in enumerate(dataset):
        watch.on_train_batch_begin(batch)
        loss = train_step(images, labels)
        own.append(float(loss))
        mean.update_state(loss)
        watch.on_train_batch_end(batch, {"loss": float(mean.result())})
    watch.on_epoch_end(epoch, {"loss": float(mean.result())})
watch.on_train_end()
emit({"own": own})
