"""Child of test_fit.py::test_mirrored_strategy_two_cpus_recovers_and_replicas_agree."""

from child import emit

import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np
from factories import box_shards
from factories import detector_cnn as build


import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    m = build()
x, y = box_shards((128,))[0]
h = memfit.fit(m, x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
agree = all(
    np.array_equal(v.value.values[0].numpy(), v.value.values[1].numpy())
    for v in m.trainable_variables
)
emit({"summary": h.memfit.to_dict(), "agree": agree, "it": int(m.optimizer.iterations.numpy()),
      "replicas": strategy.num_replicas_in_sync})
