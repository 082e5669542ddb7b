"""Child of test_measure.py::test_a_trace_that_has_run_is_measured_from_its_first_step."""

from child import emit

import memfit  # noqa: F401  (first: applies MEMFIT_MEMORY)
import keras
import tensorflow as tf  # noqa: F401
from memfit.measuring.measurer import measure_workload
from memfit.workload.workload import Workload
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
model.compile("adam", "mse")
work = Workload(model)
runs = []
for warm_up in (True, False):
    before = int(model.optimizer.iterations.numpy())
    m = measure_workload(work, 8, repeats=2, device="CPU:0", budget=None, exact=False,
                         restore=False, warm_up=warm_up)
    runs.append([int(model.optimizer.iterations.numpy()) - before, len(m.peaks_bytes)])
emit(runs)
