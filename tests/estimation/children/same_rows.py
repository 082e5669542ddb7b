"""Child of test_estimate_helper.py: the what-ifs made in this process and by the helper process."""

from child import emit

import time
import memfit
import os
from memfit.estimation.what_ifs import ENV_HELPER, helper_arguments, what_if_variants
from memfit.estimation.helper import WhatIfQueue

# Every what-if made in this process (no helper).
os.environ[ENV_HELPER] = "0"
alone = memfit.estimate("factories:small_cnn", 8, what_ifs=True, options=memfit.Options(samples=0))
rows = {row["change"]: row for row in alone.what_ifs}

# The same what-ifs made by the helper process only (this process takes none).
del os.environ[ENV_HELPER]
variants = what_if_variants([(64, 64, 3)], None)
queue = WhatIfQueue(helper_arguments({"model": "factories:small_cnn", "batch_size": 8}))
queue.add(variants)
deadline = time.monotonic() + 300
while len(queue.made) < len(variants) and time.monotonic() < deadline:
    time.sleep(0.1)
made = queue.finish()
# With the helper, the estimate is the same, whichever process made each row.
helped = memfit.estimate("factories:small_cnn", 8, what_ifs=True, options=memfit.Options(samples=0))
emit({
    "rows": rows, "made": made, "variants": [change for change, _ in variants],
    "helped": helped.what_ifs, "alone": alone.what_ifs,
})
