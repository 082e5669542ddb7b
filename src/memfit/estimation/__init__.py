"""Estimate: predict a training step's peak memory without running it, with a breakdown.

The step's graph is traced (forward, loss, gradients, optimizer update; see
`memfit.backend.tf_trace`) for a batch described only by its shapes, and replayed through a
model of TensorFlow's executor and BFC allocator (`memfit.estimation.simulate`,
`memfit.estimation.bfc`). The predicted quantity is what `memfit.measure` reports as
`peak_bytes`: the allocator's peak during a training step after one warm-up step, weights,
optimizer state and the batch included.

Trace once, replay many: the step is traced once, for batches of any size; twice the batch
is that trace sized again (`TracedStep.at_batch`), and the other batch sizes (and the
search for the largest batch that fits) are made from the two
(`memfit.backend.tf_graph.at_batch_size`). Grappler runs on a thread while the next
what-if's step is traced (`memfit.backend.tf_trace.start_trace`). The high bound's samples
replay in a forked child on the other core (`memfit.estimation.background`), and the garbage
collector leaves alone what exists before the estimate and what each trace keeps
(`gc.freeze`): see docs/design/estimate.md, "How it is fast".
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from memfit.backend.attribution import KINDS
from memfit.backend.tf_kernels import assume_threads
from memfit.budget.budget import Budget, as_budget, emulated_budget, emulated_memory_growth
from memfit.budget.fitting import largest_fitting, limit_bytes
from memfit.checks import check_batch_size, check_positive_int, check_threads
from memfit.errors import MemfitError, WorkloadError, one_line
from memfit.estimation.background import PendingRange, start_peak_range
from memfit.estimation.bounds import RUN_STEPS, SAMPLES, run_rise
from memfit.estimation.helper import WhatIfQueue
from memfit.estimation.simulate import Replay, replay
from memfit.serialize import json_dict, suffixed
from memfit.sizes import format_size
from memfit.workload.spec import KERAS_REMAT_MODES, PRECISIONS
from memfit.workload.workload import InputShape, Workload

CATEGORIES = KINDS  # the breakdown's kinds, shared with `measure --explain`
OPTIMIZERS = ("adam", "sgd")


@dataclass
class Estimate:
    """The predicted peak memory of one training step, and what makes it up.

    Attributes:
        batch_size: samples in the step.
        peak_bytes: predicted allocator peak of the step (weights, optimizer state and the
            batch included), comparable with `Measurement.peak_bytes`: the likely executor
            order's peak, and under several inter-op threads, where each step's order is a
            race, the highest step of the processes replayed (that order's and the sampled
            ones': a run's peak is its highest step).
        breakdown: bytes live at the peak by category (`weights`, `optimizer_slots`,
            `other_state`, `inputs`, `activations` kept for the backward pass, `gradients`,
            `temporaries`, `workspace` of kernels, and `fragmentation`: what the BFC
            allocator hands out beyond the requests, whole chunks it would not split); sums
            to `peak_bytes`.
        per_layer: `[{"layer", "bytes", ...categories}]`, largest first.
        peak_moment: when the peak happens: `phase` (forward/backward/update), `layer`, `op`.
        what_ifs: other configurations and their predicted peaks.
        resident_bytes: predicted bytes in use before the step (weights, optimizer state, batch).
        activations_kept_bytes: bytes the forward pass leaves for the backward pass (live as
            the backward pass starts), whether or not the peak comes then.
        budget: the budget compared against, if any.
        input_shapes: shape of one sample per input.
        high_bytes: the high bound of the peak over a run of `steps` steps: the highest of
            the processes TensorFlow could run (other executor orders, other allocator
            histories), plus an allowance, raised by how a run's highest step rises over its
            steps (see `memfit.estimation.bounds`). `peak_bytes` is the likely (typical)
            step's peak; a card is safe to rent for the high bound.
        steps: steps of training `high_bytes` covers.
        step_high_bytes: the high bound of the highest of 5 steps after a warm-up in a fresh
            process (what `memfit estimate --check` measures), before the run's rise.
        sample_peaks_bytes: the peak of each sampled process behind `high_bytes`.
        order_peak_bytes: the likely executor order's peak alone (equal to `peak_bytes`
            but where a sampled process peaked higher under several inter-op threads; None
            for an estimate not made by a replay).
        trace_seconds: seconds spent tracing the step, grappler included (0 when it was
            made from the traces at two other batch sizes).
        estimate_seconds: seconds the estimate took, from loading the model to the last
            what-if.
    """

    batch_size: int
    peak_bytes: int
    breakdown: dict[str, int]
    per_layer: list[dict[str, Any]] = field(default_factory=list)
    peak_moment: dict[str, str] = field(default_factory=dict)
    what_ifs: list[dict[str, Any]] = field(default_factory=list)
    resident_bytes: int = 0
    activations_kept_bytes: int = 0
    budget: Budget | None = None
    input_shapes: list[list[int]] = field(default_factory=list)
    trace_seconds: float = 0.0
    high_bytes: int | None = None
    sample_peaks_bytes: list[int] = field(default_factory=list)
    estimate_seconds: float = 0.0
    order_peak_bytes: int | None = None
    steps: int = RUN_STEPS
    step_high_bytes: int | None = None

    @property
    def fits(self) -> bool | None:
        """Whether the high bound (else the predicted peak) fits the budget (None: no budget)."""
        if self.budget is None:
            return None
        return (self.high_bytes or self.peak_bytes) <= self.budget.usable_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: sizes in bytes with `_bytes` keys."""
        return json_dict(
            self,
            "batch_size peak_bytes high_bytes steps step_high_bytes sample_peaks_bytes "
            "order_peak_bytes resident_bytes "
            "activations_kept_bytes breakdown per_layer peak_moment what_ifs budget fits "
            "input_shapes trace_seconds estimate_seconds",
            breakdown=suffixed(self.breakdown, "_bytes"),
        )

    def __str__(self) -> str:
        moment = self.peak_moment
        high = (
            f", up to {format_size(self.high_bytes)} over {self.steps} steps"
            if self.high_bytes
            else ""
        )
        return (
            f"batch {self.batch_size}: predicted peak {format_size(self.peak_bytes)}{high} "
            f"(in the {moment.get('phase', '?')} pass at {moment.get('layer') or moment.get('op')})"
        )


