"""Out of memory: why a step ran out, from the steps before it, and the fix in numbers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memfit.sizes import format_size
from memfit.watch.detectors.stats import median, shape_text


@dataclass
class OomDiagnosis:
    """Why a step ran out of memory, from the steps before it, and the fix in numbers.

    Attributes:
        cause: `first_step`, `budget`, `input_shape`, `batch_size`, `memory_growth` or
            `near_limit` (nothing changed: the same step fitted before, at the edge).
        text: the cause in words, with the numbers.
        fix: what to do, with the numbers.
        evidence: the numbers (`_bytes`, shapes, the largest batch, the side, K).
    """

    cause: str
    text: str
    fix: str
    evidence: dict[str, Any]


def _per_sample(shape: Sequence[Any] | None) -> int | None:
    if not shape or len(shape) < 2 or any(not isinstance(d, int) for d in shape[1:]):
        return None
    return math.prod(shape[1:])


def _pixels(shape: Sequence[Any] | None) -> tuple[int, int] | None:
    if shape and len(shape) == 4 and all(isinstance(d, int) for d in shape[1:3]):
        return int(shape[1]), int(shape[2])
    return None


def diagnose_oom(
    steps: Sequence[dict[str, Any]],
    *,
    input_shape: Sequence[Any] | None,
    batch_size: int | None,
    budget_bytes: int | None,
    start_budget_bytes: int | None = None,
    guarded: bool = False,
    margin: float = 0.1,
    estimated: dict[str, Any] | None = None,
) -> OomDiagnosis:
    """Compare a step that ran out of memory with the steps before it; the fix in numbers.

    What changed, checked in this order: the budget (another process took memory), the
    input's shape per sample (larger images), the batch size, the memory in use before the
    step (growth); when nothing did, the step ran at the edge; with no step before, the
    configuration never fitted. The fix comes from how the recorded peaks scale: the step's
    peak less the memory in use is taken as proportional to batch x elements per sample
    (measured on the steps at the last shape), which gives the largest batch at the failing
    input size, the image side that fits at the failing batch, and the micro-batches K that
    `memfit.fit` needs, each leaving `margin` of the budget free.

    Args:
        steps: the records of the steps that completed before, oldest first.
        input_shape: the failing batch's first input shape (e.g. `[16, 256, 256, 3]`).
        batch_size: its batch size.
        budget_bytes: the budget now.
        start_budget_bytes: the budget when training began (a drop: another process).
        guarded: the step is memfit.fit's (its fix is worded for it).
        margin: share of the budget the suggested sizes leave free.
        estimated: for a first step (no step before to scale from), what fits by the
            estimate: `estimated_batch_size` (0: not one sample) and `estimated_high_bytes`,
            or `estimate_error` (see `memfit.watch.oom_findings.estimated_fit`).

    Example:
        ```python
        d = diagnose_oom(records, input_shape=[16, 256, 256, 3], batch_size=16,
                         budget_bytes=900 * 2**20)
        print(d.cause, d.evidence["largest_batch_size"], d.fix)
        ```
    """
    if not batch_size and input_shape and isinstance(input_shape[0], int):
        batch_size = input_shape[0]
    batch = batch_size
    shape = list(input_shape) if input_shape else None
    evidence: dict[str, Any] = {
        "input_shape": shape,
        "batch_size": batch,
        "budget_bytes": budget_bytes,
    }
    known = [s for s in steps if s.get("memory_peak_bytes") and s.get("memory_current_bytes")]
    if not steps:
        evidence["cause"] = "first_step"
        text = (
            f"the first step, on {shape_text(shape)} batches, ran out of memory: this "
            f"configuration never fitted"
            + (f" the budget of {format_size(budget_bytes)}" if budget_bytes else "")
        )
        fix = (
            "memfit.fit finds the micro-batches it needs by itself and keeps the effective "
            "batch; to choose a batch or image size up front, measure it: `memfit batch MODEL "
            "--memory <budget>` gives the largest batch that fits, `memfit estimate` what each "
            "part of the step takes"
            if not guarded
            else "even one sample per micro-batch does not fit from the first step: use "
            "smaller inputs, mixed precision or recompute (`memfit plan`), or a card with more "
            "memory"
        )
        if estimated and not guarded:
            text, fix = _first_step_estimated(text, fix, estimated, batch, evidence)
        return OomDiagnosis("first_step", text, fix, evidence)

    last = steps[-1]
    prev_shape = last.get("input_shape")
    prev_batch = last.get("batch_size") or (prev_shape[0] if prev_shape else None)
    before = last.get("memory_current_bytes")
    evidence.update({"previous_input_shape": prev_shape, "previous_batch_size": prev_batch})
    if before is not None:
        evidence["in_use_before_bytes"] = int(before)

    # How the step's memory scales, from the steps at the last shape.
    ref = [s for s in known if s.get("input_shape") == prev_shape]
    if len(ref) >= 3:
        ref = ref[1:]  # the first step at a shape carries one-time allocations
    ref = ref[-20:]
    per_element = None
    elems, prev_elems = _per_sample(shape), _per_sample(prev_shape)
    if ref and prev_elems and prev_batch:
        ref_peak = median([s["memory_peak_bytes"] for s in ref])
        ref_floor = median([s["memory_current_bytes"] for s in ref])
        if ref_peak > ref_floor:
            per_element = (ref_peak - ref_floor) / (prev_batch * prev_elems)
            evidence["reference_peak_bytes"] = int(ref_peak)
            evidence["reference_in_use_bytes"] = int(ref_floor)
    early = [s["memory_current_bytes"] for s in known[1:6]] or [
        s["memory_current_bytes"] for s in known[:1]
    ]
    early_floor = median(early) if early else None
    base_floor = before if before is not None else early_floor

    changes: list[str] = []
    cause = "near_limit"
    if start_budget_bytes and budget_bytes and budget_bytes < 0.95 * start_budget_bytes:
        cause = "budget"
        changes.append(
            f"the budget fell from {format_size(start_budget_bytes)} to "
            f"{format_size(budget_bytes)} (another process took device memory)"
        )
    if elems and prev_elems and elems > 1.05 * prev_elems:
        cause = cause if changes else "input_shape"
        pixels, prev_pixels = _pixels(shape), _pixels(prev_shape)
        what = "pixels" if pixels and prev_pixels else "elements per sample"
        changes.append(
            f"the batch is {shape_text(shape)}, {elems / prev_elems:.3g}x the {what} of the "
            f"earlier {shape_text(prev_shape)} batches"
        )
        evidence["size_ratio"] = round(elems / prev_elems, 4)
    if batch and prev_batch and batch > prev_batch:
        cause = cause if changes else "batch_size"
        changes.append(f"the batch size rose from {prev_batch} to {batch}")
    growth = (before - early_floor) if before is not None and early_floor is not None else 0
    if growth > 0 and budget_bytes and growth >= 0.05 * budget_bytes:
        evidence["growth_bytes"] = int(growth)
        if not changes:
            cause = "memory_growth"
            base_floor = early_floor
        changes.append(
            f"memory in use before the step rose from {format_size(int(early_floor or 0))} to "
            f"{format_size(int(before or 0))} over {len(steps)} steps"
        )
    evidence["cause"] = cause

    # The fix, in numbers.
    sizes: dict[str, Any] = {}
    if per_element and elems and batch and budget_bytes and base_floor is not None:
        avail = (1 - margin) * budget_bytes - base_floor
        per_sample = per_element * elems
        predicted = base_floor + per_sample * batch
        sizes["per_sample_bytes"] = int(per_sample)
        sizes["predicted_peak_bytes"] = int(predicted)
        largest = max(0, int(avail // per_sample))
        sizes["largest_batch_size"] = largest
        if largest >= 1:
            sizes["micro_batches"] = math.ceil(batch / largest)
        pixels = _pixels(shape)
        if pixels and avail > 0:
            target_batch = 1 if guarded and largest < 1 else batch
            scale = math.sqrt(avail / (per_element * target_batch * elems))
            h, w = (_round_side(d * scale) for d in pixels)
            if 1 <= h < pixels[0] and 1 <= w < pixels[1]:  # a smaller side is the fix
                sizes["fitting_side"] = [h, w]
                sizes["fitting_side_batch_size"] = target_batch
    evidence.update(sizes)

    if cause == "near_limit":
        peaks = [s["memory_peak_bytes"] for s in known[-20:]]
        top = max(peaks) if peaks else None
        text = (
            f"nothing changed: the same {shape_text(shape)} step fitted "
            f"{len(ref) or len(steps)} times before"
            + (
                f", with peaks up to {format_size(top)} ({100 * top / budget_bytes:.0f}% of the "
                f"budget {format_size(budget_bytes)})"
                if top and budget_bytes
                else ""
            )
            + "; near the limit a step's peak moves from step to step (allocator state, op "
            "order), and this one went over"
        )
    else:
        text = "; ".join(changes)
    if cause == "memory_growth":
        text += " while the batch stayed the same: something keeps memory from step to step"
    fix = _oom_fix(cause, sizes, shape, batch, guarded, margin)
    return OomDiagnosis(cause, text, fix, evidence)


def _first_step_estimated(
    text: str,
    fix: str,
    estimated: dict[str, Any],
    batch: int | None,
    evidence: dict[str, Any],
) -> tuple[str, str]:
    """A first step's cause and fix with the estimate's number (see `diagnose_oom`)."""
    evidence.update(estimated)
    size = estimated.get("estimated_batch_size")
    high = estimated.get("estimated_high_bytes")
    if "estimate_error" in estimated or size is None:
        return text, fix
    if size == 0:
        return (
            f"{text}; by the estimate, not even one sample fits",
            "use smaller inputs, mixed precision or recompute (`memfit plan` finds which), "
            "or a card with more memory",
        )
    if batch and size >= batch:
        # The estimate puts the failing batch within the budget: the device had less room
        # than the budget says (another process, memory held before the step).
        return (
            f"{text}; by the estimate it fits (high bound {format_size(high or 0)}): the "
            "device had less free memory than the budget",
            f"{fix}; `memfit doctor` shows who else holds the device's memory",
        )
    evidence["largest_batch_size"] = size
    parts = [
        f"train at batch_size={size}: the largest batch that fits by the estimate (its high "
        f"bound for a run, {format_size(high or 0)}, with 5% of the step's bytes kept free)"
    ]
    if batch and batch > size:
        k = math.ceil(batch / size)
        evidence["micro_batches"] = k
        parts.append(
            f"or keep batch {batch} with memfit.fit(model, ..., micro_batches={k}) "
            f"({k} micro-batches of {math.ceil(batch / k)}; it also recovers from an OOM by "
            f"itself)"
        )
    return f"{text}; by the estimate, batch {size} fits", "; ".join(parts)


def _round_side(value: float) -> int:
    side = int(math.floor(value))
    return side - side % 8 if side >= 32 else side


def _oom_fix(
    cause: str,
    sizes: dict[str, Any],
    shape: Sequence[Any] | None,
    batch: int | None,
    guarded: bool,
    margin: float,
) -> str:
    parts: list[str] = []
    at = shape_text(list(shape[1:])) if shape else "this input size"
    if cause == "memory_growth":
        parts.append(
            "find what keeps memory from step to step (tensors appended to Python lists in a "
            "callback or loop, retracing with new shapes) and keep Python numbers instead; "
            "at the memory in use when training started the step fitted"
        )
    if cause == "budget":
        parts.append(
            "stop the other process or pick another device (`memfit doctor` lists who holds "
            "the GPU's memory)"
        )
    largest = sizes.get("largest_batch_size")
    k = sizes.get("micro_batches")
    side = sizes.get("fitting_side")
    spare = f"leaving {100 * margin:.0f}% of the budget free"
    if guarded:
        if k and batch and 1 < k <= batch:
            parts.append(
                f"nothing is lost: memfit.fit splits these batches; pass micro_batches={k} "
                f"(micro-batches of {math.ceil(batch / k)}) to start there without the retry "
                f"(from the measured peaks, {largest} samples of {at} fit, {spare})"
            )
        if side:
            parts.append(
                f"or resize the images to {side[0]}x{side[1]} (fits at "
                f"{sizes.get('fitting_side_batch_size')} a micro-batch)"
            )
    else:
        if largest is not None and largest >= 1:
            parts.append(
                f"from the measured peaks, the largest batch at {at} is about {largest} ({spare})"
            )
        if side and batch:
            parts.append(f"images of {side[0]}x{side[1]} fit at batch {batch}")
        if k and batch and k > 1:
            parts.append(
                f"or keep batch {batch} with memfit.fit(model, ..., micro_batches={k}) "
                f"({k} micro-batches of {math.ceil(batch / k)}; it also recovers from an OOM "
                f"by itself)"
            )
    if not parts:
        parts.append(
            "train with memfit.fit (it splits the batch into micro-batches on OOM without "
            "losing progress), find the largest batch that fits with `memfit batch`, or use "
            "mixed precision or smaller inputs"
        )
    return "; ".join(parts)
