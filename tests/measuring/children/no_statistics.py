"""Child of test_measure.py::test_measure_without_memory_statistics_explains_the_fix."""

from child import emit

import tensorflow as tf  # noqa: F401  (imported before memfit, as the test had it)
import keras
import memfit
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("adam", "mse")
try:
    memfit.measure(model, 2)
    emit(None)
except memfit.MeasurementError as exc:
    emit(str(exc))
