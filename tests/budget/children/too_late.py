"""Child of test_emulate.py::test_emulate_after_tensorflow_initialised_says_so."""

from child import emit

import tensorflow as tf
tf.zeros((3,))                                # initialises the runtime
import memfit
try:
    memfit.emulate("1GiB")
    emit({"raised": None})
except memfit.EmulationError as exc:
    emit({"raised": str(exc)})