def _summarise(result: Replay) -> tuple[dict[str, int], list[dict[str, Any]]]:
    breakdown = dict.fromkeys(CATEGORIES, 0)
    layers: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CATEGORIES, 0))
    for item in result.live:
        breakdown[item.category] = breakdown.get(item.category, 0) + item.nbytes
        layers[item.layer or "(other)"][item.category] += item.nbytes
    per_layer = [
        {"layer": name, "bytes": sum(parts.values()), **{f"{k}_bytes": v for k, v in parts.items()}}
        for name, parts in layers.items()
    ]
    per_layer.sort(key=lambda row: -row["bytes"])
    return breakdown, per_layer


def estimate_workload(
    workload: Workload,
    batch_size: int,
    recompute: Any = None,
    *,
    samples: int = 0,
    steps: int = RUN_STEPS,
    on_sample: Callable[[int, int], None] | None = None,
) -> Estimate:
    """Estimate a prepared Workload's step at `batch_size` (see `estimate`).

    The replay's allocator follows this process's emulation: one region of the budget (a
    card with memory growth off, the default), or regions that grow (`--memory-growth`, or
    no emulation). `recompute` (a `memfit.recompute` policy or `Recompute`) traces the step
    with the model's forward segmented: the replay runs each recomputed segment's forward
    again inside backward, where its gradients need it.
    """
    check_batch_size(batch_size)
    started = time.perf_counter()
    with _young_collections():
        graph = _start_trace(workload, int(batch_size), recompute).result()
        traced = time.perf_counter() - started
        return _replayed(
            graph, workload, traced, started, samples=samples, steps=steps, on_sample=on_sample
        )


def _start_trace(workload: Workload, batch_size: int, recompute: Any = None) -> Any:
    """Trace the step: a `tf_trace.TracedStep`, its grappler pass still running on a thread."""
    from memfit.backend import tf_trace
    from memfit.recomputation.remat import as_recompute

    if getattr(workload, "is_step", False):
        from memfit.workload.step import refuse_for_step

        refuse_for_step(recompute=recompute)
        workload.build_optimizer()
        return tf_trace.start_trace(workload, batch_size)
    optimizer = workload.model.optimizer
    if optimizer is not None and not getattr(optimizer, "built", True):
        optimizer.build(workload.model.trainable_variables)
    segmented = as_recompute(workload.model, recompute)
    with segmented if segmented is not None else contextlib.nullcontext():
        pending = tf_trace.start_trace(workload, batch_size)
    if _freezing:
        gc.freeze()  # the traced graph stays: later collections need not walk it again
    return pending


