"""Child of test_plan.py::test_plan_splits_a_batch_that_does_not_fit_and_fit_follows_it."""

from child import emit

import memfit
import numpy as np
p = memfit.plan("factories:small_cnn", 64, budget="150MiB", precisions=["float32"],
                remat_modes=[None])
m = memfit.load_model("factories:small_cnn")
x = np.zeros((64, 64, 64, 3), "float32")
y = np.zeros((64,), "int64")
h = memfit.fit(m, x, y, batch_size=64, epochs=1, verbose=0, plan=p)
emit({"plan": p.to_dict(), "summary": p.summary(), "fit": h.memfit.to_dict()})
