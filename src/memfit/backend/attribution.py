"""Which Keras layer an op belongs to, and which kind of memory; shared by measure and estimate.

Keras runs each layer's call under a name scope of the layer's name, and TensorFlow makes a
scope name unique within a graph by appending `_1`, `_2`, ...: the first `conv2d` layer's ops
become `functional_1/conv2d_1/Conv2D`, the layer named `conv2d_1` gets `conv2d_1_2/...`, and
nested models nest their scopes (`retina_net_backbone_1/backbone_1/conv1_conv_1/Conv2D`). A
`LayerTree` knows every layer's path in the model and resolves an op name by walking its
scopes down that tree, so a layer name used twice (the same `conv2d_0` in two prediction
heads) stays two layers, labelled by the shortest unique path (`box_head/conv2d_0`).

This module is pure Python (no TensorFlow): `memfit.backend` builds the tree from a model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# The kinds of memory a step's bytes are attributed to, by `memfit.estimate`'s breakdown and
# by `memfit measure --explain` alike (see `memfit.measuring.explain` for what each holds).
KINDS = (
    "weights",
    "optimizer_slots",
    "other_state",
    "inputs",
    "activations",
    "gradients",
    "temporaries",
    "workspace",
    "fragmentation",
)
_SUFFIX = re.compile(r"_\d+$")
# Scopes TensorFlow adds around a function's body; never a layer.
_WRAPPERS = ("StatefulPartitionedCall", "PartitionedCall")

Path = tuple[str, ...]


def strip_suffix(segment: str) -> str:
    """A scope segment without the `_N` TensorFlow appended to make it unique."""
    return _SUFFIX.sub("", segment)


def scope_segments(op_name: str) -> list[str]:
    """An op name's scope segments, without the function-call wrappers TensorFlow adds.

    Example:
        ```python
        scope_segments("StatefulPartitionedCall/functional_1/conv2d_1/Relu")
        # ["functional_1", "conv2d_1", "Relu"]
        ```
    """
    return [s for s in op_name.split("/") if s and not s.startswith(_WRAPPERS)]


class LayerTree:
    """The model's layers as paths from the model, for attributing op names to layers.

    Args:
        paths: one path per layer, from the model down (`("box_head", "conv2d_0")`); the
            model itself is not a path.

    Example:
        ```python
        tree = LayerTree([("conv2d",), ("conv2d_1",), ("dense",)])
        tree.layer_of("functional_1/conv2d_1_2/Relu")  # "conv2d_1"
        ```
    """

    def __init__(self, paths: Iterable[Sequence[str]]) -> None:
        self.paths: list[Path] = [tuple(p) for p in paths if p]
        self._children: dict[Path, dict[str, Path]] = {}
        self._by_name: dict[str, list[Path]] = {}
        for path in self.paths:
            self._children.setdefault(path[:-1], {})[path[-1]] = path
            self._by_name.setdefault(path[-1], []).append(path)
        self.labels = {path: self._label(path) for path in self.paths}
        self._strip_first = True
        self._cache: dict[str, str] = {}

    def _label(self, path: Path) -> str:
        """The shortest tail of `path` that no other layer's path ends with."""
        for size in range(1, len(path) + 1):
            tail = path[-size:]
            if sum(1 for other in self.paths if other[-size:] == tail) == 1:
                return "/".join(tail)
        return "/".join(path)

    def _match(self, segment: str, names: dict[str, Path] | None, strip_first: bool) -> Path | None:
        stripped = strip_suffix(segment)
        order = [stripped, segment] if strip_first else [segment, stripped]
        for name in order:
            if names is not None:
                if name in names:
                    return names[name]
            elif len(self._by_name.get(name, [])) == 1:
                return self._by_name[name][0]
        return None

    def resolve(self, op_name: str, strip_first: bool | None = None) -> Path | None:
        """The innermost layer whose scope holds `op_name` (None: no layer's).

        Scopes are walked from the outside in: a segment that names a child of the layer
        reached so far descends into it; one that names a layer elsewhere (its name unique
        in the model) jumps there; others (the model's own scope, op names) are skipped.
        """
        strip = self._strip_first if strip_first is None else strip_first
        return self._walk(tuple(scope_segments(op_name)[:-1]), strip)

    def _walk(self, scope: Path, strip: bool) -> Path | None:
        """`resolve` of the scope segments `scope` (the op's own name left off).

        The walk to a scope is the walk to its parent scope and one more segment; each
        scope is walked once (a step's ops share their scopes: a layer's kernels and their
        gradients) and kept.
        """
        walked = self.__dict__.setdefault("_walked", {})
        key = (strip, scope)
        if key not in walked:
            found = self._walk(scope[:-1], strip) if len(scope) > 1 else None
            walked[key] = self._descend(found, scope[-1], strip) if scope else None
        return walked[key]

    def _descend(self, found: Path | None, segment: str, strip: bool) -> Path | None:
        """Where the walk goes from the layer `found` (None: the model) on `segment`."""
        step = self._match(segment, self._children.get(found or ()), strip)
        if step is None:
            step = self._match(segment, None, strip)
            if step is not None and found is not None and found[: len(step)] == step:
                step = None  # the layer reached so far, or one around it: stay
        return found if step is None else step

    def choose_policy(self, op_names: Iterable[str]) -> None:
        """Decide from a graph's op names whether `_N` is TensorFlow's (stripped first).

        Each policy resolves every op; the one reaching more distinct layers reads the
        names right (the other folds `conv2d` and `conv2d_1` into one layer).
        """
        names = list(op_names)
        scores = {}
        for strip in (True, False):
            scores[strip] = len({self.resolve(n, strip) for n in names} - {None})
        self._strip_first = scores[True] >= scores[False]
        self._cache.clear()

    def layer_of(self, op_name: str) -> str:
        """The label of the layer `op_name` belongs to ("" when none)."""
        if op_name not in self._cache:
            path = self.resolve(op_name)
            self._cache[op_name] = self.labels[path] if path else ""
        return self._cache[op_name]

    def label(self, path: Sequence[str]) -> str:
        """The label of the layer at `path` (its name, or its shortest unique path)."""
        return self.labels.get(tuple(path), "/".join(path))


