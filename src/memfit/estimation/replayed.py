"""Trace a training step once and replay it: the likely peak, its breakdown and high bound.

The step's graph is traced (forward, loss, gradients, optimizer update; see
`memfit.backend.tf_trace`) for a batch described only by its shapes, and replayed through a
model of TensorFlow's executor and BFC allocator (`memfit.estimation.simulate`,
`memfit.estimation.bfc`). The high bound's samples replay in a forked child on the other core
(`memfit.estimation.background`), and the garbage collector leaves alone what exists before
the estimate and what each trace keeps (`gc.freeze`): see docs/design/estimate.md, "How it is
fast".
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from memfit.backend import tf_trace
from memfit.backend.tf_graph import at_batch_size
from memfit.backend.tf_kernels import assume_threads
from memfit.budget.budget import as_budget, emulated_budget, emulated_memory_growth
from memfit.checks import check_batch_size, check_threads
from memfit.errors import MemfitError, WorkloadError, one_line
from memfit.estimation.background import PendingRange, start_peak_range
from memfit.estimation.bounds import RUN_STEPS, run_rise
from memfit.estimation.result import Estimate, summarise
from memfit.estimation.simulate import Replay, replay
from memfit.recomputation.remat import as_recompute
from memfit.workload.spec import WorkloadSpec
from memfit.workload.step import StepWorkload, refuse_for_step
from memfit.workload.workload import InputShape, Workload


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
    with young_collections():
        graph = start_trace(workload, int(batch_size), recompute).result()
        traced = time.perf_counter() - started
        return replayed(
            graph, workload, traced, started, samples=samples, steps=steps, on_sample=on_sample
        )


def start_trace(workload: Workload, batch_size: int, recompute: Any = None) -> Any:
    """Trace the step: a `tf_trace.TracedStep`, its grappler pass still running on a thread."""

    if getattr(workload, "is_step", False):
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
def young_collections() -> Iterator[None]:
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


def replayed(
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
    pending = start_range(graph, samples, here=samples // 2) if samples > 0 else None
    try:
        result = replay(graph, region_bytes=region_bytes())
    except BaseException:
        if pending is not None:
            pending.cancel()
        raise
    estimate = described(result, graph, workload, traced, started)
    estimate.steps = steps
    if pending is not None:
        apply_bound(estimate, pending, on_sample)
    estimate.estimate_seconds = time.perf_counter() - started
    return estimate


def region_bytes() -> int | None:
    """The replay's one region: the emulated card's (None: regions that grow)."""
    emulated = emulated_budget()
    return None if emulated is None or emulated_memory_growth() else emulated.usable_bytes


def start_range(graph: Any, samples: int, here: int) -> PendingRange:
    """Start the high bound's samples: all but the first `here` in a child on the other core."""
    return start_peak_range(graph, region_bytes=region_bytes(), samples=samples, here=here)


def apply_bound(
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
        summary = summarise(top)
        if sum(summary[0].values()) > estimate.peak_bytes:
            _describe_peak(estimate, top, summary)


def described(
    result: Replay, graph: Any, workload: Workload, traced: float, started: float
) -> Estimate:
    """The likely replay of a step as an `Estimate` (no high bound yet)."""
    estimate = Estimate(
        batch_size=int(graph.batch_size),
        peak_bytes=0,
        breakdown={},
        input_shapes=[list(s) for s in sample_shapes(workload)],
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
    (`summary`: `summarise(result)`, when already made)."""
    breakdown, per_layer = summary or summarise(result)
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


class Steps:
    """One workload's step at many batch sizes: sized from one trace, made from two sizes."""

    def __init__(self, workload: Workload, traced: Any, *sized: Any) -> None:
        self.workload = workload
        self.traced = traced  # a `tf_trace.TracedStep`
        self.sized = {int(graph.batch_size): graph for graph in sized}

    def estimate(self, batch_size: int) -> Estimate:
        """The estimate at `batch_size`: made from two sizes, else the trace sized again."""

        started = time.perf_counter()
        graph = self.sized.get(batch_size)
        if graph is None and len(self.sized) >= 2:
            first, second = list(self.sized.values())[:2]
            graph = at_batch_size(first, second, batch_size)
        traced = 0.0
        if graph is None:
            graph = self.traced.at_batch(batch_size)
            traced = time.perf_counter() - started
        return replayed(graph, self.workload, traced, started)


def sample_shapes(workload: Workload) -> list[tuple[int, ...]]:
    try:
        return workload.sample_shapes()
    except WorkloadError:
        return []


def estimate_step(
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
    with assumed, young_collections():
        progress(f"tracing the step at batch {batch_size}")
        try:
            graph = start_trace(workload, int(batch_size)).result()
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
        result = replayed(
            graph, workload, traced, started, samples=samples, steps=steps, on_sample=sampled
        )
    result.budget = resolved
    result.estimate_seconds = time.perf_counter() - started
    return result


@contextlib.contextmanager
def step_errors() -> Iterator[None]:
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


def check_choice(name: str, value: str | None, choices: Sequence[str]) -> None:
    if value is not None and value not in choices:
        raise WorkloadError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")


def load_workload(
    spec: str,
    input_shape: InputShape | None,
    classes: int | None,
    precision: str | None,
    remat: str | None,
) -> Any:
    workload = WorkloadSpec(
        spec, input_shape=input_shape, classes=classes, precision=precision, remat=remat
    )
    return workload.build_model()
