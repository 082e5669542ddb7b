"""Child of test_fit.py::test_bad_input_is_one_clear_memfit_error."""

from child import emit

import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import keras
import numpy as np
from factories import detector_cnn as build
import tensorflow as tf
x = np.zeros((8, 8, 8, 3), "float32")
y = np.zeros((8, 4), "float32")
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
