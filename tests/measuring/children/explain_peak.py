"""Child of test_explain.py::test_measure_explain_lists_the_measured_peak."""

from child import emit

import memfit
import factories
model = factories.small_cnn()
m = memfit.measure(model, 16, repeats=2, explain=True)
emit({"peak": m.peak_bytes, "explanation": m.to_dict()["explanation"]})
