"""Child of test_recovery_leak.py: a step shaped like grappler's rewritten sum, run into a real
OOM three times; `clear` (an argument) says whether memfit cleans up between tries.
"""

from child import arguments, emit

clear = arguments()["clear"]
import memfit  # noqa: F401  (first: applies MEMFIT_MEMORY before TensorFlow is imported)
import tensorflow as tf
from memfit.backend import tf as tfb

NAME = "AddOpsRewrite_add/tmp_var"


@tf.function
def step(rows):
    acc = tf.raw_ops.TemporaryVariable(shape=[1024, 1024], dtype=tf.float32, var_name=NAME)
    acc = tf.raw_ops.Assign(ref=acc, value=tf.zeros([1024, 1024]))
    with tf.control_dependencies([acc]):
        big = tf.ones(tf.stack([rows, 1024]))  # 4 KiB a row
    acc = tf.raw_ops.AssignAdd(ref=acc, value=tf.zeros([1024, 1024]) + tf.reduce_sum(big))
    return tf.raw_ops.DestroyTemporaryVariable(ref=acc, var_name=NAME)[0, 0]


def in_use():
    return tf.config.experimental.get_memory_info("CPU:0")["current"]


step(tf.constant(1))  # traced and run once: what it keeps (constants) is resident from here
resident = in_use()
tries = []
for _ in range(3):
    try:
        step(tf.constant(16384))  # 64 MiB at once, over the 48 MiB budget: a real OOM
        tries.append(["ran", in_use() - resident])
    except tf.errors.OpError as exc:
        tries.append([type(exc).__name__, in_use() - resident])
    if clear:
        tfb.clear_step_resources()
    try:
        step(tf.constant(1))
        tries.append(["small ran", in_use() - resident])
    except tf.errors.OpError as exc:
        tries.append(["small " + type(exc).__name__, in_use() - resident])
emit(tries)
