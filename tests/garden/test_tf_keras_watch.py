"""memfit.Watch under tf_keras (Keras 2, the Model Garden's Keras): its `model.fit` and a
custom training loop each log every step's memory and time.

Each test trains in a child process under an emulated budget (the CPU's BFC allocator keeps
the memory statistics Watch reads).
"""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import run_isolated

ENV = {"MEMFIT_MEMORY": "256MiB", "TF_ENABLE_ONEDNN_OPTS": "0"}

MODEL = r"""
import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np, tensorflow as tf, tf_keras

tf_keras.utils.set_random_seed(1)
inputs = tf_keras.Input((16, 16, 3))
h = tf_keras.layers.Conv2D(8, 3, activation="relu")(inputs)
h = tf_keras.layers.GlobalAveragePooling2D()(h)
model = tf_keras.Model(inputs, tf_keras.layers.Dense(4)(h))
rng = np.random.default_rng(0)
x = rng.random((64, 16, 16, 3), dtype=np.float32)
y = rng.integers(0, 4, (64,))
"""


def _read(path: str) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def test_watch_in_tf_keras_model_fit_logs_memory_and_time_per_step(tmp_path) -> None:
    log = str(tmp_path / "run.jsonl")
    code = (
        MODEL
        + f"""
model.compile(tf_keras.optimizers.Adam(1e-3),
              tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
watch = memfit.Watch(log_path={log!r}, verbose=False)
history = model.fit(x, y, batch_size=8, epochs=2, callbacks=[watch], verbose=0)
emit({{"steps": len(watch.steps), "losses": history.history["loss"]}})
"""
    )
    result = run_isolated(code, env=ENV, timeout=300)
    assert result["steps"] == 16 and len(result["losses"]) == 2
    lines = _read(log)
    header, steps = lines[0], [line for line in lines if line["type"] == "step"]
    assert header["type"] == "header" and header["tf_keras"]  # the tf_keras version
    assert header["memory_stats"] is True and header["input_wait_measured"] is False
    assert header["config"]["epochs"] == 2 and header["config"]["steps_per_epoch"] == 8
    assert [s["step"] for s in steps] == list(range(16))
    assert all(s["memory_peak_bytes"] > 0 and s["memory_current_bytes"] > 0 for s in steps)
    assert all(s["step_seconds"] > 0 for s in steps)
    assert all(s["traces"] >= 1 for s in steps)  # tf_keras' train function, found and counted
    assert all(isinstance(s["loss"], float) for s in steps)
    # Per-step losses, derived from Keras' running means, average to the epoch's loss.
    first_epoch = [s["loss"] for s in steps if s["epoch"] == 0]
    assert abs(sum(first_epoch) / 8 - result["losses"][0]) < 1e-4
    end = lines[-1]
    assert end["type"] == "end" and end["steps"] == 16 and end["peak_bytes"] > 0
    report = subprocess.run(
        [sys.executable, "-m", "memfit", "report", log, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert json.loads(report.stdout)["runs"][0]["summary"]["steps"] == 16


def test_watch_in_a_tf_keras_custom_loop_makes_the_calls_keras_makes(tmp_path) -> None:
    log = str(tmp_path / "loop.jsonl")
    code = (
        MODEL
        + f"""
optimizer = tf_keras.optimizers.Adam(1e-3)
loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)

@tf.function
def train_step(images, labels):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

watch = memfit.Watch(log_path={log!r}, verbose=False)
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
        watch.on_train_batch_end(batch, {{"loss": float(mean.result())}})
    watch.on_epoch_end(epoch, {{"loss": float(mean.result())}})
watch.on_train_end()
emit({{"own": own}})
"""
    )
    result = run_isolated(code, env=ENV, timeout=300)
    steps = [line for line in _read(log) if line["type"] == "step"]
    assert len(steps) == 16
    assert all(s["memory_peak_bytes"] > 0 and s["step_seconds"] > 0 for s in steps)
    logged = [s["loss"] for s in steps]
    assert max(abs(a - b) for a, b in zip(logged, result["own"], strict=True)) < 1e-4
