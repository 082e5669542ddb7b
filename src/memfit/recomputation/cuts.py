"""Where recompute cuts a layer graph: the `segments=` policies and the peaks they predict.

Pure arithmetic on the flattened layer graph of `memfit.backend.tf_layer_graph` (its steps, the
bytes each produces, the tensors crossing each place it can be cut): no TensorFlow or Keras is
called here. `memfit.recompute` turns the chosen cuts into segments and its report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.errors import RecomputeError
from memfit.sizes import format_size, parse_size

# A `segments=` policy: "sqrt", "all", a count, a size ("64MiB") or layer names.
Segments = str | int | Sequence[str]

# The most segments a size budget (`"64MiB"`) is split into.
MAX_SEGMENTS = 64

# A place the graph can be cut: the step index, and the ids of the tensors that cross it.
Cut = tuple[int, tuple[int, ...]]


def choose_cuts(graph: Any, cuts: list[Cut], segments: Segments, batch: int) -> list[int]:
    """The step indices to cut after, for a `segments=` policy (see `memfit.recompute`).

    Args:
        graph: the flattened layer graph (`memfit.backend.tf_layer_graph.LayerGraph`).
        cuts: where it can be cut (`graph.cuts()`).
        segments: the policy.
        batch: the batch a size budget is meant for.

    Raises:
        RecomputeError: for a policy that is unreadable, asks for a cut where none is
            possible, or a budget smaller than the smallest boundary.
    """
    positions = [index for index, _ in cuts]
    if isinstance(segments, bool):
        raise RecomputeError(
            f"segments must be 'sqrt', a count, a size or layer names, got {segments!r}"
        )
    if isinstance(segments, int):
        if segments < 1:
            raise RecomputeError(f"segments must be at least 1, got {segments}")
        return _balanced(graph, cuts, min(segments, len(positions) + 1))
    if isinstance(segments, str):
        text = segments.strip().lower()
        if text == "sqrt":
            return _optimal(graph, cuts)
        if text == "all":
            single = [index for index, tensors in cuts if len(tensors) == 1]
            return single or positions
        try:
            budget = parse_size(segments)
        except Exception:  # noqa: BLE001 - any unreadable policy gets the same message
            raise RecomputeError(
                f"segments must be 'sqrt', 'all', a count, a size such as '64MiB' or a list of "
                f"layer names, got {segments!r}"
            ) from None
        return _within(graph, cuts, budget, batch)
    names = list(segments)
    by_name: dict[str, int] = {}
    for index, _tensors in cuts:
        by_name.setdefault(graph.layer_name(index), index)
    chosen = []
    for name in names:
        if name not in by_name:
            some = ", ".join(list(by_name)[:8])
            raise RecomputeError(
                f"cannot cut after layer {name!r}: more than a few tensors cross the graph "
                f"there (or it is the first or last layer). Layers after which it can: {some}"
                + (", ..." if len(by_name) > 8 else "")
            )
        chosen.append(by_name[name])
    return sorted(set(chosen))


def _balanced(graph: Any, cuts: list[Cut], count: int) -> list[int]:
    """`count - 1` cuts that split the produced bytes (layers, if unknown) evenly.

    Each cut is taken within half a segment of its even share, at the smallest boundary
    there (an articulation point before a place where a pyramid's levels cross).
    """
    if count <= 1 or not cuts:
        return []
    weights = [
        graph.step_bytes(i) or (1 if graph.steps[i].node is not None else 0)
        for i in range(len(graph.steps))
    ]
    total = sum(weights)
    cumulative = []
    running = 0
    for w in weights:
        running += w
        cumulative.append(running)
    kept = {index: graph.boundary_bytes(tensors) for index, tensors in cuts}
    window = total / (2 * count)
    chosen: list[int] = []
    for k in range(1, count):
        target = total * k / count
        near = [p for p, _ in cuts if abs(cumulative[p] - target) <= window]
        if near:
            best = min(near, key=lambda p: (kept[p], abs(cumulative[p] - target)))
        else:
            best = min((p for p, _ in cuts), key=lambda p: abs(cumulative[p] - target))
        if best not in chosen:
            chosen.append(best)
    return sorted(chosen)


def _optimal(graph: Any, cuts: list[Cut]) -> list[int]:
    """The cuts that minimise the predicted peak of the recomputed step (per sample).

    While segment k's backward runs, memory holds the boundaries earlier segments keep
    plus segment k's activations: the peak is the largest such sum. A binary search over
    the peak, each step a dynamic programme over the cut positions (fewest kept bytes that
    reach each cut with every segment under the peak), finds the lowest; a tensor crossing
    several cuts (a pyramid's C3) is kept once, by the segment that computes it.
    """
    if not cuts:
        return []
    cumulative = []
    running = 0
    for i in range(len(graph.steps)):
        running += graph.step_bytes(i) or (1 if graph.steps[i].node is not None else 0)
        cumulative.append(running)
    producer = {t: i for i, s in enumerate(graph.steps) for t in s.outputs}
    positions = [index for index, _ in cuts]
    boundary = [
        [(producer.get(t, -1), graph.tensor_bytes(t) or 0) for t in tensors] for _, tensors in cuts
    ]
    end = len(graph.steps) - 1

    def base(q: int) -> int:
        return cumulative[q] if q >= 0 else 0

    def solve(peak: int) -> list[int] | None:
        held: dict[int, int] = {-1: 0}
        parent: dict[int, int] = {}
        starts = [-1]
        for j, p in enumerate(positions):
            best = None
            for q in starts:
                if held[q] + cumulative[p] - base(q) > peak:
                    continue
                value = held[q] + sum(b for at, b in boundary[j] if at > q)
                if best is None or value < best:
                    best, parent[p] = value, q
            if best is not None:
                held[p] = best
                starts.append(p)
        finals = [q for q in starts if held[q] + cumulative[end] - base(q) <= peak]
        if not finals:
            return None
        q = min(finals, key=lambda q: held[q])
        chosen = []
        while q != -1:
            chosen.append(q)
            q = parent[q]
        return sorted(chosen)

    low = max(cumulative[i] - (cumulative[i - 1] if i else 0) for i in range(end + 1))
    high = cumulative[end]
    best = solve(high) or []
    while high - low > max(1, high // 1000):
        middle = (low + high) // 2
        found = solve(middle)
        if found is None:
            low = middle + 1
        else:
            best, high = found, middle
    return best


def kept_bytes(graph: Any, cuts: list[Cut], chosen: list[int], batch: int = 1) -> int:
    """Bytes of the tensors the chosen cuts keep (a tensor crossing several counts once)."""
    at = dict(cuts)
    tensors = {t for index in chosen for t in at[index]}
    return graph.boundary_bytes(sorted(tensors), batch)


def _within(graph: Any, cuts: list[Cut], budget: int, batch: int) -> list[int]:
    best: list[int] = []
    for count in range(2, min(len(cuts), MAX_SEGMENTS) + 2):
        chosen = _balanced(graph, cuts, count)
        if kept_bytes(graph, cuts, chosen, batch) <= budget:
            best = chosen if len(chosen) >= len(best) else best
    if not best:
        smallest = min(graph.boundary_bytes(tensors, batch) for _, tensors in cuts)
        raise RecomputeError(
            f"a budget of {format_size(budget)} for what recompute keeps is too small: the "
            f"smallest boundary needs {format_size(smallest)} at batch {batch}"
        )
    return best


def recomputed_flags(graph: Any, chosen: list[int], segments: list[Any], auto: bool) -> list[bool]:
    """Which segments to recompute: never the last; with `auto`, keep more where it is free.

    Recomputing the last segment saves nothing (backward needs its activations at once) and
    costs its forward again. With `auto` ("sqrt"), a segment is also kept whole, from the
    end backwards, where the peak this model predicts does not rise: while segment k's
    backward runs, memory holds what earlier segments keep (their boundary if recomputed,
    all their activations if not) plus segment k's activations.
    """
    starts = [0, *(end + 1 for end in chosen)]
    ends = [*chosen, len(graph.steps) - 1]
    produced = [
        sum(graph.step_bytes(i) for i in range(a, b + 1)) for a, b in zip(starts, ends, strict=True)
    ]
    kept = [graph.boundary_bytes(seg.outputs) for seg in segments]
    flags = [True] * (len(segments) - 1) + [False]

    def peak(f: list[bool]) -> int:
        held, highest = 0, 0
        for k, recomputed in enumerate(f):
            highest = max(highest, held + produced[k])
            held += kept[k] if recomputed else produced[k]
        return highest

    if auto:
        limit = peak(flags)
        for k in range(len(segments) - 2, -1, -1):
            flags[k] = False
            if peak(flags) > limit:
                flags[k] = True
    return flags
