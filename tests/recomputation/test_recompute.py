"""memfit.recomputation.remat: segments under tf.recompute_grad give the plain step's gradients,
update
BatchNorm once, keep dropout masks, and say clearly where they cannot apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import run_isolated

import memfit
from memfit.errors import RecomputeError

CHILDREN = Path(__file__).resolve().parent / "children"


def _block_model(dropout: float = 0.3, batchnorm: bool = True) -> Any:
    """A small residual CNN (3 blocks: articulation points between them)."""
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(8, 3, padding="same", name="stem")(inputs)
    for i in range(3):
        s = keras.layers.Conv2D(8, 3, padding="same", name=f"conv{i}")(h)
        if batchnorm:
            s = keras.layers.BatchNormalization(name=f"bn{i}")(s)
        s = keras.layers.ReLU()(s)
        if dropout:
            s = keras.layers.Dropout(dropout, name=f"drop{i}")(s)
        h = keras.layers.Add(name=f"add{i}")([h, s])
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(4, name="head")(h))


def _train_step(model: Any, x: Any, y: Any, recompute: Any, compiled: bool) -> tuple[list, list]:
    """Gradients of one step and every variable after it (state restored afterwards)."""
    import tensorflow as tf

    saved = [np.array(v.numpy(), copy=True) for v in model.variables]

    def step() -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        return tape.gradient(loss, model.trainable_variables)

    run = tf.function(step) if compiled else step
    if recompute is not None:
        with recompute:
            grads = run()
    else:
        grads = run()
    after = [np.array(v.numpy(), copy=True) for v in model.variables]
    for v, value in zip(model.variables, saved, strict=True):
        v.assign(value)
    return [np.asarray(g) for g in grads], after


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_gradients_batchnorm_and_dropout_equal_the_plain_step(compiled: bool) -> None:
    import tensorflow as tf

    model = _block_model()
    x = tf.random.stateless_normal((4, 16, 16, 3), seed=(1, 2))
    y = tf.random.stateless_normal((4, 4), seed=(3, 4))
    plan = memfit.recompute(model, "all")
    assert len(plan.report.segments) >= 4  # cut between the blocks at least
    plain_grads, plain_after = _train_step(model, x, y, None, compiled)
    grads, after = _train_step(model, x, y, plan, compiled)
    # Gradients: to float32 rounding. A new dropout mask in the recomputation would change
    # them far beyond that (a third of the units differ).
    for g0, g1 in zip(plain_grads, grads, strict=True):
        np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-6)
    # BatchNorm moving statistics moved once (a second update would move them again), and
    # the dropout seed generators advanced as in the plain step.
    names = [v.path for v in model.variables]
    for name, v0, v1 in zip(names, plain_after, after, strict=True):
        np.testing.assert_allclose(v1, v0, rtol=1e-6, atol=1e-7, err_msg=name)
    moving = [a for n, a in zip(names, after, strict=True) if "moving_mean" in n]
    assert moving and all(np.abs(m).sum() > 0 for m in moving)  # they did move
    # The model is its own again afterwards (no segmented call left behind).
    assert "call" not in model.__dict__


def test_segments_are_recomputed_in_backward() -> None:
    """The gradient runs each segment's layers again (counted), and only in training."""
    import keras
    import tensorflow as tf

    calls: list[str] = []

    class Counting(keras.layers.Layer):
        def call(self, inputs: Any) -> Any:
            calls.append(self.name)
            return inputs * 2.0

    inputs = keras.Input((4,))
    h = keras.layers.Dense(4, name="d0")(inputs)
    h = Counting(name="count")(h)
    h = keras.layers.Dense(4, name="d1")(h)
    model = keras.Model(inputs, keras.layers.Dense(1, name="d2")(h))
    x = tf.ones((2, 4))
    calls.clear()  # building the model called it symbolically
    with memfit.recompute(model, "all"):
        model(x, training=False)
        assert calls == ["count"]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True))
        assert calls == ["count"] * 2
        tape.gradient(loss, model.trainable_variables)
    assert calls == ["count"] * 3  # recomputed for the gradient


