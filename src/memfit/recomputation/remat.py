"""Recompute: gradient checkpointing that saves memory on TensorFlow.

`memfit.recompute(model)` cuts a functional or Sequential Keras model's layer graph into
segments at its articulation points (tensors every later layer depends on: between ResNet
or MobileNet blocks, between a detector's backbone stages) and, while the model trains, runs
each segment's forward under `tf.recompute_grad`: only the segment boundaries are kept for
backward, and each segment's activations are computed again when its gradients are needed.

It changes the forward of the user's own model object (its `call`, while applied), not a
copy: the optimizer, loss, metrics, `compute_loss`/`train_step` overrides and callbacks stay
the model's own, so `model.fit`, `memfit.fit`, `memfit.GuardedStep` and `memfit.measure` all
train exactly what they would without it. Inference (`training=False`) runs the graph as
before.

Keras' own `keras.RematScope` does not save memory on the TensorFlow backend (it raised the
peak of a 6-conv CNN from 210 to 311 MiB in mode `"activations"`; mode `"full"` raised a
ValueError inside `Functional.call`): this module is what memfit offers instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit.backend import tf as tfb
from memfit.backend import tf_layer_graph as lg
from memfit.backend import tf_recompute as rc
from memfit.errors import RecomputeError
from memfit.recomputation.cuts import Cut, Segments, choose_cuts, kept_bytes, recomputed_flags
from memfit.serialize import json_dict
from memfit.sizes import format_size, parse_size


@dataclass
class SegmentInfo:
    """One segment: the layers it runs and the activations it recomputes.

    Attributes:
        first_layer, last_layer: names of its first and last layer.
        layers: how many layers (graph operations) it runs.
        activation_bytes: bytes its layers produce per sample (recomputed in backward),
            from the symbolic shapes (0 where a shape is undefined).
        boundary: name of the layer after which the segment ends (None for the last).
        boundary_bytes: bytes per sample of the tensors crossing that cut (kept for
            backward): one articulation tensor, or a few where a backbone hands several
            stage outputs to a feature pyramid.
        boundary_tensors: how many tensors cross the cut.
        recomputed: whether the segment is recomputed in backward (the last never is as a
            whole: its activations are needed at once).
        recomputed_calls: in a segment kept whole, how many calls of composite layers (layers
            holding layers with weights: a feature pyramid, a detector's shared heads, once
            per pyramid level) are recomputed each on its own, one after another in backward.
    """

    first_layer: str
    last_layer: str
    layers: int
    activation_bytes: int
    boundary: str | None
    boundary_bytes: int
    boundary_tensors: int = 1
    recomputed: bool = True
    recomputed_calls: int = 0


@dataclass
class RecomputeReport:
    """Where memfit cut the model and what it keeps for backward.

    Attributes:
        policy: the `segments=` asked for, as text.
        segments: each segment, in order.
        candidates: how many places the graph can be cut (few tensors cross there).
        kept_bytes: bytes per sample of the boundaries kept for backward (a tensor that
            crosses several cuts counts once).
        activation_bytes: bytes per sample all the model's layers produce.
    """

    policy: str
    segments: list[SegmentInfo] = field(default_factory=list)
    candidates: int = 0
    kept_bytes: int = 0
    activation_bytes: int = 0

    @property
    def boundaries(self) -> list[str]:
        """Names of the layers whose outputs are kept as segment boundaries."""
        return [s.boundary for s in self.segments if s.boundary is not None]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (bytes per sample in `*_bytes`)."""
        return json_dict(self, "policy segments boundaries candidates kept_bytes activation_bytes")

    def __str__(self) -> str:
        recomputed = [s for s in self.segments if s.recomputed]
        largest = max((s.activation_bytes for s in recomputed), default=0)
        calls = sum(s.recomputed_calls for s in self.segments)
        inner = f" and {calls} calls of composite layers in kept segments" if calls else ""
        return (
            f"recompute ({self.policy}): {len(self.segments)} segments at {self.candidates} "
            f"possible cuts, {len(recomputed)} recomputed{inner}; keeps "
            f"{format_size(self.kept_bytes)} of boundaries per sample, recomputes at most "
            f"{format_size(largest)} per sample at a time "
            f"(all layers produce {format_size(self.activation_bytes)} per sample)"
        )


