"""Child of test_models.py::test_uncompiled_model_says_which_optimizer_and_loss_were_used."""

from child import emit

import keras


def build():
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(8, 3, activation='relu')(inputs)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(5, activation='softmax')(h))


import warnings
import memfit
from memfit.workload.workload import Workload

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    work = Workload(build())
    builtin = memfit.load_model("keras.applications.MobileNetV2", input_shape=(32, 32, 3))
    quiet = Workload(builtin)
    given = Workload(build(), optimizer="sgd", loss="mean_squared_error")
emit({
    "warnings": [str(w.message) for w in caught if issubclass(w.category, memfit.MemfitWarning)],
    "compiled_with": work.compiled_with,
    "builtin": quiet.compiled_with,
    "given": given.compiled_with,
})
