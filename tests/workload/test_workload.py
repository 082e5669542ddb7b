"""Workload: batch shapes, dtypes and targets for tiny models, data batches, the checks it makes.

test_models.py covers the warning for an uncompiled softmax model; these cover the rest of
`memfit.workload.workload` in this process, with Dense models of a few units.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from memfit.errors import MemfitWarning, WorkloadError
from memfit.workload.workload import (
    SAMPLES_READ,
    Workload,
    count_samples,
    readable_samples,
    shape_list,
)

CHILDREN = Path(__file__).resolve().parent / "children"

keras = tf.keras
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dense(units: int, activation: str | None, features: int = 4) -> Any:
    inputs = keras.Input((features,))
    return keras.Model(inputs, keras.layers.Dense(units, activation=activation)(inputs))


def _quietly(model: Any, **kwargs: Any) -> Workload:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemfitWarning)
        return Workload(model, **kwargs)


# -- shapes -----------------------------------------------------------------------------------
def test_shape_list_wraps_one_shape_and_keeps_several() -> None:
    assert shape_list((224, 224, 3)) == [[224, 224, 3]]
    assert shape_list([(8,), (4, 4)]) == [(8,), (4, 4)]


def test_bad_models_and_shapes_are_refused() -> None:
    with pytest.raises(WorkloadError, match="expected a keras.Model, got str"):
        Workload("model.keras")
    with pytest.raises(WorkloadError, match=r"input shape \(0, 3\) must be positive"):
        Workload(_dense(2, None), input_shape=(0, 3))
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(WorkloadError, match="has no known input shape"):
        Workload(unbuilt)


def test_an_unbuilt_model_is_built_for_the_given_input_shape() -> None:
    model = keras.Sequential([keras.layers.Dense(2)])
    work = _quietly(model, input_shape=(3,))
    assert model.built
    assert work.sample_shapes() == [(3,)]
    x, y = work.batch(4)
    assert tuple(x.shape) == (4, 3) and tuple(y.shape) == (4, 2)


def test_undefined_input_dimensions_need_an_input_shape() -> None:
    inputs = keras.Input((None, 2))
    pooled = keras.layers.GlobalAveragePooling1D()(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(pooled))
    with pytest.raises(WorkloadError, match="undefined dimensions"):
        _quietly(model).batch(2)
    x, y = _quietly(model, input_shape=(6, 2)).batch(2)
    assert tuple(x.shape) == (2, 6, 2) and tuple(y.shape) == (2, 1)


# -- compiling and synthetic targets ----------------------------------------------------------
@pytest.mark.parametrize(
    ("activation", "units", "loss"),
    [
        ("softmax", 3, "sparse_categorical_crossentropy"),
        ("sigmoid", 1, "binary_crossentropy"),
        (None, 2, "mean_squared_error"),
        ("softmax", 1, "mean_squared_error"),  # one unit: no classes to choose from
    ],
)
def test_an_uncompiled_model_gets_a_loss_from_its_output(
    activation: str | None, units: int, loss: str
) -> None:
    with pytest.warns(MemfitWarning, match="is not compiled"):
        work = Workload(_dense(units, activation))
    assert work.compiled_with == {"optimizer": "adam", "loss": loss}


def test_a_compiled_model_keeps_its_optimizer_and_loss() -> None:
    model = _dense(2, None)
    model.compile(optimizer="sgd", loss="mae")
    optimizer = model.optimizer
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemfitWarning)
        work = Workload(model)
    assert work.compiled_with is None
    assert model.optimizer is optimizer and model.loss == "mae"


def test_sparse_targets_are_class_indices_and_inputs_are_fixed_normal_floats() -> None:
    work = _quietly(_dense(3, "softmax"))
    x, y = work.batch(5)
    assert (tuple(x.shape), x.dtype) == ((5, 4), tf.float32)
    assert (tuple(y.shape), y.dtype) == ((5,), tf.int32)
    expected_x = np.random.default_rng(0).standard_normal((5, 4), dtype=np.float32)
    expected_y = np.random.default_rng(1).integers(0, 3, (5,))
    np.testing.assert_array_equal(x.numpy(), expected_x)
    np.testing.assert_array_equal(y.numpy(), expected_y)
    again_x, again_y = work.batch(5)  # the same batch each time
    np.testing.assert_array_equal(again_x.numpy(), x.numpy())
    np.testing.assert_array_equal(again_y.numpy(), y.numpy())


def test_categorical_binary_and_regression_targets() -> None:
    categorical = _dense(3, "softmax")
    categorical.compile("adam", "categorical_crossentropy")
    _, y = Workload(categorical).batch(6)
    assert (tuple(y.shape), y.dtype) == ((6, 3), tf.float32)
    np.testing.assert_array_equal(y.numpy().sum(axis=1), np.ones(6))
    assert set(np.unique(y.numpy())) <= {0.0, 1.0}

    _, y = _quietly(_dense(2, "sigmoid")).batch(50)
    assert (tuple(y.shape), y.dtype) == ((50, 2), tf.float32)
    assert set(np.unique(y.numpy())) == {0.0, 1.0}

    _, y = _quietly(_dense(2, None)).batch(50)
    values = y.numpy()
    assert (values.shape, y.dtype) == ((50, 2), tf.float32)
    assert values.min() >= 0.0 and values.max() < 1.0


def test_several_inputs_and_outputs_get_one_tensor_each_and_their_bytes_add_up() -> None:
    floats = keras.Input((3,), name="floats")
    ids = keras.Input((2, 2), dtype="int32", name="ids")
    joined = keras.layers.Concatenate()(
        [floats, keras.layers.Flatten()(keras.ops.cast(ids, "float32"))]
    )
    model = keras.Model(
        [floats, ids], [keras.layers.Dense(2)(joined), keras.layers.Dense(5)(joined)]
    )
    model.compile("adam", ["mse", "sparse_categorical_crossentropy"])
    work = Workload(model)
    assert work.sample_shapes() == [(3,), (2, 2)]
    (x_floats, x_ids), (y_first, y_second) = work.batch(4)
    assert (tuple(x_floats.shape), x_floats.dtype) == ((4, 3), tf.float32)
    assert (tuple(x_ids.shape), x_ids.dtype) == ((4, 2, 2), tf.int32)
    assert not x_ids.numpy().any()  # integer inputs are zeros (valid ids for any vocabulary)
    assert (tuple(y_first.shape), y_first.dtype) == ((4, 2), tf.float32)
    assert (tuple(y_second.shape), y_second.dtype) == ((4,), tf.int32)
    # Inputs 4 * (3 + 4) numbers, outputs 4 * (2 + 5), 4 bytes each.
    assert work.synthetic_batch_bytes(4) == 4 * (3 + 4) * 4 + 4 * (2 + 5) * 4


# -- data -------------------------------------------------------------------------------------
def _ragged_data() -> Any:
    """Samples of 1, 4, 2 and 4 numbers; targets of 1, 1, 1 and 3."""
    xs = [[1.0], [1.0, 2.0, 3.0, 4.0], [1.0, 2.0], [5.0, 6.0, 7.0, 8.0]]
    ys = [[0.0], [1.0], [2.0], [3.0, 3.0, 3.0]]

    def gen() -> Any:
        yield from zip(xs, ys, strict=True)

    spec = (tf.TensorSpec((None,), tf.float32), tf.TensorSpec((None,), tf.float32))
    return tf.data.Dataset.from_generator(gen, output_signature=spec)


def _sequence_model() -> Any:
    inputs = keras.Input((None,))
    pooled = keras.layers.GlobalAveragePooling1D()(keras.ops.expand_dims(inputs, -1))
    model = keras.Model(inputs, keras.layers.Dense(1)(pooled))
    model.compile("adam", "mse")
    return model


def test_data_batches_pad_to_the_largest_and_worst_case_takes_the_largest_first() -> None:
    work = Workload(_sequence_model(), data=_ragged_data())
    assert work.synthetic_batch_bytes(2) is None
    x, y = work.batch(2)  # the first two samples, padded
    np.testing.assert_array_equal(x.numpy(), [[1, 0, 0, 0], [1, 2, 3, 4]])
    np.testing.assert_array_equal(y.numpy(), [[0], [1]])

    worst = Workload(_sequence_model(), data=_ragged_data(), worst_case=True)
    assert worst.ranked_samples() == [3, 1, 2, 0]  # most inputs, then most targets
    assert worst.largest_sample() == {"index": 3, "input_shapes": [[4]], "target_shapes": [[3]]}
    x, y = worst.batch(2)  # samples 1 and 3, in dataset order
    np.testing.assert_array_equal(x.numpy(), [[1, 2, 3, 4], [5, 6, 7, 8]])
    np.testing.assert_array_equal(y.numpy(), [[1, 0, 0], [3, 3, 3]])
    x, _ = worst.batch(6)  # more than the dataset holds: repeated
    assert tuple(x.shape) == (6, 4)


def test_bad_data_is_refused() -> None:
    model = _sequence_model()
    with pytest.raises(WorkloadError, match="data must be a tf.data.Dataset"):
        Workload(model, data=[(1.0, 2.0)]).batch(1)
    only_x = tf.data.Dataset.from_tensor_slices(np.zeros((3, 2), np.float32))
    with pytest.raises(WorkloadError, match=r"must yield \(x, y\)"):
        Workload(model, data=only_x).batch(1)
    empty = _ragged_data().take(0)
    with pytest.raises(WorkloadError, match="data is empty"):
        Workload(model, data=empty, worst_case=True).batch(1)


def test_an_empty_dataset_is_refused_without_worst_case() -> None:
    empty = _ragged_data().take(0)
    with pytest.raises(WorkloadError, match="data is empty"):
        Workload(_sequence_model(), data=empty).batch(1)


def _endless() -> Any:
    """A Python generator that never ends: a dataset of unknown length that never stops."""

    def gen() -> Any:
        i = 0
        while True:
            yield [float(i)], [0.0]
            i += 1

    spec = (tf.TensorSpec((None,), tf.float32), tf.TensorSpec((None,), tf.float32))
    return tf.data.Dataset.from_generator(gen, output_signature=spec)


@pytest.mark.timeout(120)  # a dataset counted element by element would hang here
def test_datasets_of_infinite_or_unknown_length_are_read_up_to_samples_read() -> None:
    assert count_samples(tf.data.Dataset.range(5)) == 5
    assert count_samples(tf.data.Dataset.range(5).repeat()) is None  # never read
    assert count_samples(tf.data.Dataset.range(9).filter(lambda i: i % 2 == 0)) == 5
    assert count_samples(tf.data.Dataset.range(50).filter(lambda i: i >= 0), limit=10) is None
    assert count_samples(_endless()) is None
    finite = tf.data.Dataset.range(2 * SAMPLES_READ)
    assert readable_samples(finite) is finite  # a known length is read whole
    for dataset in (tf.data.Dataset.range(3).repeat(), _endless()):
        read = readable_samples(dataset).reduce(np.int64(0), lambda n, *_: n + 1)
        assert int(read) == SAMPLES_READ


@pytest.mark.timeout(120)
def test_worst_case_on_a_dataset_that_repeats_for_ever_picks_among_its_first_samples() -> None:
    worst = Workload(_sequence_model(), data=_ragged_data().repeat(), worst_case=True)
    assert worst.samples_read == SAMPLES_READ
    ranked = worst.ranked_samples()
    assert len(ranked) == SAMPLES_READ
    assert ranked[:3] == [3, 7, 11]  # the largest sample of each pass
    assert worst.largest_sample()["input_shapes"] == [[4]]
    x, y = worst.batch(2)
    np.testing.assert_array_equal(x.numpy(), [[5, 6, 7, 8], [5, 6, 7, 8]])
    np.testing.assert_array_equal(y.numpy(), [[3, 3, 3], [3, 3, 3]])
    first = Workload(_sequence_model(), data=_endless())  # the first samples, never ending
    x, _ = first.batch(3)
    np.testing.assert_array_equal(x.numpy(), [[0], [1], [2]])
    assert (
        Workload(
            _sequence_model(), data=tf.data.Dataset.from_tensor_slices(([[1.0]], [[1.0]]))
        ).samples_read
        is None
    )  # a dataset of known length is read whole


# -- steps ------------------------------------------------------------------------------------
def test_fit_dataset_hides_the_batch_size_and_yields_the_batch_itself() -> None:
    work = _quietly(_dense(2, None))
    x, y = work.batch(3)
    dataset = work.fit_dataset((x, y))
    spec_x, spec_y = dataset.element_spec
    assert spec_x.shape.as_list() == [None, 4] and spec_y.shape.as_list() == [None, 2]
    for got_x, got_y in dataset.take(2):
        np.testing.assert_array_equal(got_x.numpy(), x.numpy())
        np.testing.assert_array_equal(got_y.numpy(), y.numpy())


def test_state_variables_hold_weights_and_optimizer_state_once_each() -> None:
    model = _dense(2, None)
    model.compile(optimizer="adam", loss="mse")
    work = Workload(model)
    model.optimizer.build(model.trainable_variables)
    state = work.state_variables()
    assert len({id(v) for v in state}) == len(state)
    ids = {id(v) for v in state}
    assert {id(v) for v in model.variables} <= ids
    assert {id(v) for v in model.optimizer.variables} <= ids
    # Kernel and bias; Adam's iterations, learning rate and two slots per weight.
    assert len(model.variables) == 2
    assert len(state) >= 2 + 2 + 2 * 2


def test_a_batch_on_an_emulated_card_is_held_in_its_allocator() -> None:
    # A GPU holds the batch a step reads; on a CPU TensorFlow keeps a NumPy array outside its
    # allocator, so on a card emulated there the batch is copied in (`tfb.hold_on_device`).

    from helpers import run_isolated

    got = run_isolated(
        CHILDREN / "held_batch.py",
        env={"MEMFIT_MEMORY": "1GiB", "PYTHONPATH": TESTS},
    )
    assert got["plain"] == 0  # what TensorFlow does with a NumPy array on a CPU
    assert got["batch"] <= got["held"] <= got["batch"] + 2 * 256
    assert got["same"]