class Recompute:
    """A model's training forward split into recomputed segments (see `memfit.recompute`).

    While applied (`with` block, `apply()`), `model(x, training=True)` runs the segmented
    forward; `remove()` gives the model back its own `call`. Applying is re-entrant.

    Attributes:
        model: the user's model (its layers and weights are the ones trained).
        report: the `RecomputeReport`: segments, boundaries, what is kept.
    """

    def __init__(self, model: Any, segments: Segments = "sqrt", batch_size: int = 1) -> None:
        self.model = model
        try:
            self._graph = lg.layer_graph(model)
        except lg.NoLayerGraphError as exc:
            raise RecomputeError(f"recompute is not applicable: {exc}") from None
        cuts = self._graph.cuts()
        if not cuts:
            raise RecomputeError(
                f"recompute is not applicable: model {model.name!r} has no articulation point "
                f"(no place where at most {lg.MAX_BOUNDARY_TENSORS} tensors carry everything "
                f"later layers need), so it cannot be cut into segments; use micro-batches or "
                f"mixed precision instead"
            )
        chosen = choose_cuts(self._graph, cuts, segments, batch_size)
        plain = rc.segments_from_cuts(self._graph, chosen)
        auto = isinstance(segments, str) and segments.strip().lower() == "sqrt"
        flags = recomputed_flags(self._graph, chosen, plain, auto)
        self._segments = rc.segments_from_cuts(self._graph, chosen, flags)
        self.report = _report(self._graph, cuts, chosen, segments, self._segments)
        self._call = rc.segmented_call(model, self._graph, self._segments)
        self._depth = 0

    def apply(self) -> Recompute:
        """Make the model's training forward the segmented one (until `remove`)."""

        if self._depth == 0:
            rc.patch_call(self.model, self._call)
        self._depth += 1
        return self

    def remove(self) -> None:
        """Undo one `apply`; the last gives the model back its own forward."""

        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            rc.patch_call(self.model, None)

    def __enter__(self) -> Recompute:
        return self.apply()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<memfit.Recompute {self.report}>"


def recompute(model: Any, segments: Segments = "sqrt", *, batch_size: int = 1) -> Recompute:
    """Gradient checkpointing for a functional or Sequential Keras model on TensorFlow.

    Cuts the model's layer graph at articulation points into segments, each run under
    `tf.recompute_grad` while training: backward keeps only segment boundaries and computes
    each segment's activations again. Gradients equal those of the plain step (up to float
    rounding); BatchNorm moving statistics are updated once per step and Dropout draws the
    same mask in the recomputation as in the forward.

    Args:
        model: a built functional or Sequential `keras.Model`. A subclassed model (its
            forward is Python code) or a graph without an articulation point raises
            `RecomputeError` ("recompute is not applicable: ...").
        segments: where to cut.
            `"sqrt"` (default): the cuts that minimise the predicted peak (boundaries kept
            plus the largest segment: about √n segments for n layers, Chen et al. 2016);
            then segments whose activations cost no more to keep than to recompute (a
            narrow tail) are kept whole, to save their second forward. An int: that many
            segments balanced by the bytes their layers produce. A size (`"64MiB"`): keep
            at most that many bytes of boundaries at `batch_size`, with as many segments as
            fit in it. A list of layer names: cut after each of them. `"all"`: cut at every
            articulation point. A cut is possible where at most 4 tensors cross (one
            between ResNet blocks; a backbone's stage outputs on their way to a feature
            pyramid). The last segment is not recomputed as a whole (backward needs it at
            once); inside it, and inside any segment kept whole, each call of a composite
            layer (one holding layers with weights: a feature pyramid, a detector's head
            applied per pyramid level) is recomputed on its own, one call after another.
        batch_size: the batch a size budget is meant for (default 1: per sample).

    Returns:
        A `Recompute`: use it as a context manager around training (`with`), or pass
        `recompute=` to `memfit.fit`, `memfit.GuardedStep` or `memfit.measure`. Its
        `report` says where it cut and what it keeps.

    Example:
        ```python
        model = build_model()              # a compiled Keras model
        with memfit.recompute(model, "sqrt") as plan:
            print(plan.report)
            model.fit(x, y, batch_size=32)
        ```
    """
    if isinstance(model, Recompute):
        return model

    keras = tfb.import_keras()
    if not isinstance(model, keras.Model):
        raise RecomputeError(
            f"recompute is not applicable: expected a keras.Model, got {type(model).__name__}"
        )
    return Recompute(model, segments, batch_size=batch_size)


