"""Child of test_emulate.py: 100 MiB, freed, then 200 MiB under a 256 MiB card emulated with
or without memory growth (the argument `growth`).
"""

from child import arguments, emit

growth = arguments()["growth"]
import memfit
memfit.emulate("256MiB", memory_growth=growth)
import tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(1)   # still allowed: not initialised
MIB = 1024 * 1024
first = tf.raw_ops.Empty(shape=[100, MIB], dtype=tf.uint8, init=False)
del first                                     # 100 MiB freed
try:
    second = tf.raw_ops.Empty(shape=[200, MIB], dtype=tf.uint8, init=False)
    outcome = "allocated"
except tf.errors.ResourceExhaustedError:
    outcome = "oom"
import os
emit({"outcome": outcome, "growth": os.environ["MEMFIT_MEMORY_GROWTH"]})
