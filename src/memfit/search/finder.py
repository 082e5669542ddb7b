"""`memfit.find_batch_size`: ask the strategy for a size, the trials for its peak, until done."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from memfit.budget.budget import Budget, as_budgets, emulated_budget, tightest_index
from memfit.budget.fitting import (
    limit_bytes,
    next_guess,
)
from memfit.checks import (
    DEFAULT_MARGIN,
    Options,
    check_margin,
    check_positive_int,
    check_soak_steps,
    keyword_only,
    takes_options,
)
from memfit.console.progress import Progress, shows_progress
from memfit.errors import MemfitError, WorkloadError
from memfit.measuring.replicas import replica_count, workload_replica_budget
from memfit.search import strategy
from memfit.search.result import BatchSearchResult, Trial
from memfit.search.strategy import DEFAULT_SOAK_STEPS, SOAK_RISE
from memfit.search.trials import IN_PROCESS_MODEL, TrialRunner
from memfit.sizes import format_size
from memfit.workload.spec import WorkloadSpec
from memfit.workload.workload import InputShape


@keyword_only("budget")
@takes_options("isolated", "soak_steps", "safe_mode")
@shows_progress(
    "on_trial",
    lambda a: (
        "finding the largest batch size"
        + (f" for {a['budget']}" if a["budget"] is not None else "")
    ),
    "trial",
    deprecated=True,
)
def find_batch_size(
    model: Any,
    *,
    budget: Budget | str | int | None = None,
    max_batch: int | None = None,
    margin: float = DEFAULT_MARGIN,
    data: Any = None,
    input_shape: InputShape | None = None,
    optimizer: Any = None,
    loss: Any = None,
    on_trial: Callable[[Trial], None] | None = None,
    classes: int | None = None,
    progress: Progress = None,
    replicas: int | None = None,
    strategy: Any = None,
    overrides: Sequence[str] = (),
    params: Sequence[str] = (),
    options: Options | None = None,
) -> BatchSearchResult:
    """Find the largest batch size whose training step fits the budget, from measurements.

    Peaks measured at batch 1 and 4 give the step's memory per sample; each next size is
    predicted from the peaks so far: far from the limit a little short of it and at most 3x
    further (peaks are not linear in the batch: a long extrapolation can be far off), near it
    one short of the largest size predicted to fit (at most 1/8 further) and then up one at a
    time, until a size that fits and one that fails are next to each other (or within the
    margin). A surprise peak or an OOM only narrows the bracket. The trials share one trace
    with a relaxed batch dimension (traced once, while the child starts) and run one after
    the other in one child process, which leaves their updates in place (the allocator sees
    what training would); each is one measured step, after a warm-up step in a fresh
    process. A step that runs out of memory is answered as soon as it stalls in TensorFlow's
    allocator retry (`AllocatorStallWatch`), and the next trial runs in a spare child started
    when the sizes got near the limit. Every trial runs the train function `model.fit`
    builds, fed as `model.fit` feeds a dataset (see `memfit.measure`). The size found then
    trains `soak_steps` more steps in a fresh process (a soak), whose peak must stay within
    the limit the margin sets, which confirms it: a step's peak rises over the first steps
    of training, and a fresh process's limit moves by a size or two from one process to the
    next, for which the margin leaves room; a size whose soak runs out of memory gives way
    to the next smaller size predicted to hold, soaked in turn.

    The model in this process is never touched: the child loads the MODEL string
    (`Options(isolated=True)`) or a saved copy of the model (and of the dataset's largest
    samples). A model that cannot be saved is measured in this process (`decided_in ==
    "this_process"`): every variable is restored bit for bit after each trial (see
    `memfit.measure`), and after an OOM this process's allocator is fragmented and may fail
    sizes a fresh process fits.

    Args:
        model: a compiled Keras model, or (isolated) a MODEL string.
        budget: the budget to fit (`Budget`, size, or card name). In-process: default the
            emulated budget; it must not exceed what the device really gives. Isolated: each
            trial's child emulates it.
        max_batch: never try more than this.
        margin: share of the step's own bytes (its peak less what is resident before it)
            kept free under the budget, 0 <= margin < 1 (default 0.05).
        data: a `tf.data.Dataset` of unbatched `(x, y)` samples (isolated: a
            `package.module:dataset_fn` string); trials then use its largest samples, and
            the dataset's size caps the batch.
        input_shape: shape of one sample for models with undefined input dimensions.
        optimizer: optimizer to compile with (default: the model's own, else Adam).
        loss: loss to compile with (default: the model's own).
        on_trial: called with each `Trial` as it completes (progress displays).
        classes: classes of a built-in MODEL string.
        progress: a spinner and one line per trial on stderr, as the CLI shows them; default
            on when stderr is a terminal and no `on_trial` is given; False turns it off, a
            callable receives each `Trial` instead (`memfit.console.progress`).
        replicas: data-parallel replicas (default 1, or the strategy's, or one per budget
            when `budget` is a list). Each replica holds the whole model and optimizer state
            and runs the step on its share of the global batch, so the search finds the
            largest per-replica batch under the tightest budget less the gradient
            all-reduce's buffer (`memfit.measuring.replicas`); `max_batch` is per replica.
        strategy: a `tf.distribute` strategy whose `num_replicas_in_sync` gives `replicas`.
        overrides: for a Model Garden task (`model="garden:EXPERIMENT"`), `key.path=value`
            strings applied to its experiment config (`task.model.input_size=[128,128,3]`).
        params: for a Model Garden task, YAML/JSON files or texts applied to its config first.
        options: the knobs few runs change (`memfit.Options`): `isolated`, when `model` is
            a MODEL string the child loads, so this process needs no TensorFlow state at
            all; `soak_steps`, the measured training steps the size found must hold for,
            from a fresh start, before it is the answer (default 20; 0 answers from the
            search's trials); `safe_mode=False` lets the child load a trusted `.keras` file
            (or the saved copy of a model) that runs Python code, such as a Lambda layer.

    Returns:
        A `BatchSearchResult`; `batch_size == 0` when even batch 1 does not fit. With
        several replicas `batch_size` is each replica's and `global_batch_size` the global.

    Example:
        ```python
        memfit.emulate("128MiB")                   # or memfit.emulate(device="T4")
        model = build_model()                      # compiled
        result = memfit.find_batch_size(model)
        print(result.batch_size, result.summary())
        two = memfit.find_batch_size(model, replicas=2)     # 2 data-parallel replicas
        print(two.batch_size, two.global_batch_size)
        ```
    """
    options = options or Options()
    isolated, safe_mode = options.isolated, options.safe_mode
    soak_steps = options.get("soak_steps", DEFAULT_SOAK_STEPS)
    if not isolated and isinstance(model, str):
        raise WorkloadError(IN_PROCESS_MODEL)
    workload, model = WorkloadSpec.from_arguments(locals())
    return search_workload(
        workload,
        budget,
        model=model,
        isolated=isolated,
        max_batch=max_batch,
        margin=margin,
        soak_steps=soak_steps,
        on_trial=on_trial,
        replicas=replicas,
        strategy=strategy,
    )


def search_workload(
    workload: WorkloadSpec,
    budget: Budget | str | int | None = None,
    *,
    model: Any = None,
    isolated: bool = True,
    max_batch: int | None = None,
    margin: float = DEFAULT_MARGIN,
    soak_steps: int = DEFAULT_SOAK_STEPS,
    on_trial: Callable[[Trial], None] | None = None,
    replicas: int | None = None,
    strategy: Any = None,
) -> BatchSearchResult:
    """`find_batch_size` for a workload given whole (what the CLI runs).

    Args:
        workload: what is trained; an isolated search's child loads its MODEL string.
        budget: as in `find_batch_size`.
        model: a Keras model given beside the workload (saved for the child, or measured in
            this process without `isolated`).
        isolated, max_batch, margin, soak_steps, on_trial, replicas, strategy: as in
            `find_batch_size`.

    Returns:
        A `BatchSearchResult`.
    """
    # Batches are made of the dataset's largest samples, so the answer holds for all.
    workload = dataclasses.replace(workload, worst_case=workload.data is not None)
    margin = check_margin(margin)
    if max_batch is not None:
        max_batch = check_positive_int(max_batch, "max_batch")
    soak_steps = check_soak_steps(soak_steps)
    budgets = as_budgets(budget)
    n = replica_count(replicas, strategy, len(budgets))
    resolved = budgets[tightest_index(budgets)] if budgets else emulated_budget()
    if resolved is None:
        raise MemfitError(
            "no budget to search against: pass budget= (a size or card), or emulate one with "
            "memfit.emulate() / --memory / --device"
        )
    started = time.perf_counter()
    resolved, buffer = workload_replica_budget(resolved, n, workload, model)
    runner = TrialRunner(workload, resolved, model, isolated)
    try:
        result = _search(runner, resolved, max_batch, margin, soak_steps, on_trial)
    finally:
        runner.close()
    result.replicas, result.allreduce_bytes = n, buffer
    result.seconds = time.perf_counter() - started
    return result


def _search(
    run: TrialRunner,
    budget: Budget,
    max_batch: int | None,
    margin: float,
    soak_steps: int,
    on_trial: Callable[[Trial], None] | None,
) -> BatchSearchResult:
    # The margin is kept on the step's own bytes once the first trial has measured what is
    # resident before a step; until then, on the whole budget.
    limit = limit_bytes(budget.usable_bytes, margin)
    cap, capped_by = strategy.search_cap(max_batch, run.dataset_size)
    result = BatchSearchResult(
        batch_size=0,
        margin=margin,
        peak_bytes=None,
        budget=budget,
        limit_bytes=limit,
        worst_case_samples=run.worst_case,
        largest_sample=run.largest_sample,
        samples_read=run.samples_read,
        decided_in="child_process" if run.in_child else "this_process",
    )
    peaks: dict[int, int] = {}  # sizes that fit -> measured peak
    on_step = False  # whether the limit keeps the margin on the step's bytes yet

    def trial(size: int, predicted: int | None, soak: int = 0) -> bool:
        nonlocal limit, on_step
        start = time.perf_counter()
        m, fresh, warmed_up = run.measure(size, repeats=soak or 1, soak=bool(soak))
        # The runner may have read the resident bytes already (a child's resident mark);
        # else the measurement's.
        if run.resident_bytes is None:
            run.resident_bytes = m.resident_bytes
        if not on_step and run.resident_bytes is not None:
            on_step = True
            limit = limit_bytes(budget.usable_bytes, margin, run.resident_bytes)
            result.limit_bytes = limit
        ok = not m.oom and m.peak_bytes is not None and m.peak_bytes <= limit
        seconds = time.perf_counter() - start
        t = Trial(
            size,
            m.oom,
            m.peak_bytes,
            seconds,
            predicted,
            ok,
            fresh=fresh,
            steps=(soak or 1) + (1 if warmed_up else 0),
            soak=bool(soak),
        )
        result.trials.append(t)
        if ok:
            peaks[size] = int(m.peak_bytes)  # type: ignore[arg-type]
        if on_trial is not None:
            on_trial(t)
        return ok

    # Batch 1, a probe a few samples away (batch 2's peak differs from batch 1's by little
    # more than the allocator's jitter), then sizes predicted from the peaks: far from the
    # limit a little short of it and at most 3x further, near it right at it, until a size
    # that fits and one that fails are next to each other (or within the margin).
    if not trial(1, None):
        result.stopped_by = "nothing_fits"
        result.failing_batch_size = 1
        result.peak_bytes = result.trials[0].peak_bytes
        _explain_if_weights_alone_exceed(run, budget)
        return result
    lo, hi = 1, None  # largest size that fits, smallest that fails
    if cap >= 2:
        probe = strategy.probe_size(cap)
        if trial(probe, None):
            lo = probe
        else:
            hi = probe
    while True:
        if lo >= cap:
            result.stopped_by = capped_by
            break
        if strategy.bracket_closed(lo, hi, margin):
            break
        guess, predicted, near = next_guess(peaks, lo, hi, cap, limit)
        # An OOM ends this process's trials: when one is likely and more trials would follow
        # it, get a fresh process ready meanwhile (not for lo + 1, whose OOM ends the search).
        if strategy.spare_worth_starting(guess, lo, hi, near):
            run.expect_oom()
        if trial(guess, predicted):
            lo = guess
        else:
            hi = guess
    # The soak: a size trains more steps, back to back, in a fresh process under the budget,
    # and passes when its peak over them stays within the limit. The first soak goes to the
    # largest size whose one-step trial peak, raised by SOAK_RISE, is predicted to stay within
    # the limit; a soak that peaks over the limit (or runs out of memory) shows its own rise
    # over the trial peak, and the next soak goes to the largest smaller size predicted to
    # stay within the limit with that rise.
    rise = SOAK_RISE
    # At least batch 1, which fitted its trial: only a soak may say it does not train.
    size = strategy.first_soak_size(peaks, lo, limit, rise) if soak_steps else lo
    while soak_steps and size >= 1:
        run.fresh_process()
        if trial(size, strategy.predicted_peak(peaks, size, rise), soak=soak_steps):
            lo = size
            break
        hi = size
        soaked = result.trials[-1].peak_bytes
        rise = strategy.soak_rise(rise, soaked, strategy.predicted_peak(peaks, size))
        size = strategy.next_soak_size(peaks, size, limit, rise)
    if soak_steps:
        lo = max(size, 0)
    if lo < 1:
        result.stopped_by = "nothing_fits"
        result.failing_batch_size = 1
        result.peak_bytes = result.trials[-1].peak_bytes
        return result
    result.soak_steps = soak_steps
    result.batch_size = lo
    result.peak_bytes = peaks[lo]
    result.failing_batch_size = hi
    # The answer rests on the last trial of each size of the bracket.
    for size in (lo, hi):
        last = next((t for t in reversed(result.trials) if t.batch_size == size), None)
        if last is not None:
            last.deciding = True
    return result


def _explain_if_weights_alone_exceed(run: TrialRunner, budget: Budget) -> None:
    """Batch 1 failing because the weights and optimizer slots alone exceed the budget."""
    resident = run.resident_bytes
    if resident is not None and resident >= budget.usable_bytes:
        raise MemfitError(
            f"the model's weights and optimizer state alone take {format_size(resident)}, more "
            f"than the {format_size(budget.usable_bytes)} budget ({budget.name}); no batch size "
            f"can fit. Use a card with more memory, a smaller model, or an optimizer with less "
            f"state (SGD keeps none, Adam two copies of the weights)"
        )
