"""Child of test_measure.py::test_measure_refuses_bad_arguments."""

from child import emit

import memfit
import keras
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
messages = []
for bad in (0, -3, 2.5, "8"):
    try:
        memfit.measure(model, bad)
    except memfit.MemfitError as exc:
        messages.append(str(exc))
try:
    memfit.measure("not a model object", 4)
except memfit.MemfitError as exc:
    messages.append(str(exc))
emit(messages)
