"""Planning: the fastest way to train a target effective batch within a budget, checked to hold.

A configuration is a precision policy, a recompute (`keras.RematScope`) mode and K, the number
of micro-batches `memfit.fit` splits each batch into. The planner predicts each
configuration's peak with `memfit.estimate` (nothing run) to find, per precision and recompute
mode, the smallest K predicted to fit the budget with margin; configurations that cannot beat
one already found (more time per step for no fewer micro-batches) are not estimated. Only the
finalists are measured in fresh child processes (the very step `memfit.fit` runs), the fastest
that fits is chosen, and it is confirmed: 20 steps of `memfit.fit` in a fresh process without
a recovery, else the next candidate is taken.

The package's parts: `plans` (`plan`, the public entry), `strategy` (pure
decisions: the K worth trying, a first guess of K, rough costs and expected times, what is
near enough the limit to measure), `trials` (the child processes that estimate, measure and
confirm), `planner` (the flow that asks the strategy what to run and the trials to run it)
and `child` (the estimating process). `Candidate` and `Plan`, plain data that `memfit.fit`
takes, live in `memfit.training.plan`. The module is `memfit.planning`; `memfit.plan` is the
function.
"""

from memfit.checks import DEFAULT_MARGIN
from memfit.planning.plans import DEFAULT_CONFIRM_STEPS, plan, plan_workload
from memfit.training.plan import TASK_PRECISION, Candidate, Plan

__all__ = [
    "DEFAULT_CONFIRM_STEPS",
    "DEFAULT_MARGIN",
    "TASK_PRECISION",
    "Candidate",
    "Plan",
    "plan",
    "plan_workload",
]