def test_policies_sqrt_count_size_and_layer_names() -> None:
    model = _block_model(dropout=0.0)
    sqrt = memfit.recompute(model).report
    assert sqrt.policy == "sqrt" and len(sqrt.segments) >= 2
    assert len(memfit.recompute(model, 2).report.segments) == 2
    named = memfit.recompute(model, ["add0", "add1"]).report
    assert named.boundaries == ["add0", "add1"]
    # 16x16x8 float32 = 8 KiB a boundary: a 20 KiB budget keeps two, not more.
    sized = memfit.recompute(model, "20KiB").report
    assert 1 <= len(sized.boundaries) <= 2 and sized.kept_bytes <= 20 * 1024
    # Inside a block two tensors cross (the shortcut and the branch): a cut of two.
    inside = memfit.recompute(model, ["conv1"]).report
    assert inside.segments[0].boundary_tensors == 2
    with pytest.raises(RecomputeError, match="cannot cut after layer 'head'"):
        memfit.recompute(model, ["head"])
    with pytest.raises(RecomputeError, match="too small"):
        memfit.recompute(model, "1KiB")
    with pytest.raises(RecomputeError, match="segments must be"):
        memfit.recompute(model, "often")


class _Chain:
    """A layer graph stand-in: layers in a row, layer i producing tensor i of `sizes[i]` bytes."""

    def __init__(self, sizes: list[int]) -> None:
        import types

        self.sizes = sizes
        self.steps = [types.SimpleNamespace(node=object(), outputs=[i]) for i in range(len(sizes))]

    def step_bytes(self, index: int, batch_size: int = 1) -> int:
        return self.sizes[index] * batch_size

    def tensor_bytes(self, tensor: int, batch_size: int = 1) -> int:
        return self.sizes[tensor] * batch_size

    def boundary_bytes(self, tensors: Any, batch_size: int = 1) -> int:
        return sum(self.tensor_bytes(t, batch_size) for t in tensors)

    def layer_name(self, index: int) -> str:
        return f"l{index}"


def test_cut_policies_on_a_chain_without_tensorflow() -> None:
    """The cut choice is arithmetic on the graph's bytes: a fake graph needs no Keras."""
    import types

    from memfit.recomputation.cuts import choose_cuts, kept_bytes, recomputed_flags

    chain = _Chain([100] * 10)
    cuts = [(i, (i,)) for i in range(9)]
    # sqrt: four segments whose peaks (boundaries held + the segment) are all 400 bytes.
    assert choose_cuts(chain, cuts, "sqrt", 1) == [3, 6, 8]
    assert choose_cuts(chain, cuts, "all", 1) == list(range(9))
    assert choose_cuts(chain, cuts, 2, 1) == [4]
    assert choose_cuts(chain, cuts, ["l3", "l6"], 1) == [3, 6]
    # 250 bytes of boundaries: two cuts (200), not three; at batch 2 only one fits.
    assert choose_cuts(chain, cuts, "250B", 1) == [2, 6]
    assert kept_bytes(chain, cuts, [2, 6]) == 200
    assert len(choose_cuts(chain, cuts, "250B", 2)) == 1
    with pytest.raises(RecomputeError, match="too small"):
        choose_cuts(chain, cuts, "50B", 1)
    with pytest.raises(RecomputeError, match="cannot cut after layer 'l9'"):
        choose_cuts(chain, cuts, ["l9"], 1)
    with pytest.raises(RecomputeError, match="at least 1"):
        choose_cuts(chain, cuts, 0, 1)
    # A narrow tail costs no more to keep whole than to recompute: "sqrt" keeps it.
    tail = _Chain([100] * 8 + [1, 1])
    chosen = [1, 3, 5, 7, 8]
    segments = [types.SimpleNamespace(outputs=[end]) for end in chosen]
    segments.append(types.SimpleNamespace(outputs=[]))
    assert recomputed_flags(tail, chosen, segments, False) == [True] * 5 + [False]
    assert recomputed_flags(tail, chosen, segments, True) == [True] * 4 + [False] * 2


def test_sequential_model_gives_the_plain_gradients() -> None:
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), *[keras.layers.Dense(8, activation="relu") for _ in range(4)]]
        + [keras.layers.Dense(1)]
    )
    x, y = tf.ones((3, 8)), tf.zeros((3, 1))
    plain, _ = _train_step(model, x, y, None, True)
    grads, _ = _train_step(model, x, y, memfit.recompute(model, "sqrt"), True)
    for g0, g1 in zip(plain, grads, strict=True):
        np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-6)


