"""The largest batch whose estimated step fits a budget, searched on replays of one trace."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from memfit.budget.budget import Budget, as_budget, emulated_budget
from memfit.budget.fitting import largest_fitting, limit_bytes
from memfit.checks import check_batch_size, check_positive_int
from memfit.errors import WorkloadError
from memfit.estimation.bounds import RUN_STEPS, SAMPLES
from memfit.estimation.replayed import (
    Steps,
    load_workload,
    replayed,
    start_trace,
    step_errors,
    young_collections,
)
from memfit.estimation.result import Estimate
from memfit.workload.workload import InputShape, Workload


def largest_for(
    steps: Steps,
    known: dict[int, int],
    budget: Budget,
    scale: float,
    run: float,
    *,
    margin: float = 0.0,
    resident: int = 0,
) -> tuple[int | None, int | None, int | None]:
    """The largest batch whose high bound fits `budget`: the answer a card can be rented on.

    `known` holds likely-order peaks already replayed (size -> bytes); `scale` and `run` are
    the base step's ratios of its high bound and of its peak to its likely order's peak.
    With `margin`, that share of the step's own bytes (the high bound less `resident`, what
    is in use before the step) stays free as well. Returns the size, its peak and its high
    bound (all None when no size fits).
    """
    limit = limit_bytes(budget.usable_bytes, margin, resident) / scale
    size, order = largest_fitting(
        lambda b: steps.estimate(b).order_peak_bytes or 0,
        known,
        int(limit),
        max_probes=6,
    )
    if order is None:
        return None, None, None
    return size, int(order * run), int(order * scale)


def largest_batch(
    model: Any,
    batch_size: int,
    budget: Budget | str | int | None = None,
    *,
    input_shape: InputShape | None = None,
    data: Any = None,
    samples: int = SAMPLES,
    steps: int = RUN_STEPS,
    margin: float = 0.05,
    on_progress: Callable[[str], None] | None = None,
) -> Estimate | None:
    """The largest batch whose high bound fits `budget`, estimated from one trace of the step.

    The step is traced once at `batch_size` (say, a batch that ran out of memory) and
    replayed there with its high bound; other sizes are the same trace sized again, searched
    as the what-if "largest batch for the budget" is (`memfit.estimate(..., what_ifs=True)`),
    against the budget less the base step's high-to-likely allowance. Nothing of the step is
    allocated: it runs in a process whose device just ran out of memory, and leaves the
    model, its optimizer and their variables as they were.

    Args:
        model: a compiled Keras model (or a MODEL string, as `estimate` takes).
        batch_size: the batch to trace at (at least 1).
        budget: the budget to fit (default: the emulated card's).
        input_shape: one sample's shape, for models with undefined input dimensions.
        data: a `tf.data.Dataset` of unbatched samples (for dict targets, or a model's own
            sample shapes).
        samples: processes replayed for the base step's high bound (0: the likely peak).
        steps: steps of training the high bound covers (default 200: a run).
        margin: share of the step's own bytes (its high bound less what is in use before
            it: weights, optimizer state) also kept free, for what varies from step to step.
        on_progress: called with a short text at each phase.

    Returns:
        The estimate at the largest batch that fits (its `batch_size`, `peak_bytes`,
        `high_bytes` and `budget`; the breakdown at that size), or None when one sample does
        not fit.

    Example:
        ```python
        est = memfit.estimation.largest_batch(model, 128, "400MiB")
        print(est.batch_size if est else "one sample does not fit", est)
        ```
    """
    check_batch_size(batch_size)
    steps = check_positive_int(steps, "steps")
    resolved = as_budget(budget) or emulated_budget()
    if resolved is None:
        raise WorkloadError(
            "the largest batch needs a budget: pass one (a size such as 400MiB, or a card)"
        )
    progress = on_progress or (lambda _text: None)
    started = time.perf_counter()
    with young_collections():
        progress(f"tracing the step at batch {batch_size}")
        with step_errors():
            if isinstance(model, str):
                model = load_workload(model, input_shape, None, None, None)
            workload = Workload(model, input_shape=input_shape, data=data)
            pending = start_trace(workload, int(batch_size))
            graph = pending.result()
        traced = time.perf_counter() - started
        progress("replaying it, with its high bound")
        base = replayed(graph, workload, traced, started, samples=samples, steps=steps)
        order = base.order_peak_bytes or base.peak_bytes
        scale = (base.high_bytes or order) / order if order else 1.0
        run = base.peak_bytes / order if order else 1.0
        sized = Steps(workload, pending, graph)
        one = base if batch_size == 1 else sized.estimate(1)
        known = {int(batch_size): order, 1: one.order_peak_bytes or 0}
        progress(f"the largest batch for {resolved.name}")
        size, peak, high = largest_for(
            sized, known, resolved, scale, run, margin=margin, resident=one.resident_bytes
        )
        if size is None:
            return None
        result = base if size == batch_size else sized.estimate(size)
        result.peak_bytes, result.high_bytes, result.steps = int(peak or 0), high, steps
    result.budget = resolved
    result.estimate_seconds = time.perf_counter() - started
    return result
