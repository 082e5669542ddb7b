"""Search: the largest batch size that fits a budget, found from measurements.

The package: `finder` (`find_batch_size`, the loop that asks the strategy for a size and the
trials for its peak), `result` (`BatchSearchResult`, `Trial`), `strategy` (pure decisions:
the next size to try, the bracket, the soak's size and rise; the margin's limit is
`memfit.budget.fitting`'s), `trials` (the child processes that measure each size),
`progress` (what `find_batch_size` and `memfit.plan` show as they go) and `child`.
"""

from memfit.budget.fitting import CALIBRATION_GROWTH, DEFAULT_MAX_BATCH, FAR_SHORTFALL, NEAR_STEP
from memfit.checks import DEFAULT_MARGIN
from memfit.search.finder import find_batch_size, search_workload
from memfit.search.result import BatchSearchResult, Trial
from memfit.search.strategy import DEFAULT_SOAK_STEPS, PROBE_BATCH, SOAK_RISE
from memfit.search.trials import CHILD_SAMPLES, TrialRunner

__all__ = [
    "CALIBRATION_GROWTH",
    "CHILD_SAMPLES",
    "DEFAULT_MARGIN",
    "DEFAULT_MAX_BATCH",
    "DEFAULT_SOAK_STEPS",
    "FAR_SHORTFALL",
    "NEAR_STEP",
    "PROBE_BATCH",
    "SOAK_RISE",
    "BatchSearchResult",
    "Trial",
    "TrialRunner",
    "find_batch_size",
    "search_workload",
]
