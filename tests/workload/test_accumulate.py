"""AccumulatingStep: K micro-batches' gradients sum to the whole batch's, applied once.

A Dense model of a few units, a batch of 5 (so most K split it unevenly), and a reference
computed plainly with one `tf.GradientTape` over the whole batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from memfit.errors import MemfitError
from memfit.workload.accumulate import AccumulatingStep, _unpack

keras = tf.keras


def _model(optimizer: Any = "sgd") -> Any:
    keras.utils.set_random_seed(3)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, activation="tanh")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _batch(size: int = 5) -> tuple[Any, Any]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((size, 3)).astype(np.float32)
    y = rng.standard_normal((size, 2)).astype(np.float32)
    return tf.constant(x), tf.constant(y)


def _full_batch(model: Any, x: Any, y: Any) -> tuple[float, list[np.ndarray]]:
    """The whole batch's mean squared error and its gradients, in one tape."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    return float(loss), [g.numpy() for g in grads]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_micro_batch_gradients_sum_to_the_full_batch_gradients(k: int) -> None:
    model = _model()
    x, y = _batch()
    loss, expected = _full_batch(model, x, y)
    before = [v.numpy() for v in model.trainable_variables]
    step = AccumulatingStep(model)
    grads = step.gradients((x, y), k)
    assert step.connected == [0, 1, 2, 3]
    assert len(grads) == len(expected)
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    # Nothing is applied yet; the loss tracker's mean is the whole batch's loss.
    for v, old in zip(model.trainable_variables, before, strict=True):
        np.testing.assert_array_equal(v.numpy(), old)
    assert int(model.optimizer.iterations) == 0
    assert float(step.results()["loss"]) == pytest.approx(loss, rel=1e-5)


def test_apply_is_one_optimizer_update_with_the_summed_gradients() -> None:
    model = _model(keras.optimizers.SGD(learning_rate=0.1))
    x, y = _batch()
    _, expected = _full_batch(model, x, y)
    before = [v.numpy() for v in model.trainable_variables]
    step = AccumulatingStep(model)
    step.apply(step.gradients((x, y), 3))
    assert int(model.optimizer.iterations) == 1  # once per effective batch, not per micro
    for v, old, g in zip(model.trainable_variables, before, expected, strict=True):
        np.testing.assert_allclose(v.numpy(), old - 0.1 * g, rtol=1e-5, atol=1e-6)


def test_sample_weights_weigh_the_micro_batches_as_the_whole_batch() -> None:
    model = _model()
    x, y = _batch()
    weights = tf.constant([1.0, 0.0, 2.0, 0.5, 1.5])
    with tf.GradientTape() as tape:
        per_sample = tf.reduce_mean(tf.square(model(x, training=True) - y), axis=-1)
        loss = tf.reduce_sum(per_sample * weights) / 5.0  # Keras: sum over batch size
    expected = tape.gradient(loss, model.trainable_variables)
    grads = AccumulatingStep(model).gradients((x, y, weights), 2)
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_a_custom_loss_fn_gets_its_own_tracker_and_unused_variables_are_left_out() -> None:
    model = _model()
    first = model.layers[1]  # only the hidden layer takes part in this loss
    x, y = _batch()

    def loss_fn(xb: Any, yb: Any) -> Any:
        return tf.reduce_mean(tf.square(first(xb)[:, :2] - yb))

    with tf.GradientTape() as tape:
        loss = loss_fn(x, y)
    expected = tape.gradient(loss, first.trainable_variables)
    step = AccumulatingStep(model, loss_fn=loss_fn)
    grads = step.gradients((x, y), 2)
    assert step.connected == [0, 1]  # the hidden kernel and bias; not the output layer's
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert set(step.results()) == {"loss"}
    assert float(step.results()["loss"]) == pytest.approx(float(loss), rel=1e-5)
    assert step.metric_variables() == list(step.loss_tracker.variables)
    output_kernel = model.layers[2].kernel.numpy()
    step.apply(grads)
    np.testing.assert_array_equal(model.layers[2].kernel.numpy(), output_kernel)


def test_a_loss_that_reaches_no_variable_is_an_error() -> None:
    model = _model()
    step = AccumulatingStep(model, loss_fn=lambda xb, yb: tf.reduce_mean(yb))
    with pytest.raises(MemfitError, match="no trainable variable of model .* gets a gradient"):
        step.gradients(_batch(), 2)


def test_restore_metrics_puts_back_what_save_metrics_found() -> None:
    model = _model()
    x, y = _batch()
    step = AccumulatingStep(model)
    loss, _ = _full_batch(model, x, y)
    step.gradients((x, y), 1)
    saved = step.save_metrics()
    step.gradients((x, y + 10.0), 2)  # a much larger loss moves the running mean
    assert float(step.results()["loss"]) > 2 * loss
    step.restore_metrics(saved)
    assert float(step.results()["loss"]) == pytest.approx(loss, rel=1e-5)


def test_trace_builds_the_function_once_per_k_without_running_it() -> None:
    model = _model()
    step = AccumulatingStep(model)
    step.trace(_batch(), 2)
    assert [k for _, k in step._gradient_fns] == [2]
    assert step.connected == [0, 1, 2, 3]
    assert float(step.results()["loss"]) == 0.0  # traced, not run


def test_release_drops_only_the_function_of_those_shapes_and_k() -> None:
    model = _model()
    step = AccumulatingStep(model)
    x, y = _batch()
    step.trace((x, y), 2)
    step.trace((x[:4], y[:4]), 2)
    step.release((x, y), 2)
    assert list(step._gradient_fns) == [(((4, *x.shape[1:]), (4, *y.shape[1:])), 2)]
    assert len(step.gradients((x, y), 2)) == 4  # traced again when asked for again


def test_unpack_takes_x_y_and_sample_weight() -> None:
    assert _unpack(("x",)) == ("x", None, None)
    assert _unpack(("x", "y")) == ("x", "y", None)
    assert _unpack(["x", "y", "w"]) == ("x", "y", "w")
    assert _unpack("x") == ("x", None, None)
