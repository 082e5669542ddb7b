"""Child of test_measure.py::test_isolated_measurement_of_a_model_object_and_spec."""

from child import emit

import memfit
import keras
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256),
                          keras.layers.Dense(10, activation="softmax")])
model.compile("adam", "sparse_categorical_crossentropy")
r1 = memfit.measure(model, 16, isolated=True, budget="128MiB", repeats=1)
r2 = memfit.measure("keras.applications.MobileNetV2", 64, isolated=True,
                    budget="96MiB", input_shape=(64, 64, 3), repeats=1)
emit({"r1": r1.to_dict(), "r2": r2.to_dict()})
