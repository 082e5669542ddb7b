"""Child of test_fit.py:
test_a_plan_for_another_precision_or_remat_is_refused_and_build_scope_obeys_it.
"""

from child import emit

import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import keras
import numpy as np
from factories import detector_cnn as build


from memfit.planning import Plan
def plan(precision, remat=None):
    return Plan(batch_size=8, micro_batches=2, micro_batch_size=4, precision=precision,
                remat=remat, peak_bytes=None, step_seconds=None,
                budget=memfit.Budget.from_size("1GiB"), margin=0.05)
x = np.zeros((8, 16, 16, 3), "float32")
y = np.zeros((8, 4), "float32")
out = {}
def attempt(name, model, p):
    try:
        h = memfit.fit(model, x, y, batch_size=8, verbose=0, plan=p)
        out[name] = {"micro_batches": list(h.memfit.micro_batches.values())}
    except memfit.MemfitError as exc:
        out[name] = {"error": str(exc)}
attempt("mixed_plan_float32_model", build(), plan("mixed_float16"))
attempt("remat_plan_plain_model", build(), plan("float32", "larger_than"))
for p in (plan("mixed_float16"), plan("float32", "larger_than")):
    with p.build_scope():
        model = build()
    attempt(f"built_for_{p.precision}_{p.remat}", model, p)
    out[f"policy_after_{p.precision}"] = keras.mixed_precision.dtype_policy().name
with plan("mixed_bfloat16").build_scope():
    mixed = build()
attempt("float32_plan_mixed_model", mixed, plan("float32"))
# The old spelling, a plan as micro_batches: still followed, with a DeprecationWarning.
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    h = memfit.fit(build(), x, y, batch_size=8, verbose=0, micro_batches=plan("float32"))
out["deprecated"] = {
    "micro_batches": list(h.memfit.micro_batches.values()),
    "warned": [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)],
}
emit(out)
