"""Child of test_measure.py: MobileNetV2 steps measured under the emulated budget."""

from child import emit

import numpy as np
import memfit
import keras
from memfit.backend import tf as tfb

model = keras.applications.MobileNetV2(weights=None, input_shape=(128, 128, 3), classes=100)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.optimizer.build(model.trainable_variables)
weights_before = [np.array(v.numpy()) for v in model.weights]
opt_before = [np.array(v.numpy()) for v in model.optimizer.variables]
baseline = tfb.memory_info("CPU:0")["current"]

results = [memfit.measure(model, b).to_dict() for b in (1, 2, 4, 128)]

weights_same = all(
    np.array_equal(a, v.numpy()) for a, v in zip(weights_before, model.weights, strict=True)
)
opt_same = all(
    np.array_equal(a, v.numpy())
    for a, v in zip(opt_before, model.optimizer.variables, strict=True)
)
params = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
emit({
    "results": results,
    "weights_same": weights_same,
    "opt_same": opt_same,
    "iterations": int(model.optimizer.iterations.numpy()),
    "param_bytes": params * 4,
    "weight_bytes": sum(int(np.prod(v.shape)) * 4 for v in model.weights),
    "baseline": baseline,
    "after": tfb.memory_info("CPU:0")["current"],
})