def test_subclassed_model_is_not_applicable() -> None:
    import keras

    class Net(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.a = keras.layers.Dense(4)
            self.b = keras.layers.Dense(1)

        def call(self, x: Any) -> Any:
            return self.b(self.a(x))

    model = Net()
    model.build((None, 3))
    with pytest.raises(RecomputeError) as info:
        memfit.recompute(model)
    message = str(info.value)
    assert message.startswith("recompute is not applicable:") and "subclassed" in message
    assert "\n" not in message


def test_graph_without_articulation_point_is_not_applicable() -> None:
    import keras

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(4)(inputs))  # one layer: nowhere to cut
    with pytest.raises(RecomputeError, match="no articulation point"):
        memfit.recompute(model)


def test_fit_trains_with_recompute_like_without() -> None:
    """memfit.fit(recompute=...) trains the user's model: same losses, same weights."""
    import keras

    x = np.random.default_rng(0).standard_normal((16, 16, 16, 3)).astype("float32")
    y = np.random.default_rng(1).standard_normal((16, 4)).astype("float32")
    results = []
    for option in (None, "sqrt"):
        model = _block_model(dropout=0.0)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        history = memfit.fit(model, x, y, batch_size=8, epochs=2, verbose=0, recompute=option)
        results.append((history.history["loss"], [w.copy() for w in model.get_weights()]))
        assert "call" not in model.__dict__
    (loss0, w0), (loss1, w1) = results
    np.testing.assert_allclose(loss1, loss0, rtol=1e-5)
    for a, b in zip(w0, w1, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_measure_with_recompute_lowers_the_peak() -> None:
    """Measured under an emulated budget: memfit's recompute keeps less for backward."""
    result = run_isolated(
        CHILDREN / "recompute_peak.py",
        env={"MEMFIT_MEMORY": "2GiB", "TF_NUM_INTRAOP_THREADS": "1"},
        timeout=300,
    )
    plain, segmented, left_patched = result
    assert not left_patched
    assert segmented < 0.8 * plain, (plain, segmented)


def test_cli_measure_recompute_on_a_subclassed_model_is_one_line(tmp_path: Any) -> None:
    from helpers import run_cli

    module = tmp_path / "subclassed_factory.py"
    module.write_text(
        "import keras\n"
        "class Net(keras.Model):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.d = keras.layers.Dense(2, activation='softmax')\n"
        "    def call(self, x):\n"
        "        return self.d(x)\n"
        "def build():\n"
        "    m = Net()\n"
        "    m.build((None, 4))\n"
        "    m.compile('adam', 'sparse_categorical_crossentropy')\n"
        "    return m\n"
    )
    import os

    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = run_cli(
        "measure",
        "subclassed_factory:build",
        "--input-shape",
        "4",
        "-b",
        "2",
        "--recompute",
        "sqrt",
        "--memory",
        "1GiB",
        env=env,
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("memfit: error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "recompute is not applicable" in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_estimate_what_if_that_cannot_build_is_one_not_applicable_line() -> None:
    """A RematScope mode that fails is a row 'not applicable: <why>', not a raw exception."""
    from memfit.estimation.what_ifs import not_applicable

    keras_error = ValueError(
        'in user code:\n\n    File "functional.py", line 183, in call\n        outputs = '
        "self._run_through_graph(\n\n    ValueError: Output with path `0` is not connected"
    )
    assert not_applicable(keras_error) == ("not applicable: Output with path `0` is not connected")
    assert not_applicable(TypeError("bad mode\nmore")) == "not applicable: bad mode"
    # RematScope("larger_than") on a functional model: Keras wraps the cause twice.
    wrapped = ValueError(
        "in user code:\n\n    File \"trainer.py\", line 59, in train_step  *\n"
        "        y_pred = self(x, training=True)\n\n"
        "    ValueError: Exception encountered when calling Functional.call().\n    \n"
        "    \x1b[1mThe custom_gradient decorator currently supports keywords arguments only "
        "when eager execution is enabled.\x1b[0m\n    \n"
        "    Arguments received by Functional.call():\n      • training=True\n"
    )
    assert not_applicable(wrapped) == (
        "not applicable: The custom_gradient decorator currently supports keywords arguments "
        "only when eager execution is enabled."
    )


def _pyramid_model() -> Any:
    """A toy detector: three stages hand their outputs to a top-down pyramid together."""
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(4, 3, padding="same", name="stem")(inputs)
    levels = []
    for i in range(3):
        h = keras.layers.Conv2D(8, 3, strides=2, padding="same", name=f"stage{i}_a")(h)
        h = keras.layers.BatchNormalization(name=f"stage{i}_bn")(h)
        h = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name=f"stage{i}_b")(h)
        levels.append(h)
    top = levels[-1]
    outputs = [keras.layers.GlobalAveragePooling2D()(top)]
    for level in reversed(levels[:-1]):
        top = keras.layers.Add()([keras.layers.UpSampling2D()(top), level])
        outputs.append(keras.layers.GlobalAveragePooling2D()(top))
    merged = keras.layers.Concatenate()(outputs)
    return keras.Model(inputs, keras.layers.Dense(4, name="head")(merged))


def test_pyramid_is_cut_where_several_tensors_cross() -> None:
    """Stage outputs live together until the pyramid: boundaries of several tensors."""
    import tensorflow as tf

    model = _pyramid_model()
    plan = memfit.recompute(model, ["stage0_b", "stage1_b", "stage2_a"])
    crossing = [s.boundary_tensors for s in plan.report.segments[:-1]]
    assert crossing == [1, 2, 3]  # stage 0 and 1 outputs stay live for the pyramid
    x = tf.random.stateless_normal((2, 32, 32, 3), seed=(5, 6))
    y = tf.random.stateless_normal((2, 4), seed=(7, 8))
    plain, plain_after = _train_step(model, x, y, None, True)
    grads, after = _train_step(model, x, y, plan, True)
    for g0, g1 in zip(plain, grads, strict=True):
        np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-6)
    for v0, v1 in zip(plain_after, after, strict=True):
        np.testing.assert_allclose(v1, v0, rtol=1e-6, atol=1e-7)
    # The default policy finds cuts through the pyramid's inputs too, and keeps each stage
    # output once however many cuts it crosses.
    sqrt = memfit.recompute(model).report
    assert len(sqrt.segments) >= 2
    assert sqrt.kept_bytes <= sum(s.boundary_bytes for s in sqrt.segments)


def _shared_head_model(calls: list[str]) -> Any:
    """A toy detector: a backbone, two levels, one composite head layer applied to each."""
    import keras

    class Head(keras.layers.Layer):
        """Two convolutions, shared by every level (as keras-hub's RetinaNet heads are)."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.conv = keras.layers.Conv2D(8, 3, padding="same", activation="relu")
            self.out = keras.layers.Conv2D(2, 1)

        def build(self, shape: Any) -> None:
            self.conv.build(shape)
            self.out.build((*shape[:-1], 8))

        def call(self, inputs: Any) -> Any:
            calls.append(f"head{inputs.shape[1]}")
            return self.out(self.conv(inputs))

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(4, 3, padding="same", name="stem")(inputs)
    h = keras.layers.BatchNormalization(name="stem_bn")(h)
    p3 = keras.layers.Conv2D(4, 3, strides=2, padding="same", name="p3")(h)
    p4 = keras.layers.Conv2D(4, 3, strides=2, padding="same", name="p4")(p3)
    head = Head(name="head")
    outputs = [keras.layers.Reshape((-1, 2))(head(level)) for level in (p3, p4)]
    merged = keras.layers.Concatenate(axis=1)(outputs)
    return keras.Model(inputs, keras.layers.Flatten()(merged))


def test_composite_layer_calls_in_a_kept_segment_are_recomputed_alone() -> None:
    """A shared head's calls (once per level) are recomputed one by one: same gradients."""
    import tensorflow as tf

    calls: list[str] = []
    model = _shared_head_model(calls)
    plan = memfit.recompute(model, ["stem_bn"])
    last = plan.report.segments[-1]
    assert not last.recomputed and last.recomputed_calls == 2
    assert "2 calls of composite layers" in str(plan.report)
    x = tf.random.stateless_normal((2, 16, 16, 3), seed=(1, 2))
    calls.clear()
    with plan, tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x, training=True) ** 2)
    forward = list(calls)
    assert sorted(forward) == ["head4", "head8"]
    tape.gradient(loss, model.trainable_variables)
    # Each level's call ran again for its gradient, the later call's first.
    assert calls == forward + forward[::-1]
    y = tf.random.stateless_normal((2, 160), seed=(3, 4))
    for compiled in (False, True):
        plain, plain_after = _train_step(model, x, y, None, compiled)
        grads, after = _train_step(model, x, y, plan, compiled)
        for g0, g1 in zip(plain, grads, strict=True):
            np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-6)
        for v0, v1 in zip(plain_after, after, strict=True):
            np.testing.assert_allclose(v1, v0, rtol=1e-6, atol=1e-7)


