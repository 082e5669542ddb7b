"""Child of test_measure.py::test_measure_from_a_dataset_of_samples."""

from child import emit

import memfit
import keras
import tensorflow as tf
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
model.compile("adam", "mse")
ds = tf.data.Dataset.from_tensor_slices((tf.ones((5, 16)), tf.zeros((5, 4))))
r = memfit.measure(model, 12, data=ds, repeats=1)
emit({"shapes": r.input_shapes, "oom": r.oom})
