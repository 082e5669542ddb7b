"""Child of test_measure.py::test_measure_restores_rng_batchnorm_and_metrics_state."""

from child import emit

import numpy as np
import memfit
import keras
inputs = keras.Input((32, 32, 3))
x = keras.layers.Conv2D(8, 3)(inputs)
x = keras.layers.BatchNormalization()(x)
x = keras.layers.Dropout(0.5)(x)
x = keras.layers.GlobalAveragePooling2D()(x)
outputs = keras.layers.Dense(10, activation="softmax")(x)
model = keras.Model(inputs, outputs)
model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])


def state():
    return [np.array(v.numpy()) for v in model.variables]


before = state()
r = memfit.measure(model, 8, repeats=2)
after = state()
# Reading a weight after the restore must not copy it: a sparse restore
# (scatter_update) would leave every variable copy-on-read for good.
from memfit.backend import tf as tfb
big = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2048),
                        keras.layers.Dense(2048)])
big.compile("sgd", "mse")
memfit.measure(big, 2, repeats=1)
kernel = big.layers[1].kernel.value
held = tfb.memory_info("CPU:0")["current"]
tfb.reset_peak("CPU:0")
read = kernel.read_value()
copied = tfb.memory_info("CPU:0")["peak"] - held
emit({"same": all(np.array_equal(a, b) for a, b in zip(before, after, strict=False)),
      "n": len(before), "oom": r.oom, "peak": r.peak_bytes, "copied": copied,
      "kernel_bytes": int(read.shape[0] * read.shape[1] * 4)})
