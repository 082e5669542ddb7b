"""Child of test_doctor.py::test_doctor_reports_keras_2_absent_and_a_legacy_switch_without_it."""

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
      "imported": "tf_keras" in sys.modules})
