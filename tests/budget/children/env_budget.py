"""Child of test_emulate.py::test_environment_variable_emulates_on_import."""

from child import emit

import memfit
import tensorflow as tf
try:
    tf.zeros((64 * 1024 * 1024,))             # 256 MiB
    outcome = "allocated"
except tf.errors.ResourceExhaustedError:
    outcome = "oom"
emit({"outcome": outcome, "budget": memfit.Budget.from_device().usable_bytes})
