"""GuardedStep and memfit.fit on tf_keras (Keras 2) models and optimizers, legacy and new."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import run_isolated

MODEL = """
import memfit  # first: applies MEMFIT_MEMORY before TensorFlow starts
import numpy as np
import tensorflow as tf
import tf_keras

def build(optimizer="legacy_sgd", size=None):
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([
        tf_keras.layers.Conv2D(16, 3, padding="same", activation="relu",
                               input_shape=(size, size, 3)),
        tf_keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        tf_keras.layers.GlobalAveragePooling2D(),
        tf_keras.layers.Dense(4),
    ])
    optimizers = {
        "legacy_sgd": lambda: tf_keras.optimizers.legacy.SGD(0.05, momentum=0.9),
        "adam": lambda: tf_keras.optimizers.Adam(1e-3),
    }
    model.compile(optimizer=optimizers[optimizer](), loss="mse")
    return model

def weights(model):
    return [w.tolist() for w in model.get_weights()]

rng = np.random.default_rng(3)
x = rng.normal(size=(64, 32, 32, 3)).astype("float32")
y = rng.uniform(size=(64, 4)).astype("float32")
"""


def _max_rel(a: list, b: list) -> float:
    x = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in a])
    y = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in b])
    return float(np.linalg.norm(x - y) / (np.linalg.norm(y) + 1e-30))


def test_fit_and_custom_loop_match_tf_keras_own_step() -> None:
    result = run_isolated(
        MODEL
        + """
import memfit
out = {}
for name in ("legacy_sgd", "adam"):
    plain = build(name)
    plain.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    fitted = build(name)
    h = memfit.fit(fitted, x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
                   micro_batches=4)
    # A custom loop: the tf_keras optimizer and a loss_fn, GuardedStep per batch.
    looped = build(name)
    optimizer = looped.optimizer
    mse = tf_keras.losses.MeanSquaredError()
    step = memfit.GuardedStep(looped, micro_batches=2, optimizer=optimizer,
                              loss_fn=lambda a, b: mse(b, looped(a, training=True)))
    for i in range(4):
        logs = step((tf.constant(x[16 * i:16 * (i + 1)]), tf.constant(y[16 * i:16 * (i + 1)])))
    out[name] = {"plain": weights(plain), "fit": weights(fitted), "loop": weights(looped),
                 "updates": h.memfit.updates, "iterations": int(fitted.optimizer.iterations),
                 "loop_iterations": int(optimizer.iterations), "loss": float(logs["loss"]),
                 "optimizer": type(optimizer).__module__}
emit(out)
"""
    )
    for name, run in result.items():
        assert run["optimizer"].startswith("tf_keras"), name
        assert run["updates"] == run["iterations"] == 4
        assert run["loop_iterations"] == 4
        assert np.isfinite(run["loss"])
        # K micro-batches against tf_keras' own fit: float noise only (no per-batch norm).
        assert _max_rel(run["fit"], run["plain"]) < 1e-5, name
        assert _max_rel(run["loop"], run["plain"]) < 1e-5, name


def test_step_fn_and_loss_scale_optimizer_under_mixed_precision() -> None:
    result = run_isolated(
        MODEL
        + """
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
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return {"loss": loss}

step = memfit.GuardedStep(model, micro_batches=2, optimizer=optimizer, step_fn=step_fn,
                          guard_update=True)
losses = [float(step((tf.constant(x[:16]), tf.constant(y[:16])))["loss"]) for _ in range(3)]
names = [v.name for v in optimizer_variables(optimizer)]
emit({"losses": losses, "iterations": int(optimizer.iterations), "names": names,
      "guarded": step.summary.guarded_updates})
"""
    )
    assert result["iterations"] == 3
    assert all(np.isfinite(result["losses"]))
    assert result["losses"][-1] < result["losses"][0]  # it trains
    assert result["guarded"] == 3
    # The loss scale is part of the state a guarded update saves and puts back.
    assert any("loss_scale" in name for name in result["names"]), result["names"]


def test_bad_steps_are_one_clear_error() -> None:
    result = run_isolated(
        MODEL
        + """
import memfit
model = build("adam")
out = {}
def no_loss(data, optimizer):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(data[0], training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
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
"""
    )
    assert "returned no loss (its keys: total)" in result["no_loss"]
    assert "apply_gradients 0 times" in result["no_update"]
    assert "not both" in result["both"]
    assert "expected a TF Model Garden task" in result["task"]
    assert "keras.Model or tf_keras.Model" in result["model"]
    assert all("\n" not in text for text in result.values())


@pytest.mark.slow
def test_fit_on_tf_keras_survives_an_oom_that_kills_tf_keras_fit() -> None:
    code = (
        MODEL
        + """
import memfit
mode = "MODE"
rng = np.random.default_rng(5)
# A first shard at 32 px, then one at 128 px: 16x the activations.
def shard(size):
    images = rng.normal(size=(32, size, size, 3)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((images, rng.uniform(size=(32, 4)).astype("float32")))
data = shard(32).batch(16).concatenate(shard(128).batch(16))
out = {}
if mode == "tight":
    plain = build("legacy_sgd")
    try:
        plain.fit(data, epochs=1, verbose=0)
        out["plain"] = "completed"
    except tf.errors.ResourceExhaustedError:
        out["plain"] = "ResourceExhaustedError"
model = build("legacy_sgd")
h = memfit.fit(model, data, epochs=1, verbose=0)
out.update(weights=weights(model), iterations=int(model.optimizer.iterations),
           summary=h.memfit.to_dict())
emit(out)
"""
    )
    tight = run_isolated(code.replace("MODE", "tight"), env={"MEMFIT_MEMORY": "40MiB"})
    roomy = run_isolated(code.replace("MODE", "roomy"), env={"MEMFIT_MEMORY": "2GiB"})
    assert tight["plain"] == "ResourceExhaustedError"
    assert tight["iterations"] == roomy["iterations"] == 4
    recoveries = tight["summary"]["recoveries"]
    assert recoveries and recoveries[0]["input_shapes"][0][1:] == [128, 128, 3]
    assert roomy["summary"]["recoveries"] == []
    assert _max_rel(tight["weights"], roomy["weights"]) < 1e-5
