"""Child of test_import.py::test_import_without_tensorflow_names_the_extra."""

from child import emit

import sys
sys.modules["tensorflow"] = None            # as if TensorFlow were not installed
import memfit
print(memfit.parse_size("1GiB"))
try:
    memfit.emulate("1GiB")
    from memfit.backend import tf as tfb
    tfb.import_tf()
    emit(None)
except memfit.BackendMissingError as exc:
    emit(str(exc))