_freezing: list[bool] = []  # non-empty while an estimate keeps the collector off old objects


@contextlib.contextmanager
def _young_collections() -> Iterator[None]:
    """Let the garbage collector skip the objects that exist now and what each trace keeps.

    A traced step is millions of Python objects (TensorFlow's graph, Keras' model) that live
    as long as the estimate; every full collection walked them all again (ResNet50 224 px
    b32: ~2.4 of ~20 CPU-s went to ten full collections). `gc.freeze` moves them out of the
    collector's reach until `gc.unfreeze` at the end gives them back. Left as is when the
    caller froze objects itself.
    """
    if gc.get_freeze_count() or _freezing:
        yield
        return
    gc.freeze()
    _freezing.append(True)
    try:
        yield
    finally:
        _freezing.clear()
        gc.unfreeze()


def _replayed(
    graph: Any,
    workload: Workload,
    traced: float,
    started: float,
    *,
    samples: int = 0,
    steps: int = RUN_STEPS,
    on_sample: Callable[[int, int], None] | None = None,
) -> Estimate:
    """Replay a traced step (a `StepGraph`) and describe its peak as an `Estimate`.

    With `samples`, the high bound's samples replay half in a forked child, beside the
    likely replay and the other half here (`memfit.estimation.background`).
    """
    pending = _start_range(graph, samples, here=samples // 2) if samples > 0 else None
    try:
        result = replay(graph, region_bytes=_region_bytes())
    except BaseException:
        if pending is not None:
            pending.cancel()
        raise
    estimate = _described(result, graph, workload, traced, started)
    estimate.steps = steps
    if pending is not None:
        _bound(estimate, pending, on_sample)
    estimate.estimate_seconds = time.perf_counter() - started
    return estimate


def _region_bytes() -> int | None:
    """The replay's one region: the emulated card's (None: regions that grow)."""
    emulated = emulated_budget()
    return None if emulated is None or emulated_memory_growth() else emulated.usable_bytes


def _start_range(graph: Any, samples: int, here: int) -> PendingRange:
    """Start the high bound's samples: all but the first `here` in a child on the other core."""
    return start_peak_range(graph, region_bytes=_region_bytes(), samples=samples, here=here)


def _bound(
    estimate: Estimate,
    pending: PendingRange,
    on_sample: Callable[[int, int], None] | None = None,
) -> None:
    """Give `estimate` its high bound once its samples are replayed (waits for the child).

    Under several inter-op threads each step of a run races for its order, so the run's
    peak is its highest step: where a sampled process peaked above the likely order, the
    estimate becomes that process's peak and live set (see docs/design/estimate.md, "The range").
    The bound of 5 steps is `step_high_bytes`; `high_bytes` is it raised for a run of
    `estimate.steps` steps (`bounds.run_rise`).
    """
    bound = pending.result(estimate.peak_bytes, on_sample)
    estimate.step_high_bytes = bound.high_bytes
    estimate.high_bytes = int(bound.high_bytes * run_rise(estimate.steps))
    estimate.sample_peaks_bytes = bound.sample_bytes
    top = bound.highest
    threads = int(getattr(pending.graph, "inter_op_threads", 1) or 1)
    if top is not None and threads > 1:
        summary = _summarise(top)
        if sum(summary[0].values()) > estimate.peak_bytes:
            _describe_peak(estimate, top, summary)


def _described(
    result: Replay, graph: Any, workload: Workload, traced: float, started: float
) -> Estimate:
    """The likely replay of a step as an `Estimate` (no high bound yet)."""
    estimate = Estimate(
        batch_size=int(graph.batch_size),
        peak_bytes=0,
        breakdown={},
        input_shapes=[list(s) for s in _sample_shapes(workload)],
        trace_seconds=traced,
    )
    _describe_peak(estimate, result)
    estimate.order_peak_bytes = estimate.peak_bytes
    estimate.estimate_seconds = time.perf_counter() - started
    return estimate


def _describe_peak(
    estimate: Estimate,
    result: Replay,
    summary: tuple[dict[str, int], list[dict[str, Any]]] | None = None,
) -> None:
    """Give `estimate` the peak of `result` (a replay of its step) and what is live then
    (`summary`: `_summarise(result)`, when already made)."""
    breakdown, per_layer = summary or _summarise(result)
    estimate.peak_bytes = sum(breakdown.values())
    estimate.breakdown, estimate.per_layer = breakdown, per_layer
    estimate.peak_moment = {
        "phase": result.peak_phase,
        "layer": result.peak_layer,
        "op": result.peak_op,
        "op_type": result.peak_op_type,
    }
    estimate.resident_bytes = result.resident_bytes
    estimate.activations_kept_bytes = result.activations_kept_bytes


class _Steps:
    """One workload's step at many batch sizes: sized from one trace, made from two sizes."""

    def __init__(self, workload: Workload, traced: Any, *sized: Any) -> None:
        self.workload = workload
        self.traced = traced  # a `tf_trace.TracedStep`
        self.sized = {int(graph.batch_size): graph for graph in sized}

    def estimate(self, batch_size: int) -> Estimate:
        """The estimate at `batch_size`: made from two sizes, else the trace sized again."""
        from memfit.backend.tf_graph import at_batch_size

        started = time.perf_counter()
        graph = self.sized.get(batch_size)
        if graph is None and len(self.sized) >= 2:
            first, second = list(self.sized.values())[:2]
            graph = at_batch_size(first, second, batch_size)
        traced = 0.0
        if graph is None:
            graph = self.traced.at_batch(batch_size)
            traced = time.perf_counter() - started
        return _replayed(graph, self.workload, traced, started)


def _sample_shapes(workload: Workload) -> list[tuple[int, ...]]:
    try:
        return workload.sample_shapes()
    except WorkloadError:
        return []


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
    samples: int = SAMPLES,
    steps: int = RUN_STEPS,
    threads: tuple[int, int] | None = None,
    on_progress: Callable[[str], None] | None = None,
    step_fn: Callable[[Any, Any], Any] | None = None,
    overrides: Any = (),
    params: Any = (),
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
        samples: other processes to replay for the high bound (`Estimate.high_bytes`);
            0 leaves it out. What-ifs scale their high bound by the base step's
            high-to-likely ratio instead of sampling again.
        steps: steps of training the high bound covers (default 200, a run; 5 gives the
            highest of 5 steps after a warm-up, as `--check` measures).
        threads: `(inter, intra)` thread counts of the machine to estimate for (default:
            what TensorFlow uses in this process: as set, else one per CPU it may run on).
        on_progress: called with a short text at each phase.
        step_fn: a step spec: `step_fn(data, optimizer) -> logs`, the whole training step of
            `model` (Keras 3 or tf_keras) with `optimizer`; `data` is then a callable
            `batch_size -> batch` or an unbatched `tf.data.Dataset`. `tf.function(step_fn)`
            is traced at `batch_size` instead of `model.train_step`. No what-ifs.
        overrides: for a `garden:` task (`model="garden:EXPERIMENT"`), `key.path=value`
            strings applied to its experiment config; its `train_step` is traced.
        params: for a `garden:` task, YAML/JSON files or texts applied to its config first.

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
    steps = check_positive_int(steps, "steps")
    progress = on_progress or (lambda _text: None)
    if step_fn is not None or (isinstance(model, str) and model.startswith("garden:")):
        if precision or remat or what_ifs:
            raise WorkloadError(
                "a step spec (a Model Garden task's train_step) is estimated as it is: no "
                "precision, remat or what-ifs; change its config with overrides (--set) instead"
            )
        return _estimate_step(
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
            progress,
        )
    _check_choice("precision", precision, PRECISIONS)
    _check_choice("remat", remat, KERAS_REMAT_MODES)
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
            target = _load(model, input_shape, classes, precision, remat)
        return Workload(target, optimizer=optimizer, loss=loss, input_shape=input_shape, data=data)

    def sampled(done: int, total: int) -> None:
        progress(f"the high bound: process {done} of {total} replayed")

    assumed = assume_threads(*check_threads(threads)) if threads else contextlib.nullcontext()
    with assumed, _young_collections(), contextlib.ExitStack() as stack:
        started = time.perf_counter()
        queue = None
        if what_ifs:
            # A helper process starts now (TensorFlow's import there overlaps this trace)
            # and takes the what-ifs that rebuild the model beside this process.
            queue = WhatIfQueue(_helper(arguments) if rebuild else None)
            stack.callback(queue.close)
        progress(f"tracing the step at batch {batch_size}")
        with _step_errors():
            workload = build()
        variants = _variants(_sample_shapes(workload), optimizer) if rebuild else []
        if queue is not None:
            queue.add(_queue_order(variants))
        tracing = time.perf_counter()  # the trace's time leaves the model's build out
        with _step_errors():
            pending_base = _start_trace(workload, int(batch_size))
        traced = time.perf_counter() - tracing
        early = None
        if queue is not None:
            # The first what-if's step is traced while grappler works on this one (on its
            # thread), instead of after waiting for it.
            progress("what if: recompute sqrt")
            early = _begin_trace(
                lambda: workload, {"batch_size": int(batch_size), "recompute": "sqrt"}
            )
        waiting = time.perf_counter()
        graph = pending_base.result()
        traced += time.perf_counter() - waiting
        if queue is None:
            result = _replayed(
                graph, workload, traced, started, samples=samples, steps=steps, on_sample=sampled
            )
        else:
            # The samples replay in a child while this process goes on with the what-ifs;
            # the what-ifs' high bounds wait for them (`bounded`).
            pending = _start_range(graph, samples, here=0) if samples > 0 else None
            try:
                likely = replay(graph, region_bytes=_region_bytes())
                result = _described(likely, graph, workload, traced, started)
                result.budget, result.steps = resolved, steps

                def bounded() -> Estimate:
                    if pending is not None and result.high_bytes is None:
                        _bound(result, pending, sampled)
                    return result

                result.what_ifs = _what_ifs(
                    workload,
                    result,
                    pending_base,
                    build,
                    variants,
                    queue,
                    progress,
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


def _estimate_step(
    model: Any,
    batch_size: int,
    optimizer: Any,
    step_fn: Any,
    data: Any,
    overrides: Any,
    params: Any,
    budget: Any,
    samples: int,
    steps: int,
    threads: tuple[int, int] | None,
    progress: Callable[[str], None],
) -> Estimate:
    """`estimate` of a step spec: `tf.function` of its step traced at `batch_size`, replayed.

    A step the trace cannot take (a Python step that reads tensors' values, say) is one
    `WorkloadError` that says to measure it instead, never a traceback.
    """
    from memfit.workload.spec import WorkloadSpec
    from memfit.workload.step import StepWorkload

    progress(f"building the step spec of {model if isinstance(model, str) else 'the model'}")
    if isinstance(model, str):
        workload = WorkloadSpec(model, overrides=overrides, params=params).task_workload()
    else:
        workload = StepWorkload.from_data(model, optimizer, step_fn, data)
    resolved = as_budget(budget) or emulated_budget()
    assumed = assume_threads(*check_threads(threads)) if threads else contextlib.nullcontext()

    def sampled(done: int, total: int) -> None:
        progress(f"the high bound: process {done} of {total} replayed")

    started = time.perf_counter()
    with assumed, _young_collections():
        progress(f"tracing the step at batch {batch_size}")
        try:
            graph = _start_trace(workload, int(batch_size)).result()
        except MemfitError:
            raise
        except Exception as exc:  # noqa: BLE001 - any trace failure: one line, then measure
            text = str(exc.args[0]) if exc.args else str(exc)
            first = next((line.strip() for line in text.splitlines() if line.strip()), "")
            raise WorkloadError(
                f"the estimate cannot trace {workload.name}'s step ({type(exc).__name__}: "
                f"{first[:200]}); measure it instead (memfit measure)"
            ) from None
        traced = time.perf_counter() - started
        result = _replayed(
            graph, workload, traced, started, samples=samples, steps=steps, on_sample=sampled
        )
    result.budget = resolved
    result.estimate_seconds = time.perf_counter() - started
    return result


@contextlib.contextmanager
def _step_errors() -> Iterator[None]:
    """Errors raised by the model's own code while it is built or its step traced, as one line.

    A model whose step cannot be traced (a layer refusing its inputs, a loss refusing its
    targets) is the user's to fix: it becomes a `WorkloadError` that names the layer and the
    cause, as `memfit measure` reports the same failure from its child process, instead of
    Keras' traceback. memfit's own errors pass through unchanged.
    """
    try:
        yield
    except MemfitError:
        raise
    except Exception as exc:  # noqa: BLE001 - the model's code can raise anything
        raise WorkloadError(
            f"the training step could not be traced: {one_line(exc)} (run the model's "
            f"`fit` on one batch for the whole traceback)"
        ) from exc


def _check_choice(name: str, value: str | None, choices: Sequence[str]) -> None:
    if value is not None and value not in choices:
        raise WorkloadError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")


def _load(
    spec: str,
    input_shape: InputShape | None,
    classes: int | None,
    precision: str | None,
    remat: str | None,
) -> Any:
    from memfit.workload.spec import WorkloadSpec

    workload = WorkloadSpec(
        spec, input_shape=input_shape, classes=classes, precision=precision, remat=remat
    )
    return workload.build_model()


def _what_ifs(
    workload: Workload,
    base: Estimate,
    traced: Any,
    build: Callable[..., Workload],
    variants: list[tuple[str, dict[str, Any]]],
    queue: WhatIfQueue,
    progress: Callable[[str], None],
    bounded: Callable[[], Estimate] | None = None,
    early: tuple[Any, Workload | None, float] | None = None,
) -> list[dict[str, Any]]:
    """The what-if rows of `base`, in the order they are shown.

    `traced` is `base`'s traced step (a `tf_trace.TracedStep`): the other batch sizes are
    sized from it, not traced again. `variants` are the what-ifs that rebuild the model, in
    `queue`, which a helper process may be taking them from meanwhile (see
    `memfit.estimation.helper`); this process makes the rest. `bounded()` gives `base` with
    its high bound (it may wait for the samples, which replay in a child meanwhile); it is
    asked for only where a row needs the high-to-likely ratio. `early` is the recompute
    step when its trace has begun (`_begin_trace`).
    """
    rows: list[dict[str, Any]] = []
    highs: list[tuple[dict[str, Any], int]] = []  # rows whose high bound waits for the ratio

    def ratio(to: str = "high_bytes") -> float:
        """A what-if's figure from its likely order's peak: times the base step's ratio of
        `to` (its high bound, or its peak: the highest replayed step) to its likely order's."""
        step = bounded() if bounded is not None else base
        order = step.order_peak_bytes or step.peak_bytes
        return (getattr(step, to) or order) / order if order else 1.0

    def row(change: str, figures: dict[str, Any]) -> None:
        entry: dict[str, Any] = {"change": change}
        if "error" in figures:
            entry["error"] = figures["error"]
        else:
            # high_bytes and saved_bytes are filled in at the end, from the ratios
            entry.update(figures, high_bytes=None, saved_bytes=None)
            highs.append((entry, figures["peak_bytes"]))
        rows.append(entry)

    def begin(change: str, kwargs: dict[str, Any]) -> tuple[str, Any]:
        progress(f"what if: {change}")
        if set(kwargs) == {"optimizer"}:
            # Another optimizer trains the same layers: the model is compiled again, not
            # rebuilt (it is memfit's own, built for these what-ifs).
            return change, _begin_trace(
                functools.partial(_recompiled, workload, kwargs["optimizer"]), {"batch_size": batch}
            )
        return change, _begin_trace(functools.partial(build, **kwargs), {"batch_size": batch})

    batch = base.batch_size
    sizes = sorted({max(1, batch // 2), batch * 2} - {batch})
    # This process's what-ifs in turn, each traced while grappler works on the one before
    # it (on a thread: see `tf_trace.start_trace`); the recompute step is this model's.
    if early is None:
        progress("what if: recompute sqrt")
        early = _begin_trace(lambda: workload, {"batch_size": batch, "recompute": "sqrt"})
    current: tuple[str, Any] | None = ("recompute sqrt", early)
    progress(f"what if: batch {batch * 2}")
    since = time.perf_counter()
    doubled_step = traced.at_batch(batch * 2)  # the same trace, sized again
    twice = _replayed(doubled_step, workload, time.perf_counter() - since, since)
    steps = _Steps(workload, traced, traced.result(), doubled_step)
    by_size = {batch: base.order_peak_bytes or base.peak_bytes}
    for size in sizes:
        est = twice if size == batch * 2 else steps.estimate(size)
        by_size[size] = est.peak_bytes
        row(f"batch size {size}", what_if_figures(est))
    if base.budget is not None:
        progress("what if: the largest batch for the budget")
        size, peak, high = _largest_for(steps, by_size, base.budget, ratio(), ratio("peak_bytes"))
        rows.append(
            {
                "change": f"largest batch for {base.budget.name}",
                "batch_size": size,
                "peak_bytes": peak,
                "high_bytes": high,
            }
        )
    made: dict[str, dict[str, Any]] = {}
    while current is not None:
        change, started = current
        upcoming = queue.take()
        current = begin(*upcoming) if upcoming is not None else None
        made[change] = _made_here(started)
        if current is None:
            if queue.busy:
                progress("what ifs: waiting for the other process's last")
            upcoming = queue.wait()  # the helper is done, or gave one back
            current = begin(*upcoming) if upcoming is not None else None
    made.update(queue.finish())
    for change in ["recompute sqrt"] + [change for change, _ in variants]:
        row(change, made[change])
    if variants:  # the model is rebuilt for the what-ifs: RematScope could apply
        rows.append({"change": "remat (keras.RematScope)", "note": REMAT_SCOPE_NOTE})
    scale, run = ratio(), ratio("peak_bytes")
    for entry, peak in highs:
        entry["peak_bytes"] = int(peak * run)
        entry["high_bytes"] = int(peak * scale)
        entry["saved_bytes"] = base.peak_bytes - entry["peak_bytes"]
    return rows


def _largest_for(
    steps: _Steps,
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
    with _young_collections():
        progress(f"tracing the step at batch {batch_size}")
        with _step_errors():
            if isinstance(model, str):
                model = _load(model, input_shape, None, None, None)
            workload = Workload(model, input_shape=input_shape, data=data)
            pending = _start_trace(workload, int(batch_size))
            graph = pending.result()
        traced = time.perf_counter() - started
        progress("replaying it, with its high bound")
        base = _replayed(graph, workload, traced, started, samples=samples, steps=steps)
        order = base.order_peak_bytes or base.peak_bytes
        scale = (base.high_bytes or order) / order if order else 1.0
        run = base.peak_bytes / order if order else 1.0
        sized = _Steps(workload, pending, graph)
        one = base if batch_size == 1 else sized.estimate(1)
        known = {int(batch_size): order, 1: one.order_peak_bytes or 0}
        progress(f"the largest batch for {resolved.name}")
        size, peak, high = _largest_for(
            sized, known, resolved, scale, run, margin=margin, resident=one.resident_bytes
        )
        if size is None:
            return None
        result = base if size == batch_size else sized.estimate(size)
        result.peak_bytes, result.high_bytes, result.steps = int(peak or 0), high, steps
    result.budget = resolved
    result.estimate_seconds = time.perf_counter() - started
    return result


def what_if_figures(est: Estimate) -> dict[str, Any]:
    """A what-if row's figures of the estimate of its step (before the base's ratios)."""
    return {
        "batch_size": est.batch_size,
        "peak_bytes": est.peak_bytes,
        "activations_bytes": est.breakdown["activations"],
        "optimizer_slots_bytes": est.breakdown["optimizer_slots"],
    }


def _made_here(started: tuple[Any, Workload | None, float]) -> dict[str, Any]:
    """A what-if's figures from its begun trace (`_begin_trace`), or its error."""
    pending, made, since = started
    try:
        if isinstance(pending, Exception):
            raise pending
        step = pending.result()
        return what_if_figures(_replayed(step, made, time.perf_counter() - since, since))
    except Exception as exc:  # noqa: BLE001 - a variant that cannot be traced is reported
        return {"error": _not_applicable(exc)}


def estimate_variant(spec: Any, batch_size: int, variant: dict[str, Any]) -> dict[str, Any]:
    """The what-if row's figures of `spec` (a `WorkloadSpec`) with `variant`'s fields replaced.

    What a helper process makes of a what-if (`memfit.estimation.child.open_what_if_estimator`): the
    same figures, or the same `not applicable` line, as `_what_ifs` makes here.
    """
    import dataclasses

    with _young_collections():
        return _made_here(
            _begin_trace(
                lambda: dataclasses.replace(spec, **variant).workload(),
                {"batch_size": int(batch_size)},
            )
        )


def _begin_trace(
    make: Callable[[], Workload], kwargs: dict[str, Any]
) -> tuple[Any, Workload | None, float]:
    """Build a what-if's workload and begin tracing its step (grappler goes on on a thread).

    Returns (the pending trace, or what building or tracing raised; the workload; when it
    began), as `_what_ifs` keeps its started steps.
    """
    since = time.perf_counter()
    try:
        made = make()
        return _start_trace(made, **kwargs), made, since
    except Exception as exc:  # noqa: BLE001 - reported in the what-if's row
        return exc, None, since


def _recompiled(workload: Workload, optimizer: Any) -> Workload:
    """`workload`'s model compiled with `optimizer` (its loss, batch and data kept)."""
    return Workload(
        workload.model, optimizer=optimizer, data=workload.data, input_shape=workload.input_shape
    )


def _variants(shapes: list[tuple[int, ...]], optimizer: Any) -> list[tuple[str, dict[str, Any]]]:
    """The what-ifs that rebuild the model (mixed precision, the other optimizer, a smaller
    input) of a model whose sample shapes are `shapes`, in the order they are shown.

    One precision row: `mixed_bfloat16` holds its activations in the same two bytes as
    `mixed_float16` (ResNet50 224 px b32: 2468 and 2449 MiB), and each row costs a trace
    (`--precision mixed_bfloat16` estimates it). `keras.RematScope` modes get a row that says
    why they are not traced (`REMAT_SCOPE_NOTE`).
    """
    variants: list[tuple[str, dict[str, Any]]] = [
        ("precision mixed_float16", {"precision": "mixed_float16"})
    ]
    current = str(optimizer or "adam").lower()
    other = "sgd" if "adam" in current else "adam"
    variants.append((f"optimizer {other}", {"optimizer": other}))
    if len(shapes) == 1 and len(shapes[0]) == 3 and min(shapes[0][:2]) >= 64:
        h, w, c = shapes[0]
        smaller = (h * 3 // 4 // 8 * 8, w * 3 // 4 // 8 * 8, c)
        variants.append((f"input {smaller[0]}x{smaller[1]}", {"input_shape": smaller}))
    return variants


def _queue_order(variants: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """`variants` in the order the two processes take them: the costliest first, so that
    neither waits long for the other's last one. The other optimizer is the cheapest (this
    process compiles the same model again) and goes last."""
    return sorted(variants, key=lambda variant: "optimizer" in variant[1])


REMAT_SCOPE_NOTE = (
    "not estimated with the what-ifs: keras.RematScope raised the peak or failed wherever "
    "memfit measured it on TensorFlow (docs/recompute.md); recompute sqrt is the recompute "
    "that saves memory here. Estimate a mode with --remat MODE"
)


def _helper(arguments: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments of a helper process for the what-ifs (see `memfit.estimation.helper`),
    or None where one cannot help: a model or data it cannot rebuild from names, or one CPU.

    `arguments`: `estimate`'s arguments by name (its `locals()` on entry).
    """
    import sys

    from memfit.backend import tf as tfb
    from memfit.backend.tf_grappler import sees_gpu
    from memfit.backend.tf_kernels import concurrent_ops, intra_threads, schedulable_cpus
    from memfit.workload.spec import WorkloadSpec

    if (
        arguments.get("data") is not None
        or schedulable_cpus() < 2
        or os.environ.get(ENV_HELPER, "1") == "0"
    ):
        return None
    try:
        spec = WorkloadSpec.from_arguments(arguments)[0].to_json()
    except WorkloadError:  # an optimizer or loss object: it stays in this process
        return None
    tf = tfb.import_tf()
    return {
        "workload": spec,
        "batch_size": int(arguments["batch_size"]),
        "threads": [concurrent_ops(tf), intra_threads(tf)],
        "gpus": sees_gpu(),
        "path": [entry for entry in sys.path if entry],
    }


ENV_HELPER = "MEMFIT_ESTIMATE_HELPER"
"""Set to 0 to make every what-if in the estimating process (no helper process)."""


def _not_applicable(exc: Exception) -> str:
    """A what-if that cannot be built, as one line: `not applicable: <why>`.

    Keras wraps errors raised while tracing in `in user code:` and a traceback; the
    reason is the last `SomeError: ...` line of it.
    """
    lines = [
        re.sub(r"\x1b\[[0-9;]*m", "", line).strip()  # Keras bolds the cause
        for line in str(exc).splitlines()
        if line.strip()
    ]
    why = lines[0] if lines else type(exc).__name__
    at = 0
    if why.startswith("in user code"):
        errors = [
            i for i, line in enumerate(lines) if re.match(r"^[A-Za-z_.]*(Error|Exception):", line)
        ]
        at = errors[-1] if errors else len(lines) - 1
        why = lines[at].split(": ", 1)[1] if ": " in lines[at] else lines[at]
    if why.startswith("Exception encountered when calling") and len(lines) > at + 1:
        why = lines[at + 1]  # the cause, not Keras' wrapper around it
    why = why.removeprefix("recompute is not applicable: ")
    return f"not applicable: {why[:200]}"
