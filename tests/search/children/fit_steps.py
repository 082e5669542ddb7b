"""Child of test_search.py's searches: 20 steps of plain `model.fit` at a batch size, in a
fresh process, as a user trains with the answer. Arguments: the saved model's path, the batch.
"""

import json
import sys
import numpy as np
import memfit  # noqa: F401 - first: applies MEMFIT_MEMORY before TensorFlow is imported
import keras
from memfit.backend import tf as tfb
import tensorflow as tf
from memfit.workload.workload import Workload
model, b = keras.models.load_model(sys.argv[1]), int(sys.argv[2])
x, y = np.random.rand(b, 64, 64, 3).astype("float32"), np.zeros(b, "int32")
# 20 steps of plain model.fit on a dataset of the batch, its batch dimension undefined as a
# pipeline's `batch` leaves it. (A pipeline that batches here would add its own buffers,
# which on a GPU live in host memory and here would count in the emulated card.)
ds = Workload(model).fit_dataset((tf.constant(x), tf.constant(y))).take(20)
del x, y
tfb.reset_peak("CPU:0")  # not the emulation's one-region reservation
try:
    model.fit(ds, epochs=1, verbose=0)
    oom = False
except Exception as exc:
    if not tfb.is_oom(exc):
        raise
    oom = True
peak = tfb.memory_info("CPU:0")["peak"]
print(json.dumps({"batch_size": b, "oom": oom, "peak_bytes": peak}))
