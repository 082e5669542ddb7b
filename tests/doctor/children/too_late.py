"""Child of test_doctor.py::test_doctor_flags_an_emulation_that_came_too_late."""

from child import emit

import os
import tensorflow as tf
tf.zeros((1,))
# The emulation variables say 1 GiB, but the allocator was created without a cap.
os.environ["MEMFIT_EMULATED_BYTES"] = str(2**30)
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
import memfit
emit(memfit.doctor().to_dict())