def test_last_segment_is_not_recomputed_and_sqrt_keeps_cheap_tails() -> None:
    """Recomputing the last segment saves nothing: its layer runs twice, not three times."""
    import keras
    import tensorflow as tf

    calls: list[str] = []

    class Counting(keras.layers.Layer):
        def call(self, inputs: Any) -> Any:
            calls.append(self.name)
            return inputs * 2.0

    inputs = keras.Input((64,))
    h = keras.layers.Dense(64, name="d0")(inputs)
    h = keras.layers.Dense(64, name="d1")(h)
    h = keras.layers.Dense(2, name="narrow")(h)
    model = keras.Model(inputs, Counting(name="tail")(h))
    plan = memfit.recompute(model, "all")
    assert [s.recomputed for s in plan.report.segments] == [True, True, True, False]
    assert plan.report.segments[-1].first_layer == "tail"
    calls.clear()
    with plan, tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.ones((2, 64)), training=True))
    tape.gradient(loss, model.trainable_variables)
    assert calls == ["tail"]  # the forward only
    # "sqrt" keeps a segment whole where that does not raise the predicted peak: the narrow
    # tail after the wide layers costs less to keep than the wide segments recomputed.
    sqrt = memfit.recompute(model, "sqrt").report
    assert not sqrt.segments[-1].recomputed
    assert "recomputed" in str(sqrt)


