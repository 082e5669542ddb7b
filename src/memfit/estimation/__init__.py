"""Estimate: predict a training step's peak memory without running it, with a breakdown.

The step's graph is traced for a batch described only by its shapes and replayed through a
model of TensorFlow's executor and BFC allocator. The predicted quantity is what
`memfit.measure` reports as `peak_bytes`: the allocator's peak during a training step after
one warm-up step, weights, optimizer state and the batch included.

The package:
- `estimator`: `estimate`, the public entry (`memfit.estimate`);
- `result`: the `Estimate` it returns;
- `replayed`: the trace and its replays (`estimate_workload`: a built workload's step);
- `what_ifs`: the same step with another precision, recompute, optimizer or input size;
- `largest`: the largest batch whose estimated step fits a budget (`largest_batch`);
- `child`, `helper`: the what-ifs' helper process;
- `simulate`, `step`, `order`, `bfc`: the replay itself (executor order and allocator);
- `bounds`, `background`: the high bound and its samples on the other core.
"""

from memfit.estimation.estimator import estimate
from memfit.estimation.largest import largest_batch
from memfit.estimation.replayed import estimate_workload
from memfit.estimation.result import CATEGORIES, OPTIMIZERS, Estimate
from memfit.estimation.what_ifs import ENV_HELPER, estimate_variant, what_if_figures

__all__ = [
    "CATEGORIES",
    "ENV_HELPER",
    "OPTIMIZERS",
    "Estimate",
    "estimate",
    "estimate_variant",
    "estimate_workload",
    "largest_batch",
    "what_if_figures",
]
