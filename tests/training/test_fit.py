"""memfit.fit and GuardedStep: micro-batching, equivalence, real OOM recovery, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Children train factories.detector_cnn (convolutions, global pooling, a box head) on
# factories.box_shards / box_dataset (two shards, the later at twice the resolution).
MODEL = f"""
import sys
sys.path.insert(0, {TESTS!r})
import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import keras, numpy as np
from factories import box_dataset, box_shards
from factories import detector_cnn as build

def weights(model):
    return [w.tolist() for w in model.get_weights()]
"""


def _max_rel(a: list, b: list) -> float:
    """Relative difference of two weight lists: ||a - b|| / ||b|| over all weights."""
    x = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in a])
    y = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in b])
    return float(np.linalg.norm(x - y) / (np.linalg.norm(y) + 1e-30))


def test_k4_equals_k1_at_the_same_effective_batch() -> None:
    result = run_isolated(
        MODEL
        + """
import memfit
rng = np.random.default_rng(3)
x = rng.normal(size=(64, 16, 16, 3)).astype("float32")
y = rng.uniform(size=(64, 4)).astype("float32")
runs = {}
for k in (1, 4):
    m = build()
    h = memfit.fit(m, x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, micro_batches=k)
    runs[k] = {"w": weights(m), "it": int(m.optimizer.iterations), "loss": h.history["loss"],
               "summary": h.memfit.to_dict()}
plain = build()
hp = plain.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
emit({"runs": runs, "plain": weights(plain), "plain_loss": hp.history["loss"]})
"""
    )
    k1, k4 = result["runs"]["1"], result["runs"]["4"]
    assert k1["it"] == k4["it"] == 8  # one update per effective batch
    assert _max_rel(k4["w"], k1["w"]) < 1e-5
    assert _max_rel(k1["w"], result["plain"]) == 0.0  # K=1 is Keras' own step
    assert np.allclose(k4["loss"], result["plain_loss"], rtol=1e-5)
    assert k4["summary"]["micro_batches"] == {"16x16x16x3|16x4": 4}


@pytest.mark.slow
def test_seed_scenario_plain_fit_dies_memfit_fit_recovers() -> None:
    budget = {"MEMFIT_MEMORY": "128MiB"}
    code = (
        MODEL
        + """
import memfit, tensorflow as tf
mode = {mode!r}
out = {{}}
if mode == "plain":
    m = build()
    try:
        m.fit(box_dataset(), epochs=2, verbose=0)
        out["plain"] = "completed"
    except tf.errors.ResourceExhaustedError:
        out["plain"] = "ResourceExhaustedError"
m = build()
h = memfit.fit(m, box_dataset(), epochs=2, verbose=0)
out.update(weights=weights(m), iterations=int(m.optimizer.iterations),
           epochs=len(h.history["loss"]), summary=h.memfit.to_dict())
emit(out)
"""
    )
    tight = run_isolated(code.format(mode="plain"), env=budget)
    roomy = run_isolated(code.format(mode="roomy"), env={"MEMFIT_MEMORY": "4GiB"})
    assert tight["plain"] == "ResourceExhaustedError"
    assert tight["epochs"] == 2
    assert tight["iterations"] == roomy["iterations"] == 8
    recoveries = tight["summary"]["recoveries"]
    assert recoveries and recoveries[0]["phase"] == "gradients"
    assert recoveries[0]["input_shapes"][0][1:] == [128, 128, 3]
    assert tight["summary"]["micro_batches"]["16x64x64x3|16x4"] == 1
    assert tight["summary"]["micro_batches"]["16x128x128x3|16x4"] > 1
    assert roomy["summary"]["recoveries"] == []
    assert _max_rel(tight["weights"], roomy["weights"]) < 1e-5


@pytest.mark.slow
def test_oom_inside_the_optimizer_update_leaves_state_as_a_clean_step() -> None:
    result = run_isolated(
        MODEL
        + """
