"""Child of test_fit.py::test_k4_equals_k1_at_the_same_effective_batch."""

from child import emit

import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np
from factories import detector_cnn as build


def weights(model):
    return [w.tolist() for w in model.get_weights()]


rng = np.random.default_rng(3)
x = rng.normal(size=(64, 16, 16, 3)).astype("float32")
y = rng.uniform(size=(64, 4)).astype("float32")
runs = {}
for k in (1, 4):
    m = build()
    h = memfit.fit(m, x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, micro_batches=k)
    runs[k] = {"w": weights(m), "it": int(m.optimizer.iterations), "loss": h.history["loss"],
               "summary": h.memfit.to_dict()}
plain = build()
hp = plain.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
emit({"runs": runs, "plain": weights(plain), "plain_loss": hp.history["loss"]})