def test_estimate_has_a_recompute_row_below_the_plain_step() -> None:
    """The what-if traces the step with the forward segmented and replays it."""
    model = _block_model(dropout=0.0)
    model.compile("adam", "mse")
    est = memfit.estimate(model, 8, what_ifs=True)
    row = next(r for r in est.what_ifs if r["change"] == "recompute sqrt")
    assert "error" not in row and 0 < row["peak_bytes"] < est.peak_bytes


def test_fit_follows_a_plan_for_memfits_recompute() -> None:
    """A plan whose remat is "memfit" needs no rebuild: memfit.fit segments the forward."""
    import keras

    calls: list[str] = []

    class Counting(keras.layers.Layer):
        def call(self, inputs: Any) -> Any:
            calls.append(self.name)
            return inputs * 1.0

    inputs = keras.Input((8,))
    h = keras.layers.Dense(8, name="d0")(inputs)
    h = Counting(name="count")(h)
    model = keras.Model(inputs, keras.layers.Dense(1, name="d1")(keras.layers.Dense(8)(h)))
    model.compile(optimizer="sgd", loss="mse")
    plan = memfit.Plan(
        batch_size=8, micro_batches=1, micro_batch_size=8, precision="float32", remat="memfit",
        peak_bytes=None, step_seconds=None, budget=memfit.Budget.from_size("1GiB"), margin=0.05,
    )
    x, y = np.ones((8, 8), "float32"), np.zeros((8, 1), "float32")
    calls.clear()
    memfit.fit(model, x, y, batch_size=8, epochs=1, verbose=0, plan=plan)
    assert calls.count("count") == 2  # traced in the forward and again in backward
    with pytest.raises(memfit.MemfitError, match="memfit's recompute"):
        with keras.RematScope(mode="activations"):
            other = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        other.compile(optimizer="sgd", loss="mse")
        memfit.fit(other, x, y, batch_size=8, verbose=0, plan=plan)
