"""Child of test_recompute.py::test_measure_with_recompute_lowers_the_peak."""

from child import emit

import memfit
import keras
keras.utils.set_random_seed(0)
inputs = keras.Input((64, 64, 3))
h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
for _ in range(8):
    s = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    s = keras.layers.Conv2D(32, 3, padding="same")(s)
    h = keras.layers.Add()([h, s])
h = keras.layers.GlobalAveragePooling2D()(h)
model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(h))
model.compile("sgd", "sparse_categorical_crossentropy")
plain = memfit.measure(model, 16, repeats=2)
segmented = memfit.measure(model, 16, repeats=2, recompute="sqrt")
emit([plain.step_bytes, segmented.step_bytes, "call" in model.__dict__])