import memfit, tensorflow as tf

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
""",
        env={"MEMFIT_MEMORY": "512MiB"},
    )
    clean, injected = result["clean"], result["injected"]
    recoveries = injected["summary"]["recoveries"]
    assert [r["phase"] for r in recoveries] == ["apply"]
    assert recoveries[0]["update"] == 1
    assert injected["weights"] == clean["weights"]  # bit for bit
    assert injected["slots"] == clean["slots"]
    assert injected["loss"] == clean["loss"]


def test_batchnorm_statistics_and_dropout_seeds_move_once_per_micro_batch_after_an_oom() -> None:
    """An OOM after the forward pass (the backward's, or the update's) has moved BatchNorm's
    moving statistics and the dropout seeds; the retry starts from where they were, so a
    recovered run ends as a run that trained at the final K from the start."""
    result = run_isolated(
        CHILDREN / "batchnorm_retry.py",
        env={"MEMFIT_MEMORY": "512MiB"},
    )
    clean, recovered = result["clean"], result["recovered"]
    recoveries = recovered["summary"]["recoveries"]
    assert [(r["phase"], r["new_micro_batches"]) for r in recoveries] == [("gradients", 2)]
    paths = [path for path, _ in clean["vars"]]
    assert sum(p.endswith(("moving_mean", "moving_variance")) for p in paths) == 2, paths
    assert any("seed_generator" in p for p in paths), paths
    for (path, value), (_, got) in zip(clean["vars"], recovered["vars"], strict=True):
        if not path.endswith("armed"):  # the same model built twice: its variables in order
            assert np.allclose(got, value, rtol=1e-6, atol=1e-7), path


@pytest.mark.slow
def test_mirrored_strategy_two_cpus_recovers_and_replicas_agree() -> None:
    result = run_isolated(
        MODEL
        + """
import memfit, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    m = build()
x, y = box_shards((128,))[0]
h = memfit.fit(m, x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
agree = all(
    np.array_equal(v.value.values[0].numpy(), v.value.values[1].numpy())
    for v in m.trainable_variables
)
emit({"summary": h.memfit.to_dict(), "agree": agree, "it": int(m.optimizer.iterations.numpy()),
      "replicas": strategy.num_replicas_in_sync})
""",
        env={"MEMFIT_MEMORY": "160MiB"},
    )
    assert result["replicas"] == 2
    assert result["it"] == 1
    assert result["summary"]["recoveries"], "the per-replica step of 16 should not fit at K=1"
    assert result["agree"]


@pytest.mark.slow
def test_loss_scale_optimizer_skips_the_whole_update_on_a_non_finite_micro_batch() -> None:
    result = run_isolated(
        MODEL
        + """
import memfit
keras.mixed_precision.set_dtype_policy("mixed_float16")
rng = np.random.default_rng(7)
x = rng.uniform(size=(8, 16, 16, 3)).astype("float32")
x[6] = 6e4   # overflows float16 in the second micro-batch only
y = rng.uniform(size=(8, 4)).astype("float32")
out = {}
for name in ("keras", "memfit"):
    m = build()
    before = weights(m)
    if name == "keras":
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    else:
        memfit.fit(m, x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, micro_batches=2)
    out[name] = {"changed": weights(m) != before,
                 "scale": float(m.optimizer.dynamic_scale.numpy()),
                 "lso": type(m.optimizer).__name__}
emit(out)
"""
    )
    assert result["memfit"]["lso"] == "LossScaleOptimizer"
    assert result["keras"]["changed"] is False
    assert result["memfit"] == result["keras"]


def test_bad_input_is_one_clear_memfit_error() -> None:
    result = run_isolated(
        MODEL
        + """
import memfit, tensorflow as tf
x = np.zeros((8, 8, 8, 3), "float32"); y = np.zeros((8, 4), "float32")
errors = {}
def attempt(name, fn):
    try:
        fn()
        errors[name] = None
    except memfit.MemfitError as exc:
        errors[name] = str(exc)
attempt("zero", lambda: memfit.fit(build(), x, y, batch_size=0, verbose=0))
attempt("text", lambda: memfit.fit(build(), x, y, batch_size="16", verbose=0))
attempt("float", lambda: memfit.fit(build(), x, y, batch_size=1.5, verbose=0))
raw = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(4)])
attempt("uncompiled", lambda: memfit.fit(raw, x, y, batch_size=4, verbose=0))
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
attempt("batched", lambda: memfit.fit(build(), ds, batch_size=4, verbose=0))
attempt("not_a_model", lambda: memfit.fit("model.keras", x, y, batch_size=4))
# Keras 3 would train the first epoch of a dataset that repeats for ever for ever.
attempt("endless", lambda: memfit.fit(build(), ds.repeat(), epochs=1, verbose=0))
errors["with_steps"] = len(memfit.fit(build(), ds.repeat(), steps_per_epoch=2, verbose=0)
                           .history["loss"])
