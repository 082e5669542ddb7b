"""Child of test_emulate.py:
test_a_child_process_that_inherits_the_emulation_sets_up_its_own_region.
"""

from child import emit

import subprocess
import sys
import memfit  # noqa: F401  (emulates MEMFIT_MEMORY, sets variables)
child = "\n".join([
    "import memfit, tensorflow as tf",
    "first = tf.raw_ops.Empty(shape=[100, 1 << 20], dtype=tf.uint8, init=False)",
    "del first",
    "try:",
    "    second = tf.raw_ops.Empty(shape=[200, 1 << 20], dtype=tf.uint8, init=False)",
    "    print('allocated')",
    "except tf.errors.ResourceExhaustedError:",
    "    print('oom')",
])
proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
emit(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:])
