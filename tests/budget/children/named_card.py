"""Child of test_emulate.py::test_emulate_a_named_card."""

from child import emit

import memfit
budget = memfit.emulate(device="T4")
import os
emit({"bytes": budget.usable_bytes, "name": budget.name,
      "limit_mb": os.environ["TF_CPU_BFC_MEM_LIMIT_IN_MB"],
      "onednn": os.environ["TF_ENABLE_ONEDNN_OPTS"]})
