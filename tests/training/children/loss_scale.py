"""Child of test_fit.py:
test_loss_scale_optimizer_skips_the_whole_update_on_a_non_finite_micro_batch.
"""

from child import emit

import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import keras
import numpy as np
from factories import detector_cnn as build


def weights(model):
    return [w.tolist() for w in model.get_weights()]

keras.mixed_precision.set_dtype_policy("mixed_float16")
rng = np.random.default_rng(7)
x = rng.uniform(size=(8, 16, 16, 3)).astype("float32")
x[6] = 6e4   # overflows float16 in the second micro-batch only
y = rng.uniform(size=(8, 4)).astype("float32")
out = {}
for name in ("keras", "memfit"):
    m = build()
    before = weights(m)
    if name == "keras":
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    else:
        memfit.fit(m, x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, micro_batches=2)
    out[name] = {"changed": weights(m) != before,
                 "scale": float(m.optimizer.dynamic_scale.numpy()),
                 "lso": type(m.optimizer).__name__}
emit(out)
