"""Child of test_tf_keras_doctor.py: `memfit.doctor()` with and without TF_USE_LEGACY_KERAS,
and whether finding out imported tf_keras or the Model Garden, or initialised TensorFlow.
"""

from child import emit

import os
import sys
import memfit
from memfit.backend import tf as tfb

os.environ.pop("TF_USE_LEGACY_KERAS", None)
plain = memfit.doctor().to_dict()
os.environ["TF_USE_LEGACY_KERAS"] = "1"
switched = memfit.doctor().to_dict()
emit({"plain": plain, "switched": switched, "initialised": tfb.is_initialized(),
      "imported": sorted(m for m in ("tf_keras", "official") if m in sys.modules)})