def as_recompute(model: Any, option: Any) -> Recompute | None:
    """`recompute=` as memfit's functions take it: None/False, True ("sqrt"), a policy, a
    `Recompute` (checked to be for `model`)."""
    if option is None or option is False or option == "none":
        return None
    if isinstance(option, Recompute):
        if option.model is not model:
            raise RecomputeError("recompute= was built for another model; build it for this one")
        return option
    return recompute(model, "sqrt" if option is True else option)


def policy_from_text(text: str) -> Segments:
    """A `segments=` policy from command-line text: `sqrt`, `all`, `4`, `64MiB`, `a,b`.

    Example:
        >>> policy_from_text("4"), policy_from_text("conv1,conv2")
        (4, ['conv1', 'conv2'])
    """
    value = text.strip()
    if value.isdigit():
        return int(value)
    if value.lower() in ("sqrt", "all"):
        return value.lower()
    try:
        parse_size(value)
    except Exception:  # noqa: BLE001 - not a size: layer names
        return [name.strip() for name in value.split(",") if name.strip()]
    return value


def _policy_text(policy: Segments) -> str:
    if isinstance(policy, (str, int)):
        return str(policy)
    return ",".join(policy)


def _report(
    graph: Any, cuts: list[Cut], chosen: list[int], policy: Segments, segments: list[Any]
) -> RecomputeReport:
    tensor_at = dict(cuts)
    report = RecomputeReport(
        policy=_policy_text(policy),
        candidates=len(cuts),
        kept_bytes=kept_bytes(graph, cuts, chosen),
    )
    start = 0
    ends = [*chosen, len(graph.steps) - 1]
    for end, segment in zip(ends, segments, strict=True):
        indices = [i for i in range(start, end + 1) if graph.steps[i].node is not None]
        boundary = tensor_at.get(end) if end != len(graph.steps) - 1 else None
        info = SegmentInfo(
            first_layer=graph.layer_name(indices[0]) if indices else "",
            last_layer=graph.layer_name(indices[-1]) if indices else "",
            layers=len(indices),
            activation_bytes=sum(graph.step_bytes(i) for i in indices),
            boundary=graph.layer_name(end) if boundary is not None else None,
            boundary_bytes=graph.boundary_bytes(boundary) if boundary is not None else 0,
            boundary_tensors=len(boundary) if boundary is not None else 0,
            recomputed=segment.recompute,
            recomputed_calls=sum(1 for part in segment.inner if part.recompute),
        )
        report.segments.append(info)
        report.activation_bytes += info.activation_bytes
        start = end + 1
    return report


# -- recompute as a plan's `remat` ------------------------------------------------------------
MEMFIT_REMAT = "memfit"


def remat_scope(remat: str | None) -> Any:
    """The build scope of a plan's `remat`: `keras.RematScope`, or none for memfit's own.

    `"memfit"` (memfit's recompute, `segments="sqrt"`) wraps the built model's forward
    instead, so the model is built as it is without recompute.

    Args:
        remat: a `keras.RematScope` mode, `"memfit"`, or None.

    Example:
        >>> import contextlib
        >>> isinstance(remat_scope("memfit"), contextlib.nullcontext)
        True
    """
    import contextlib

    if remat is None or remat == MEMFIT_REMAT:
        return contextlib.nullcontext()

    return tfb.import_keras().RematScope(mode=remat)


def remat_recompute(remat: str | None) -> str | None:
    """The `recompute=` policy a plan's `remat` asks for: `"sqrt"` for `"memfit"`, else None.

    Example:
        >>> remat_recompute("memfit"), remat_recompute("activations")
        ('sqrt', None)
    """
    return "sqrt" if remat == MEMFIT_REMAT else None
