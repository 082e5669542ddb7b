"""Child of test_workload.py::test_a_batch_on_an_emulated_card_is_held_in_its_allocator."""

from child import emit

import numpy as np
import memfit  # noqa: F401  (applies MEMFIT_MEMORY before TensorFlow is imported)
from memfit.backend import tf as tfb
tf = tfb.import_tf()
import keras
from memfit.workload.workload import Workload
inputs = keras.Input((64, 64, 3))
model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(inputs)))
model.compile("sgd", "mse")
workload = Workload(model)
before = tfb.memory_info("CPU:0")["current"]
x, y = workload.batch(16)
held = tfb.memory_info("CPU:0")["current"] - before
plain = tf.constant(np.ones((16, 64, 64, 3), "float32"))
emit({
    "held": held,
    "plain": tfb.memory_info("CPU:0")["current"] - before - held,
    "batch": sum(int(t.shape.num_elements()) * t.dtype.size for t in (x, y)),
    "same": bool(tf.reduce_all(x == workload.batch(16)[0])),
})
