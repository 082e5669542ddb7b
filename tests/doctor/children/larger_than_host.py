"""Child of test_doctor.py::test_emulate_warns_in_python_when_the_card_is_larger_than_the_host."""

from child import emit

import warnings
import memfit
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    memfit.emulate("999999999TiB")
emit([str(w.message) for w in caught])
