"""Child of test_fit.py::test_one_sample_per_micro_batch_still_too_big_is_a_clear_error."""

from child import emit

import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np
from factories import detector_cnn as build

x = np.zeros((2, 512, 512, 3), "float32")
y = np.zeros((2, 4), "float32")
try:
    memfit.fit(build(), x, y, batch_size=2, verbose=0)
    emit({"error": None})
except memfit.MemfitError as exc:
    emit({"error": str(exc)})
