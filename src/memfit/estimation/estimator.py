"""`memfit.estimate`: predict a training step's peak memory without running it.

Trace once, replay many: the step is traced once, for batches of any size; twice the batch
is that trace sized again (`TracedStep.at_batch`), and the other batch sizes (and the
search for the largest batch that fits) are made from the two
(`memfit.backend.tf_graph.at_batch_size`). Grappler runs on a thread while the next
what-if's step is traced (`memfit.backend.tf_trace.start_trace`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from memfit.backend.tf_kernels import assume_threads
from memfit.budget.budget import Budget, as_budget, emulated_budget
from memfit.checks import (
    Options,
    check_batch_size,
    check_positive_int,
    takes_options,
)
from memfit.console.progress import Progress, shows_progress
from memfit.errors import WorkloadError
from memfit.estimation.bounds import RUN_STEPS, SAMPLES
from memfit.estimation.helper import WhatIfQueue
from memfit.estimation.replayed import (
    apply_bound,
    check_choice,
    described,
    estimate_step,
    load_workload,
    region_bytes,
    replayed,
    sample_shapes,
    start_range,
    start_trace,
    step_errors,
    young_collections,
)
from memfit.estimation.result import Estimate
from memfit.estimation.simulate import replay
from memfit.estimation.what_ifs import (
    begin_trace,
    helper_arguments,
    make_what_ifs,
    queue_order,
    what_if_variants,
)
from memfit.workload.spec import KERAS_REMAT_MODES, PRECISIONS
from memfit.workload.workload import InputShape, Workload


@takes_options("samples", "threads")
@shows_progress(
    "on_progress", lambda a: f"estimating batch {a['batch_size']}", "phase", deprecated=True
)
def estimate(
    model: Any,
    batch_size: int,
    *,
    input_shape: InputShape | None = None,
    optimizer: Any = None,
    loss: Any = None,
    data: Any = None,
    budget: Budget | str | int | None = None,
    precision: str | None = None,
    remat: str | None = None,
    classes: int | None = None,
    what_ifs: bool = False,
    steps: int = RUN_STEPS,
    on_progress: Callable[[str], None] | None = None,
    step_fn: Callable[[Any, Any], Any] | None = None,
    overrides: Any = (),
    params: Any = (),
    progress: Progress = None,
    options: Options | None = None,
) -> Estimate:
    """Predict the peak memory of one training step of `model` at `batch_size`, without running.

    The training step (the model's own `train_step`: forward, loss, gradients and optimizer
    update) is traced for a batch described by shapes only, and replayed through a model of
    TensorFlow's executor and BFC allocator; no tensor of the step is ever allocated. The
    prediction is comparable with `memfit.measure(...).peak_bytes`.

    Args:
        model: a Keras model, or a MODEL string (`.keras` file, `package.module:factory`,
            `keras.applications.Name`). Precision, remat and the what-ifs that rebuild the
            model need a factory or built-in name.
        batch_size: samples in the step (at least 1).
        input_shape: one sample's shape, for models with undefined input dimensions.
        optimizer: optimizer to compile with (default: the model's own, else Adam).
        loss: loss to compile with (default: the model's own, else chosen from the output).
        data: a `tf.data.Dataset` of unbatched `(x, y)` samples (for dict targets).
        budget: a budget to compare against and find the largest batch for.
        precision: Keras dtype policy to build the model under (`mixed_float16`, ...).
        remat: `keras.RematScope` mode to build the model under.
        classes: classes of a built-in model.
        what_ifs: also predict other batch sizes, the largest batch for the budget, memfit's
            recompute, and (for MODEL strings that build the model) mixed precision, SGD vs
            Adam and a smaller input resolution; those rebuilt models are traced in a helper
            process beside this one where one can help (see `memfit.estimation.helper`).
        steps: steps of training the high bound covers (default 200, a run; 5 gives the
            highest of 5 steps after a warm-up, as `--check` measures).
        on_progress: deprecated, `progress=callable` instead.
        step_fn: a step spec: `step_fn(data, optimizer) -> logs`, the whole training step of
            `model` (Keras 3 or tf_keras) with `optimizer`; `data` is then a callable
            `batch_size -> batch` or an unbatched `tf.data.Dataset`. `tf.function(step_fn)`
            is traced at `batch_size` instead of `model.train_step`. No what-ifs.
        overrides: for a `garden:` task (`model="garden:EXPERIMENT"`), `key.path=value`
            strings applied to its experiment config; its `train_step` is traced.
        params: for a `garden:` task, YAML/JSON files or texts applied to its config first.
        progress: show the phases on stderr (a spinner): None (default) when stderr is a
            terminal or a notebook, True / False, or a callable that receives each
            phase's text instead (`memfit.console.progress`).
        options: the knobs few runs change (`memfit.Options`): `samples`, the other
            processes replayed for the high bound (`Estimate.high_bytes`; default 4, 0
            leaves it out; what-ifs scale their high bound by the base step's
            high-to-likely ratio instead of sampling again); `threads`, the `(inter, intra)`
            thread counts of the machine to estimate for (default: what TensorFlow uses in
            this process: as set, else one per CPU it may run on).

    Returns:
        An `Estimate`.

    Example:
        ```python
        est = memfit.estimate("mypkg.models:build", 256)   # a MODEL string, or a Keras model
        print(est, est.breakdown)
        ```
    """
    arguments = dict(locals())  # the helper process rebuilds the workload from them
    check_batch_size(batch_size)
    options = options or Options()
    samples = options.get("samples", SAMPLES)
    threads = options.threads
    steps = check_positive_int(steps, "steps")
    report = on_progress or (lambda _text: None)
    if step_fn is not None or (isinstance(model, str) and model.startswith("garden:")):
        if precision or remat or what_ifs:
            raise WorkloadError(
                "a step spec (a Model Garden task's train_step) is estimated as it is: no "
                "precision, remat or what-ifs; change its config with overrides (--set) instead"
            )
        return estimate_step(
            model,
            batch_size,
            optimizer,
            step_fn,
            data,
            overrides,
            params,
            budget,
            samples,
            steps,
            threads,
            report,
        )
    check_choice("precision", precision, PRECISIONS)
    check_choice("remat", remat, KERAS_REMAT_MODES)
    rebuild = isinstance(model, str) and not model.endswith((".keras", ".h5"))
    if (precision or remat) and not rebuild:
        raise WorkloadError(
            "precision and remat need the model rebuilt: give a factory "
            "(package.module:factory) or a built-in name instead of a model object or file"
        )
    resolved = as_budget(budget) or emulated_budget()

    def build(
        precision: str | None = precision,
        remat: str | None = remat,
        optimizer: Any = optimizer,
        input_shape: InputShape | None = input_shape,
    ) -> Workload:
        target = model
        if isinstance(model, str):
            target = load_workload(model, input_shape, classes, precision, remat)
        return Workload(target, optimizer=optimizer, loss=loss, input_shape=input_shape, data=data)

    def sampled(done: int, total: int) -> None:
        report(f"the high bound: process {done} of {total} replayed")

    assumed = assume_threads(*threads) if threads else contextlib.nullcontext()
    with assumed, young_collections(), contextlib.ExitStack() as stack:
        started = time.perf_counter()
        queue = None
        if what_ifs:
            # A helper process starts now (TensorFlow's import there overlaps this trace)
            # and takes the what-ifs that rebuild the model beside this process.
            queue = WhatIfQueue(helper_arguments(arguments) if rebuild else None)
            stack.callback(queue.close)
        report(f"tracing the step at batch {batch_size}")
        with step_errors():
            workload = build()
        variants = what_if_variants(sample_shapes(workload), optimizer) if rebuild else []
        if queue is not None:
            queue.add(queue_order(variants))
        tracing = time.perf_counter()  # the trace's time leaves the model's build out
        with step_errors():
            pending_base = start_trace(workload, int(batch_size))
        traced = time.perf_counter() - tracing
        early = None
        if queue is not None:
            # The first what-if's step is traced while grappler works on this one (on its
            # thread), instead of after waiting for it.
            report("what if: recompute sqrt")
            early = begin_trace(
                lambda: workload, {"batch_size": int(batch_size), "recompute": "sqrt"}
            )
        waiting = time.perf_counter()
        graph = pending_base.result()
        traced += time.perf_counter() - waiting
        if queue is None:
            result = replayed(
                graph, workload, traced, started, samples=samples, steps=steps, on_sample=sampled
            )
        else:
            # The samples replay in a child while this process goes on with the what-ifs;
            # the what-ifs' high bounds wait for them (`bounded`).
            pending = start_range(graph, samples, here=0) if samples > 0 else None
            try:
                likely = replay(graph, region_bytes=region_bytes())
                result = described(likely, graph, workload, traced, started)
                result.budget, result.steps = resolved, steps

                def bounded() -> Estimate:
                    if pending is not None and result.high_bytes is None:
                        apply_bound(result, pending, sampled)
                    return result

                result.what_ifs = make_what_ifs(
                    workload,
                    result,
                    pending_base,
                    build,
                    variants,
                    queue,
                    report,
                    bounded,
                    early,
                )
                bounded()
            except BaseException:
                if pending is not None:
                    pending.cancel()
                raise
        result.budget = resolved
    result.estimate_seconds = time.perf_counter() - started
    return result
