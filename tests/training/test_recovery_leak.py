"""What a failed step leaves inside TensorFlow: grappler's temporary accumulators after an OOM.

Grappler's memory optimizer rewrites a large sum of gradients into a `TemporaryVariable`
accumulator that only a `DestroyTemporaryVariable` later in the step frees; a step that runs
out of memory in between leaves it in the eager context's per-step container (see
docs/design/recovery.md). Each test runs in a child with its own emulated budget.
"""

from __future__ import annotations

from helpers import run_isolated

# A step shaped like the rewritten sum: a 4 MiB accumulator is created and filled, then a
# tensor larger than the whole budget is allocated (a real OOM) before the accumulator is
# destroyed. `clear` says whether memfit cleans up between tries.
LEAKY_STEP = """
import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
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
"""


def _leaky(clear: bool) -> list:
    return run_isolated(f"clear = {clear}\n" + LEAKY_STEP, env={"MEMFIT_MEMORY": "48MiB"})


def test_an_oom_between_accumulator_and_destroy_leaks_without_clearing() -> None:
    tries = _leaky(clear=False)
    # The first OOM leaves the 4 MiB accumulator; every later run finds it there.
    assert tries[0] == ["ResourceExhaustedError", 4 * 2**20], tries
    assert tries[1][0] == "small AlreadyExistsError", tries
    assert all(held == 4 * 2**20 for _, held in tries), tries


def test_clear_step_resources_frees_the_accumulator_after_each_oom() -> None:
    tries = _leaky(clear=True)
    assert [what for what, _ in tries] == ["ResourceExhaustedError", "small ran"] * 3, tries
    # Bytes in use between steps are back where they were after every failed try.
    assert all(held == 0 for _, held in tries[1::2]), tries
