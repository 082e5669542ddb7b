"""What-ifs: the same step estimated with another precision, recompute, optimizer or input size.

Some are made in this process and some in a helper process (`memfit.estimation.helper`),
the costliest first.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memfit.backend import tf as tfb
from memfit.backend.tf_grappler import sees_gpu
from memfit.backend.tf_kernels import concurrent_ops, intra_threads, schedulable_cpus
from memfit.errors import WorkloadError
from memfit.estimation.largest import largest_for
from memfit.estimation.replayed import Steps, replayed, start_trace, young_collections
from memfit.estimation.result import Estimate
from memfit.workload.spec import WorkloadSpec
from memfit.workload.workload import Workload

if TYPE_CHECKING:  # the helper starts `memfit.estimation.child`, which imports this module
    from memfit.estimation.helper import WhatIfQueue


def make_what_ifs(
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
    step when its trace has begun (`begin_trace`).
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
            return change, begin_trace(
                functools.partial(_recompiled, workload, kwargs["optimizer"]), {"batch_size": batch}
            )
        return change, begin_trace(functools.partial(build, **kwargs), {"batch_size": batch})

    batch = base.batch_size
    sizes = sorted({max(1, batch // 2), batch * 2} - {batch})
    # This process's what-ifs in turn, each traced while grappler works on the one before
    # it (on a thread: see `tf_trace.start_trace`); the recompute step is this model's.
    if early is None:
        progress("what if: recompute sqrt")
        early = begin_trace(lambda: workload, {"batch_size": batch, "recompute": "sqrt"})
    current: tuple[str, Any] | None = ("recompute sqrt", early)
    progress(f"what if: batch {batch * 2}")
    since = time.perf_counter()
    doubled_step = traced.at_batch(batch * 2)  # the same trace, sized again
    twice = replayed(doubled_step, workload, time.perf_counter() - since, since)
    steps = Steps(workload, traced, traced.result(), doubled_step)
    by_size = {batch: base.order_peak_bytes or base.peak_bytes}
    for size in sizes:
        est = twice if size == batch * 2 else steps.estimate(size)
        by_size[size] = est.peak_bytes
        row(f"batch size {size}", what_if_figures(est))
    if base.budget is not None:
        progress("what if: the largest batch for the budget")
        size, peak, high = largest_for(steps, by_size, base.budget, ratio(), ratio("peak_bytes"))
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


def what_if_figures(est: Estimate) -> dict[str, Any]:
    """A what-if row's figures of the estimate of its step (before the base's ratios)."""
    return {
        "batch_size": est.batch_size,
        "peak_bytes": est.peak_bytes,
        "activations_bytes": est.breakdown["activations"],
        "optimizer_slots_bytes": est.breakdown["optimizer_slots"],
    }


def _made_here(started: tuple[Any, Workload | None, float]) -> dict[str, Any]:
    """A what-if's figures from its begun trace (`begin_trace`), or its error."""
    pending, made, since = started
    try:
        if isinstance(pending, Exception):
            raise pending
        step = pending.result()
        return what_if_figures(replayed(step, made, time.perf_counter() - since, since))
    except Exception as exc:  # noqa: BLE001 - a variant that cannot be traced is reported
        return {"error": not_applicable(exc)}


def estimate_variant(spec: Any, batch_size: int, variant: dict[str, Any]) -> dict[str, Any]:
    """The what-if row's figures of `spec` (a `WorkloadSpec`) with `variant`'s fields replaced.

    What a helper process makes of a what-if (`memfit.estimation.child.open_what_if_estimator`): the
    same figures, or the same `not applicable` line, as `what_ifs` makes here.
    """
    import dataclasses

    with young_collections():
        return _made_here(
            begin_trace(
                lambda: dataclasses.replace(spec, **variant).workload(),
                {"batch_size": int(batch_size)},
            )
        )


def begin_trace(
    make: Callable[[], Workload], kwargs: dict[str, Any]
) -> tuple[Any, Workload | None, float]:
    """Build a what-if's workload and begin tracing its step (grappler goes on on a thread).

    Returns (the pending trace, or what building or tracing raised; the workload; when it
    began), as `what_ifs` keeps its started steps.
    """
    since = time.perf_counter()
    try:
        made = make()
        return start_trace(made, **kwargs), made, since
    except Exception as exc:  # noqa: BLE001 - reported in the what-if's row
        return exc, None, since


def _recompiled(workload: Workload, optimizer: Any) -> Workload:
    """`workload`'s model compiled with `optimizer` (its loss, batch and data kept)."""
    return Workload(
        workload.model, optimizer=optimizer, data=workload.data, input_shape=workload.input_shape
    )


def what_if_variants(
    shapes: list[tuple[int, ...]], optimizer: Any
) -> list[tuple[str, dict[str, Any]]]:
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


def queue_order(variants: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """`variants` in the order the two processes take them: the costliest first, so that
    neither waits long for the other's last one. The other optimizer is the cheapest (this
    process compiles the same model again) and goes last."""
    return sorted(variants, key=lambda variant: "optimizer" in variant[1])


REMAT_SCOPE_NOTE = (
    "not estimated with the what-ifs: keras.RematScope raised the peak or failed wherever "
    "memfit measured it on TensorFlow (docs/recompute.md); recompute sqrt is the recompute "
    "that saves memory here. Estimate a mode with --remat MODE"
)


def helper_arguments(arguments: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments of a helper process for the what-ifs (see `memfit.estimation.helper`),
    or None where one cannot help: a model or data it cannot rebuild from names, or one CPU.

    `arguments`: `estimate`'s arguments by name (its `locals()` on entry).
    """
    import sys

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


def not_applicable(exc: Exception) -> str:
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
