"""Child of test_fit.py::test_seed_scenario_plain_fit_dies_memfit_fit_recovers; with `mode`
"plain" Keras' own fit runs first.
"""

from child import arguments, emit

import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
from factories import box_dataset
from factories import detector_cnn as build


def weights(model):
    return [w.tolist() for w in model.get_weights()]


import tensorflow as tf

mode = arguments()["mode"]
out = {}
if mode == "plain":
    m = build()
    try:
        m.fit(box_dataset(), epochs=2, verbose=0)
        out["plain"] = "completed"
    except tf.errors.ResourceExhaustedError:
        out["plain"] = "ResourceExhaustedError"
m = build()
h = memfit.fit(m, box_dataset(), epochs=2, verbose=0)
out.update(weights=weights(m), iterations=int(m.optimizer.iterations),
           epochs=len(h.history["loss"]), summary=h.memfit.to_dict())
emit(out)
