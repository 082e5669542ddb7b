"""Child of test_tf_keras_watch.py: a tf_keras GradientTape loop that calls a Watch as Keras
does; it logs to `log`.
"""

from child import arguments, emit

from watched_model import model, x, y  # first: memfit, then TensorFlow
import memfit
import tensorflow as tf
import tf_keras

optimizer = tf_keras.optimizers.Adam(1e-3)
loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)

@tf.function
def train_step(images, labels):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # noqa: B905
    return loss

watch = memfit.Watch(log_path=arguments()["log"], verbose=False)
watch.set_model(model)
mean = tf_keras.metrics.Mean()
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
