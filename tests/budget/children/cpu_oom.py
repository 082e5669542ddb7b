"""Child of test_emulate.py::test_emulate_caps_cpu_memory_with_a_real_oom."""

from child import emit

import memfit
budget = memfit.emulate("64MiB")
import tensorflow as tf
small = tf.zeros((4 * 1024 * 1024,))          # 16 MiB: fits
try:
    big = tf.zeros((32 * 1024 * 1024,))       # 128 MiB: over the budget
    outcome = "allocated"
except tf.errors.ResourceExhaustedError:
    outcome = "oom"
more = tf.zeros((4 * 1024 * 1024,))           # the process goes on after the OOM
emit({"outcome": outcome, "bytes": budget.usable_bytes, "source": budget.source,
      "peak": tf.config.experimental.get_memory_info("CPU:0")["peak"]})