@dataclass
class AllocationRecord:
    """One call of the allocator, as TensorFlow's profiler recorded it.

    Attributes:
        event: `"alloc"` or `"free"`.
        time_ps: when (picoseconds; only the order matters).
        addr: the chunk's address (pairs a free with its allocation).
        nbytes: the chunk's bytes (what the allocator counts as in use).
        requested_bytes: what the op asked for.
        in_use_bytes: the allocator's bytes in use after this call.
        op: the op that asked (`tf_op`), "" for frees.
        region: `"output"` (an op's output), `"temp"` (a kernel's scratch), or "".
        dtype: the tensor's dtype name ("" when unknown).
        shape: the tensor's shape (None when unknown).
        allocator: the allocator's name.
    """

    event: str
    time_ps: int
    addr: int
    nbytes: int
    requested_bytes: int = 0
    in_use_bytes: int = 0
    op: str = ""
    region: str = ""
    dtype: str = ""
    shape: list[int] | None = None
    allocator: str = ""

    @property
    def delta(self) -> int:
        """How the bytes in use changed with this call."""
        return self.nbytes if self.event == "alloc" else -self.nbytes


@dataclass
class VariableInfo:
    """A variable resident before the step: its layer, kind, size, shape and dtype."""

    name: str
    layer: str
    kind: str  # weights, optimizer_slots or other_state
    nbytes: int
    shape: list[int]
    dtype: str
    trainable: bool = False


@dataclass
class StepInfo:
    """What the explanation needs to know about the model (built by `memfit.backend`).

    Attributes:
        tree: the model's layers, for attributing op names.
        variables: every variable resident before the step, model's and optimizer's.
        optimizer_name: the optimizer's name scope (`adam`), whose ops are the update.
        batch_bytes: the batch the measured steps read, made before them (resident:
            `inputs`, not `other_state`).
    """

    tree: LayerTree
    variables: list[VariableInfo] = field(default_factory=list)
    optimizer_name: str = ""
    batch_bytes: int = 0