emit(errors)
"""
    )
    for bad in ("zero", "text", "float"):
        assert "batch size must be a whole number of at least 1" in result[bad]
    assert "never compiled" in result["uncompiled"]
    assert "already batched by 8" in result["batched"]
    assert "expected a Keras model (keras.Model or tf_keras.Model)" in result["not_a_model"]
    assert "repeats for ever" in result["endless"] and "steps_per_epoch=N" in result["endless"]
    assert result["with_steps"] == 1  # with steps_per_epoch it trains, and the epoch ends


@pytest.mark.slow
def test_one_sample_per_micro_batch_still_too_big_is_a_clear_error() -> None:
    result = run_isolated(
        MODEL
        + """
import memfit
x = np.zeros((2, 512, 512, 3), "float32"); y = np.zeros((2, 4), "float32")
try:
    memfit.fit(build(), x, y, batch_size=2, verbose=0)
    emit({"error": None})
except memfit.MemfitError as exc:
    emit({"error": str(exc)})
""",
        env={"MEMFIT_MEMORY": "96MiB"},
    )
    assert "even one sample per micro-batch does not fit" in result["error"]
    assert "512x512x3" in result["error"]


def test_guarded_step_in_a_custom_loop_matches_the_tape_loop() -> None:
    result = run_isolated(
        MODEL
        + """
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
                                    m.trainable_variables))
        else:
            value = step((xb, yb))["loss"]
        losses.append(float(value))
    out[name] = {"w": weights(m), "losses": losses, "it": int(opt.iterations.numpy())}
emit(out)
"""
    )
    tape, guarded = result["tape"], result["guarded"]
    assert tape["it"] == guarded["it"] == 4
    assert _max_rel(guarded["w"], tape["w"]) < 1e-5
    assert np.allclose(guarded["losses"], tape["losses"], rtol=1e-5)


def test_a_plan_for_another_precision_or_remat_is_refused_and_build_scope_obeys_it() -> None:
    result = run_isolated(
        MODEL
        + """
import memfit
from memfit.planning import Plan
def plan(precision, remat=None):
    return Plan(batch_size=8, micro_batches=2, micro_batch_size=4, precision=precision,
                remat=remat, peak_bytes=None, step_seconds=None,
                budget=memfit.Budget.from_size("1GiB"), margin=0.05)
x = np.zeros((8, 16, 16, 3), "float32"); y = np.zeros((8, 4), "float32")
out = {}
def attempt(name, model, p):
    try:
        h = memfit.fit(model, x, y, batch_size=8, verbose=0, plan=p)
        out[name] = {"micro_batches": list(h.memfit.micro_batches.values())}
    except memfit.MemfitError as exc:
        out[name] = {"error": str(exc)}
attempt("mixed_plan_float32_model", build(), plan("mixed_float16"))
attempt("remat_plan_plain_model", build(), plan("float32", "larger_than"))
for p in (plan("mixed_float16"), plan("float32", "larger_than")):
    with p.build_scope():
        model = build()
    attempt(f"built_for_{p.precision}_{p.remat}", model, p)
    out[f"policy_after_{p.precision}"] = keras.mixed_precision.dtype_policy().name
with plan("mixed_bfloat16").build_scope():
    mixed = build()
attempt("float32_plan_mixed_model", mixed, plan("float32"))
# The old spelling, a plan as micro_batches: still followed, with a DeprecationWarning.
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    h = memfit.fit(build(), x, y, batch_size=8, verbose=0, micro_batches=plan("float32"))
out["deprecated"] = {
    "micro_batches": list(h.memfit.micro_batches.values()),
    "warned": [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)],
}
emit(out)
""",
    )
    error = result["mixed_plan_float32_model"]["error"]
    assert "plan is for precision mixed_float16" in error and "built with float32" in error
    assert 'set_dtype_policy("mixed_float16")' in error and "float32" in error
    assert "\n" not in error
    error = result["remat_plan_plain_model"]["error"]
    assert "remat) 'larger_than'" in error and "without it" in error
    assert 'RematScope(mode="larger_than")' in error and "remat_modes=[None]" in error
    assert "built with mixed_bfloat16" in result["float32_plan_mixed_model"]["error"]
    # Built in the plan's scope, the model trains at the plan's K; the global policy is back.
    assert result["built_for_mixed_float16_None"] == {"micro_batches": [2]}
    assert result["built_for_float32_larger_than"] == {"micro_batches": [2]}
    assert result["policy_after_mixed_float16"] == "float32"
    assert result["deprecated"]["micro_batches"] == [2]
    assert any("pass the plan as plan=plan" in m for m in result["deprecated"]["warned"])
