"""Child of test_emulate.py::test_emulate_after_import_but_before_init_still_caps."""

from child import emit

import os
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
import tensorflow as tf
tf.config.list_physical_devices()             # does not initialise the runtime
import memfit
memfit.emulate("32MiB")
try:
    tf.zeros((16 * 1024 * 1024,))             # 64 MiB
    emit("allocated")
except tf.errors.ResourceExhaustedError:
    emit("oom")
