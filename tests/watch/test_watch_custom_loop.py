"""memfit.Watch in a Keras 3 custom (GradientTape) loop that makes the calls Keras makes: every
step's memory, time and own loss are logged (tests/garden/test_tf_keras_watch.py does the same under
tf_keras)."""

from __future__ import annotations

import json

from helpers import run_isolated

LOOP = r"""
import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np, tensorflow as tf, keras

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
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
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
"""


def test_watch_in_a_custom_loop_logs_every_step(tmp_path) -> None:
    log = str(tmp_path / "loop.jsonl")
    result = run_isolated(f"LOG = {log!r}\n" + LOOP, env={"MEMFIT_MEMORY": "256MiB"}, timeout=300)
    with open(log) as handle:
        lines = [json.loads(line) for line in handle]
    assert lines[0]["type"] == "header" and lines[0]["tf_keras"] is None
    steps = [line for line in lines if line["type"] == "step"]
    assert [s["step"] for s in steps] == list(range(12))
    assert all(s["memory_peak_bytes"] > 0 and s["step_seconds"] > 0 for s in steps)
    logged = [s["loss"] for s in steps]
    assert max(abs(a - b) for a, b in zip(logged, result["own"], strict=True)) < 1e-4
    assert lines[-1]["type"] == "end" and lines[-1]["steps"] == 12
