"""`memfit.plan`: check the arguments, run a `Planner`, and turn its choice into a `Plan`."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from memfit.budget.budget import Budget, as_budgets, emulated_budget, tightest_index
from memfit.budget.fitting import limit_bytes
from memfit.checks import (
    DEFAULT_MARGIN,
    Options,
    check_batch_size,
    check_margin,
    check_positive_int,
    keyword_only,
    takes_options,
)
from memfit.console.progress import Progress, shows_progress
from memfit.errors import MemfitError
from memfit.measuring.isolate import child_spec
from memfit.measuring.replicas import per_replica_batch, replica_count, workload_replica_budget
from memfit.planning.planner import Planner
from memfit.planning.strategy import (
    MAX_CONFIRMATIONS,
    MAX_FINALISTS,
    NEAR_LIMIT,
    REMAT_MODES,
    dividing_k_values,
)
from memfit.planning.trials import CONFIRM_OOM_GRACE
from memfit.training.plan import TASK_PRECISION, Candidate, Plan
from memfit.workload.spec import PRECISIONS, WorkloadSpec

__all__ = [
    "CONFIRM_OOM_GRACE",
    "DEFAULT_CONFIRM_STEPS",
    "DEFAULT_MARGIN",
    "MAX_CONFIRMATIONS",
    "MAX_FINALISTS",
    "NEAR_LIMIT",
    "PRECISIONS",
    "REMAT_MODES",
    "Candidate",
    "Plan",
    "plan",
    "plan_workload",
]

DEFAULT_CONFIRM_STEPS = 20
DEFAULT_PLAN_REPEATS = 1
"""Measured steps per measured candidate after the warm-up."""


@keyword_only("budget")
@takes_options("repeats", "safe_mode", "confirm", "confirm_steps")
@shows_progress(
    "on_candidate",
    lambda a: (
        f"planning batch {a['batch_size']}"
        + (f" for {a['budget']}" if a["budget"] is not None else "")
        + ": estimating, measuring, confirming"
    ),
    "candidate",
    deprecated=True,
)
def plan(
    model: Any,
    batch_size: int,
    *,
    budget: Budget | str | int | None = None,
    margin: float = DEFAULT_MARGIN,
    precisions: Sequence[str] | None = None,
    remat_modes: Sequence[str | None] | None = None,
    input_shape: Any = None,
    data: str | None = None,
    optimizer: str | None = None,
    loss: str | None = None,
    on_candidate: Callable[[Candidate], None] | None = None,
    classes: int | None = None,
    progress: Progress = None,
    replicas: int | None = None,
    strategy: Any = None,
    overrides: Sequence[str] = (),
    params: Sequence[str] = (),
    options: Options | None = None,
) -> Plan:
    """Plan K (micro-batches), precision and recompute for a target effective batch.

    First `memfit.estimate` predicts, in one child process, the peak of the step `memfit.fit`
    runs for each precision and recompute mode, and finds the smallest K predicted to fit the
    budget less the margin. Configurations go from the cheapest per step (float32 without
    recompute on a CPU; mixed precision on a GPU) to the dearest, and one is estimated only
    while it could still need fewer micro-batches than those found. The finalists — when
    several could be the fastest, or a smaller K is predicted near the limit — are measured
    in fresh child processes under the budget, and the fastest that fits is chosen. With
    `Options.confirm` (the default) the choice then trains `confirm_steps` steps of
    `memfit.fit` in a fresh process; if it needs a recovery or peaks over the limit, the next
    fastest is confirmed in turn: the other measured finalists, and the same configuration
    with more micro-batches, its time scaled from the failed one's. A model the estimate
    cannot trace is planned from measurements alone.

    Precision and recompute change how the model is built, so they are planned only for a
    MODEL string that builds it — a factory (`package.module:factory`) or a built-in
    (`keras.applications.ResNet50`); for a model object or a `.keras` file only K is
    planned, and `note` says what a factory would add.

    With several data-parallel replicas (`replicas`, a `strategy`, or one budget per
    replica) `batch_size` is the global batch: each replica holds the whole model and
    optimizer state and trains `batch_size / replicas` samples in K micro-batches, so the
    plan is the single-device plan for that share under the tightest budget less the
    gradient all-reduce's buffer (`memfit.measuring.replicas`).

    Args:
        model: a MODEL string, or a compiled Keras model (saved for the child; K only).
        batch_size: the target effective batch (global, over all replicas).
        budget: the budget (`Budget`, size, or card name), or a list of them, one per
            replica (the tightest decides); default the emulated one.
        margin: share of the budget kept free (default 0.05).
        precisions: dtype policies to consider (default float32, mixed_float16,
            mixed_bfloat16 when the model can be rebuilt; float32 otherwise).
        remat_modes: `keras.RematScope` modes to consider, None meaning no recompute
            (default None, "larger_than", "activations" when the model can be rebuilt).
        input_shape: one sample's shape, for models with undefined inputs.
        data: `package.module:dataset_fn` of unbatched samples (detectors, dict targets).
        optimizer, loss: by name, to compile with (default: the model's own).
        on_candidate: called with a `Candidate` each time it is estimated, measured or
            confirmed (progress displays).
        classes: classes of a built-in model (`keras.applications.Name`).
        progress: a spinner and one line per candidate on stderr, as the CLI shows them;
            default on when stderr is a terminal and no `on_candidate` is given; False turns
            it off, a callable receives each `Candidate` instead (`memfit.console.progress`).
        replicas: data-parallel replicas sharing `batch_size` (default 1, or the strategy's,
            or one per budget given); `batch_size` must be divisible by it.
        strategy: a `tf.distribute` strategy whose `num_replicas_in_sync` gives `replicas`.
        overrides: for a Model Garden task (`model="garden:EXPERIMENT"`), `key.path=value`
            strings applied to its experiment config (`task.model.input_size=[128,128,3]`).
        params: for a Model Garden task, YAML/JSON files or texts applied to its config first.
        options: the knobs few runs change (`memfit.Options`): `repeats`, the measured steps
            per measured candidate after the warm-up (default 1); `safe_mode=False` loads a
            trusted `.keras` file that runs Python code (Lambda layers); `confirm=False`
            answers without training the chosen configuration `confirm_steps` steps
            (default 20) of `memfit.fit` in a fresh process first.

    Returns:
        A `Plan`; build the model in `plan.build_scope()` and pass the plan to
        `memfit.fit(..., plan=plan)`.

    Example:
        ```python
        # A factory: K, precision and recompute for an effective batch of 256 on a T4.
        p = memfit.plan("mypkg.models:build", 256, budget="T4")
        print(p.summary())
        two = memfit.plan("mypkg.models:build", 256, budget=["T4", "L4"])  # 2 replicas, 128 each
        ```
    """
    options = options or Options()
    safe_mode, confirm = options.safe_mode, options.confirm
    repeats = options.get("repeats", DEFAULT_PLAN_REPEATS)
    confirm_steps = options.get("confirm_steps", DEFAULT_CONFIRM_STEPS)
    workload, model = WorkloadSpec.from_arguments(locals())
    return plan_workload(
        workload,
        batch_size,
        budget,
        model=model,
        margin=margin,
        precisions=precisions,
        remat_modes=remat_modes,
        repeats=repeats,
        on_candidate=on_candidate,
        confirm=confirm,
        confirm_steps=confirm_steps,
        replicas=replicas,
        strategy=strategy,
    )


def plan_workload(
    workload: WorkloadSpec,
    batch_size: int,
    budget: Budget | str | int | None = None,
    *,
    model: Any = None,
    margin: float = DEFAULT_MARGIN,
    precisions: Sequence[str] | None = None,
    remat_modes: Sequence[str | None] | None = None,
    repeats: int = DEFAULT_PLAN_REPEATS,
    on_candidate: Callable[[Candidate], None] | None = None,
    confirm: bool = True,
    confirm_steps: int = DEFAULT_CONFIRM_STEPS,
    replicas: int | None = None,
    strategy: Any = None,
) -> Plan:
    """`plan` for a workload given whole (what the CLI runs).

    Args:
        workload: what is trained; its precision and remat are planned, not taken.
        batch_size, budget: as in `plan`.
        model: a Keras model given beside the workload (saved for the children; K only).
        margin, precisions, remat_modes, repeats, on_candidate, confirm, confirm_steps,
            replicas, strategy: as in `plan`.

    Returns:
        A `Plan`.
    """
    # Batches are made of the dataset's largest samples, so the answer holds for all.
    workload = dataclasses.replace(workload, worst_case=workload.data is not None)

    batch_size = check_batch_size(batch_size)
    confirm_steps = check_positive_int(confirm_steps, "confirm_steps")
    check_margin(margin)
    budgets = as_budgets(budget)
    n = replica_count(replicas, strategy, len(budgets))
    per_replica = per_replica_batch(batch_size, n)
    resolved = budgets[tightest_index(budgets)] if budgets else emulated_budget()
    if resolved is None:
        raise MemfitError(
            "no budget to plan for: pass budget= (a size or card), or emulate one with "
            "memfit.emulate() / --memory / --device"
        )
    workload.check_named()
    rebuildable = workload.rebuildable if model is None else False
    note = ""
    if workload.is_task:
        if precisions not in (None, ()) or remat_modes not in (None, ()):
            raise MemfitError(
                "a Model Garden task trains at its config's precision, without memfit's "
                "recompute: plan K alone (no --precision, --remat), and set "
                "runtime.mixed_precision_dtype with --set to plan another precision"
            )
        precisions, remat_modes = [TASK_PRECISION], [None]
        note = (
            "Only K was planned, measured through the task's own train_step "
            "(GuardedStep.from_task): its precision is its config's"
        )
    elif not rebuildable:
        if precisions not in (None, ("float32",), ["float32"]) or remat_modes not in (
            None,
            (None,),
            [None],
        ):
            raise MemfitError(
                "precision and recompute need the model rebuilt: give a factory "
                "(package.module:factory) or a built-in name instead of a model object or file"
            )
        note = (
            "Only K was planned: a model factory (package.module:factory) would let the planner "
            "also try mixed precision and recompute"
        )
    precisions = list(precisions or (PRECISIONS if rebuildable else ("float32",)))
    remat_modes = list(remat_modes or (REMAT_MODES if rebuildable else (None,)))
    configs = [(p, r) for p in precisions for r in remat_modes]
    started = time.perf_counter()
    resolved, buffer = workload_replica_budget(resolved, n, workload, model)
    with tempfile.TemporaryDirectory(prefix="memfit-plan-") as tmp:
        planner = Planner(
            per_replica,
            resolved,
            limit_bytes(resolved.usable_bytes, margin),
            child_spec(workload, model, tmp),
            repeats=repeats,
            on_candidate=on_candidate,
            # A task's step is measured, not estimated, at K that split it equally.
            ks=dividing_k_values(per_replica) if workload.is_task else None,
            estimable=not workload.is_task,
            trainer="GuardedStep.from_task" if workload.is_task else "memfit.fit",
        )
        chosen, how = planner.run(configs, confirm_steps if confirm else 0)
    notes = [n for n in (note, planner.skipped_note()) if n]
    result = Plan(
        batch_size=batch_size,
        micro_batches=chosen.micro_batches if chosen else per_replica,
        micro_batch_size=chosen.micro_batch_size if chosen else 1,
        precision=chosen.precision if chosen else precisions[0],
        remat=chosen.remat if chosen else None,
        peak_bytes=chosen.peak_bytes if chosen else None,
        step_seconds=chosen.step_seconds if chosen else None,
        budget=resolved,
        margin=float(margin),
        candidates=planner.candidates,
        fits=chosen is not None,
        note=". ".join(notes),
        seconds=time.perf_counter() - started,
        confirmed=True if chosen is not None and confirm else False if how else None,
        confirmation=how,
        replicas=n,
        allreduce_bytes=buffer,
    )
    return result
