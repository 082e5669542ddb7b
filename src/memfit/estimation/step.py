"""One step of the replay: a small state machine over a traced step's ops and buffers.

`StepRun` plays one training step of a `memfit.backend.tf_graph.StepGraph` through a model of
TensorFlow's BFC allocator (`memfit.estimation.bfc.BFC`): each op the scheduler hands out (a
fixed order from `memfit.estimation.order`, or a ready queue) gets its outputs' buffers, holds
its kernel's scratch while it runs, and frees what it was the last to read. `Replay` is what
a step found: its peak above what was in use before it, and what was live then (`Live`).
`memfit.estimation.simulate.replay` sets up the allocator and plays the steps.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from memfit.estimation.bfc import BFC, round_up
from memfit.estimation.order import depends_on, execution_events, graph_dependencies


@dataclass
class Live:
    """A buffer live at the peak: its bytes, category, layer and producing op."""

    nbytes: int
    category: str
    layer: str
    op: str


@dataclass
class Replay:
    """What the replay found: the step's own peak (above resident) and what was live then."""

    step_peak_bytes: int
    peak_op: str
    peak_op_type: str
    peak_phase: str
    peak_layer: str
    live: list[Live] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    resident_bytes: int = 0
    peak_bytes: int = 0
    activations_kept_bytes: int = 0
    # The peak had one live request taken a larger free chunk whole (`BFC.raced_peak`).
    raced_peak_bytes: int = 0


_SUFFIX = re.compile(r"_\d+$")


def layer_of(name: str, layers: set[str]) -> str:
    """The Keras layer an op belongs to, from its name scopes ("" when none matches)."""
    for segment in name.split("/"):
        if segment in layers:
            return segment
        stripped = _SUFFIX.sub("", segment)
        if stripped in layers:
            return stripped
    return ""


def phase_of(name: str, op_type: str, optimizer_name: str) -> str:
    """`forward`, `backward` (under the gradient tape) or `update` (the optimizer's ops)."""
    if name.startswith("gradient_tape/"):
        return "backward"
    head = name.split("/", 1)[0]
    if head == optimizer_name or _SUFFIX.sub("", head) == optimizer_name:
        return "update"
    return "forward"


class StepStructure(NamedTuple):
    """What every replay of a graph reads and none changes (`step_structure`).

    Attributes:
        index: op name -> its index in `graph.ops`.
        consumers: tensor name -> the ops that read it (once per read).
        preds: each op's predecessors (data and control).
        succs: each op's successors.
        phases: each op's phase (`phase_of`).
        layers: each op's layer label.
        feeds_update: the tensors the optimizer's ops read (gradients).
        reads: tensor name -> how many reads it waits for (`consumers`, counted): a step's
            pending reads start from it.
        unread: each op's outputs that no op reads and the step does not return: freed as
            the op finishes.
        forwardable: for each op whose kernel may take over an input buffer
            (`OpInfo.forwards`), the inputs it may take over (not the step's arguments,
            which the caller holds), each once, with how many times the op reads it.
        scratch_succs: each op's successors (`succs`) whose kernels hold scratch.
    """

    index: dict[str, int]
    consumers: dict[str, list[int]]
    preds: list[set[int]]
    succs: list[list[int]]
    phases: list[str]
    layers: list[str]
    feeds_update: set[str]
    reads: dict[str, int]
    unread: list[tuple[str, ...]]
    forwardable: list[tuple[tuple[str, int], ...]]
    scratch_succs: list[list[int]]


def step_structure(graph: Any) -> StepStructure:
    """What every replay of `graph` reads and none changes, made once per graph.

    A sampled process replays the same graph many times (`memfit.estimation.bounds`): this
    is built once.

    Args:
        graph: the traced step (`memfit.backend.tf_graph.StepGraph`); the structure is
            cached on it.

    Example:
        ```python
        structure = step_structure(graph)
        print(structure.phases[0], structure.layers[0])
        ```
    """
    cached = graph.__dict__.get("_replay_structure")
    if cached is not None and cached[0] is graph.ops:
        return cached[1]
    ops = graph.ops
    index = {op.name: i for i, op in enumerate(ops)}
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        for name in op.inputs:
            consumers[name].append(i)
    preds = graph_dependencies(graph)[0]
    # Each op's successors in the order its predecessors' sets list them (a race shuffles
    # them from this order).
    succs: list[list[int]] = [[] for _ in ops]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    phases = [phase_of(op.name, op.type, graph.optimizer_name) for op in ops]
    tree = getattr(graph, "layer_tree", None)
    layers = [tree.layer_of(op.name) if tree else layer_of(op.name, graph.layers) for op in ops]
    # A backward tensor read by the optimizer's ops is a gradient.
    feeds_update: set[str] = set()
    for i, op in enumerate(ops):
        if phases[i] == "update":
            feeds_update.update(op.inputs)
    fetched = set(graph.fetches)
    unread = [
        tuple(name for name in op.outputs if name not in consumers and name not in fetched)
        for op in ops
    ]
    reads = {name: len(c) for name, c in consumers.items()}
    arguments = set(graph.arguments)
    forwardable = [
        tuple(
            (name, op.inputs.count(name))
            for name in dict.fromkeys(op.inputs)
            if name not in arguments
        )
        if op.forwards
        else ()
        for op in ops
    ]
    structure = StepStructure(
        index,
        dict(consumers),
        preds,
        succs,
        phases,
        layers,
        feeds_update,
        reads,
        unread,
        forwardable,
        [[j for j in s if ops[j].scratch_bytes] for s in succs],
    )
    graph.__dict__["_replay_structure"] = (ops, structure)
    return structure


class StepRun:
    """One step of the replay, as a small state machine over the step's ops and buffers.

    Each op the scheduler hands out moves through three states: `start` (its outputs take
    a buffer: a view of an input, an input buffer it takes over, or a new allocation),
    `work` (its kernel's scratch is held, and the op beside it; the peak is noted) and
    `finish` (inputs whose last consumer it was, and outputs nothing reads, are freed).
    An order with ends (`order.execution_events`) finishes an op at its end: under several
    inter-op threads the ops the other threads start meanwhile find its inputs still held
    (they cannot take such a buffer over, and an update copies a weight it still reads). A
    buffer is live from its allocation until its last reference goes; the variables'
    buffers hold one reference each for the life of the step.

    Args:
        graph: the traced step (`memfit.backend.tf_graph.StepGraph`).
        bfc: the allocator, in the state the steps before left it.
        variables: each variable's buffer in `bfc` (None: no variables).
        order: op indices in the order to run them, with `~i` where op `i` ends (without
            any, each op ends as it starts); None: `order.execution_events`, or under `race`
            a ready queue.
        seed: another process's order: the ready queue's successors are shuffled by it.
        race: under several inter-op threads, run a ready queue instead of a fixed order.
        copies: update ops that copy their variable to a new buffer whatever the reads
            (copy-on-write under several inter-op threads, `simulate.rehomed_updates`).

    Example:
        ```python
        result = StepRun(graph, BFC(None), None, None, None, False).run()
        print(result.step_peak_bytes, result.peak_op)
        ```
    """

    def __init__(
        self,
        graph: Any,
        bfc: BFC,
        variables: dict[str, int] | None,
        order: list[int] | None,
        seed: float | None,
        race: bool,
        copies: frozenset[int] = frozenset(),
    ) -> None:
        self.graph = graph
        self.ops = graph.ops
        structure = step_structure(graph)
        self.index, self.preds, self.unread = structure.index, structure.preds, structure.unread
        self.forwardable = structure.forwardable
        self.phases, self.layers = structure.phases, structure.layers
        self.feeds_update = structure.feeds_update
        preds = structure.preds
        self.bfc = bfc
        self.copies = copies
        # Each tensor's reads still to come; at none it is freed (unless the step returns it).
        self.pending = dict(structure.reads)
        self.fetched = set(graph.fetches)
        self.arguments = set(graph.arguments)
        self.buffer_of: dict[str, int | None] = dict.fromkeys(graph.arguments)
        self.size: dict[int, int] = {}
        self.request: dict[int, int] = {}
        self.refs: dict[int, int] = defaultdict(int)
        self.owner: dict[int, int] = {}
        # The op that allocated each buffer: its layer is the buffer's, as in TensorFlow's
        # memory profile (`memfit measure --explain`), even after an op forwarded it.
        self.made_by: dict[int, int] = {}
        self.category: dict[int, str] = {}
        self.threads = max(1, int(graph.inter_op_threads))
        self.start_bytes = bfc.in_use
        self.result = Replay(0, "", "", "forward", "")
        self.forward_live = 0
        # Each variable's buffer: the variable holds one reference; a read shares it.
        self.held = variables if variables is not None else {}
        # The variables' buffers as the step starts, and those of them still live at the peak
        # (a variable copied before the peak has freed its old buffer): `read_back`.
        self.held_at_start = set(self.held.values())
        self.held_at_peak = set(self.held_at_start)
        self.held_freed: dict[int, int] = {}
        for name, handle in self.held.items():
            self.size[handle] = bfc.size_of(handle)
            self.request[handle] = round_up(graph.variables[name][0])
            self.refs[handle] = 1
            self.owner[handle] = -1
        # The live set at the peak is read once the step ends (a step's peak rises op after
        # op, and reading ~1,000 live buffers at each rise was most of the replay's time): a
        # new peak records its `clock`; a buffer was live then if it was allocated before and
        # freed after. A buffer live then whose owner changes, or whose address is allocated
        # again, is kept as it was in `before_change` first.
        self.clock = 0
        self.born: dict[int, int] = {}
        self.died: dict[int, int] = {}
        self.before_change: dict[int, tuple[int, str, int, int, int | None]] = {}
        self.peak_at: tuple[int, int, list[tuple[int, int, str, int]]] | None = None
        # The scheduler: a fixed order (the executor's threads: `order.execution_order`), or
        # under `race` a ready queue. Under several threads, `queued` holds the ops ready and
        # not yet run.
        self.indegree = [len(p) for p in preds]
        self.recent: list[int] = []
        self.position: dict[int, int] = {}
        self.fixed = order is not None or self.threads == 1 or not race
        if self.fixed:
            self.ready = deque(order if order is not None else execution_events(graph))
            # An order with ends (`~i`) lets an op's inputs go at its end, not at its start.
            self.ends = any(e < 0 for e in self.ready)
            # The order is given: the ready ops matter only as the company of an op's
            # scratch (`work`), so only the ops whose kernels hold scratch are followed.
            self.succs = structure.scratch_succs
            ready_now = (
                i for i, op in enumerate(self.ops) if self.indegree[i] == 0 and op.scratch_bytes
            )
            self.queued = set(ready_now) if self.threads > 1 else set()
        else:
            # Several inter-op threads: which of the ops made ready together runs first is a
            # race, the successors of each op met in an order drawn from `seed`.
            self.succs = _shuffled(structure.succs, seed) if seed is not None else structure.succs
            self.ready = deque(i for i in range(len(self.ops)) if self.indegree[i] == 0)
            self.queued = set(self.ready)
            self.ends = False

    # Buffers.

    def _record(self, buffer: int) -> tuple[int, str, int, int, int | None]:
        return (
            self.owner[buffer],
            self.category.get(buffer, ""),
            self.size[buffer],
            self.request[buffer],
            self.made_by.get(buffer),
        )

    def _live_at(self, buffer: int, at: int) -> bool:
        return self.born.get(buffer, 0) <= at < self.died.get(buffer, at + 1)

    def keep(self, buffer: int) -> None:
        """Note `buffer` as it is, if it was live at the peak so far and is about to change."""
        at = self.peak_at
        if at is not None and buffer not in self.before_change and self._live_at(buffer, at[0]):
            self.before_change[buffer] = self._record(buffer)

    def allocate(self, nbytes: int, op_index: int) -> int:
        buffer = self.bfc.allocate(nbytes)
        if buffer in self.died:
            self.keep(buffer)
        self.clock += 1
        self.born[buffer] = self.clock
        self.died.pop(buffer, None)
        self.size[buffer] = self.bfc.size_of(buffer)
        self.request[buffer] = round_up(nbytes)
        self.refs[buffer] = 1
        self.owner[buffer] = self.made_by[buffer] = op_index
        self.category[buffer] = self.phases[op_index]
        self.count_forward(buffer, +1)
        return buffer

    def count_forward(self, buffer: int, sign: int) -> None:
        # Bytes the forward pass made that are still live; their highest is what the
        # forward pass keeps for the backward pass.
        if self.category.get(buffer) == "forward":
            self.forward_live += sign * self.request[buffer]
            if self.forward_live > self.result.activations_kept_bytes:
                self.result.activations_kept_bytes = self.forward_live

    def release_buffer(self, buffer: int) -> None:
        self.refs[buffer] -= 1
        if self.refs[buffer] == 0:
            self.count_forward(buffer, -1)
            self.clock += 1
            self.died[buffer] = self.clock
            if buffer in self.held_at_start:
                self.held_freed.setdefault(buffer, self.clock)
            self.bfc.free(buffer)

    def release(self, name: str) -> None:
        buffer = self.buffer_of.get(name)
        if buffer is not None:
            self.release_buffer(buffer)

    def take_over(self, buffer: int, op_index: int) -> None:
        """Op `op_index` takes over `buffer` for its output (forwarding, an adopted value)."""
        self.refs[buffer] += 1
        self.keep(buffer)
        self.owner[buffer] = op_index

    # An op's states.

    def start(self, i: int, op: Any) -> bool:
        """Give the op's outputs their buffers; False when the op is done already (a read)."""
        held, buffer_of = self.held, self.buffer_of
        if op.variable in held:
            if op.type == "ReadVariableOp":
                buffer = held[op.variable]
                self.refs[buffer] += 1
                buffer_of[op.outputs[0]] = buffer
                return False
            self.assign(i, op)
        for k, name in enumerate(op.outputs):
            source = op.alias[k] if k < len(op.alias) else None
            if source is not None:
                buffer = buffer_of.get(op.inputs[source])
                buffer_of[name] = buffer
                if buffer is not None:
                    self.refs[buffer] += 1
                continue
            nbytes = op.output_bytes[k]
            if nbytes <= 0:
                buffer_of[name] = None
                continue
            buffer = self.forwarded(i, op, nbytes) if k == 0 and op.forwards else None
            buffer_of[name] = buffer if buffer is not None else self.allocate(nbytes, i)
        return True

    def forwarded(self, i: int, op: Any, nbytes: int) -> int | None:
        """The input buffer op `i` takes over for output 0, if one may be taken over.

        `forward_input_or_allocate_output`: an input of the same size whose buffer nothing
        else holds and whose last consumer this op is.
        """
        wanted = round_up(nbytes)
        for tensor, reads in self.forwardable[i]:
            candidate = self.buffer_of.get(tensor)
            if (
                candidate is not None
                and self.request[candidate] == wanted
                and self.refs[candidate] == 1
                and self.pending.get(tensor, 0) == reads
            ):
                self.take_over(candidate, i)
                self.count_forward(candidate, -1)
                self.category[candidate] = self.phases[i]
                self.count_forward(candidate, +1)
                return candidate
        return None

    def assign(self, op_index: int, op: Any) -> None:
        # AssignVariableOp adopts its value's buffer when nothing else holds it, else copies
        # in place; AssignAdd/Sub update in place. Either first copies the variable to a new
        # buffer while a read of its old value is still live (copy-on-write,
        # resource_variable_ops.cc), and the variable keeps the new buffer for good.
        held = self.held
        old = held[op.variable]
        if op.type == "AssignVariableOp" and len(op.inputs) > 1:
            value = op.inputs[1]
            candidate = self.buffer_of.get(value)
            if (
                candidate is not None
                and value not in self.arguments
                and self.pending.get(value, 0) == 1
                and self.refs[candidate] == 1
                and self.request[candidate] == self.request[old]
            ):
                self.take_over(candidate, op_index)
                held[op.variable] = candidate
                self.release_buffer(old)
                return
        if self.refs[old] > 1 or op_index in self.copies:
            held[op.variable] = self.allocate(self.request[old], op_index)
            self.release_buffer(old)

    def work(self, i: int, op: Any) -> None:
        """Hold the kernel's scratch (and that of the ops that may run beside it); note the peak."""
        extra: list[tuple[int, int, str, int]] = []
        scratch: list[int] = []
        threads = self.threads
        if op.scratch_bytes:
            jobs = [(op.scratch_bytes, i)]
            if threads > 1:
                # Ops that may run beside this one: ready now, or a recent op with scratch
                # that this one does not depend on (a weight gradient still being computed).
                ops = self.ops
                beside = {j for j in self.queued if ops[j].scratch_bytes}
                beside.update(
                    j for j in self.recent if not depends_on(i, j, self.preds, self.position)
                )
                jobs += sorted((ops[j].scratch_bytes, j) for j in beside)[-(threads - 1) :]
            self.recent = [*self.recent[-(threads - 1) :], i]
            for nbytes, j in jobs:
                handle = self.bfc.allocate(nbytes)
                scratch.append(handle)
                extra.append((round_up(nbytes), self.bfc.size_of(handle), "workspace", j))
        now = self.bfc.in_use - self.start_bytes
        if now > self.result.step_peak_bytes:
            self.result.step_peak_bytes = now
            self.peak_at = (self.clock, i, extra)
            self.before_change.clear()
        for handle in scratch:
            self.bfc.free(handle)

    def finish(self, op_index: int) -> None:
        pending, fetched = self.pending, self.fetched
        for tensor in self.ops[op_index].inputs:
            pending[tensor] -= 1
            if pending[tensor] == 0 and tensor not in fetched:
                self.release(tensor)
        for name in self.unread[op_index]:
            self.release(name)
        if self.threads > 1:
            for j in self.succs[op_index]:
                self.indegree[j] -= 1
                if self.indegree[j] == 0:
                    if not self.fixed:
                        self.ready.append(j)
                    self.queued.add(j)

    # The step.

    def run(self) -> Replay:
        """Run every op through its states; free the step's results; read the peak back."""
        ops, result, ready = self.ops, self.result, self.ready
        while ready:
            i = ready.popleft()
            if i < 0:  # the op's end (`order.execution_events`): its inputs are let go now
                self.finish(~i)
                continue
            self.queued.discard(i)
            op = ops[i]
            self.position[i] = len(result.order)
            result.order.append(op.name)
            if self.start(i, op):
                self.work(i, op)
            if not self.ends:
                self.finish(i)
        # The step's results go back to the caller, who frees them before the next step.
        kept = set(self.held.values())
        for buffer, count in list(self.refs.items()):
            if count > 0 and buffer not in kept:
                self.refs[buffer] = 0
                self.clock += 1
                self.died[buffer] = self.clock
                self.bfc.free(buffer)
        if self.peak_at is not None:
            self.read_back()
        # Label what was live at the peak.
        for item in result.live:
            if item.category == "backward" and _feeds(item.op, ops, self.index, self.feeds_update):
                item.category = "gradients"
            elif item.category == "forward":
                item.category = "activations"
            elif item.category in ("backward", "update"):
                item.category = "temporaries"
        return result

    def read_back(self) -> None:
        """The live set at the peak: buffers live at its clock, as they were then."""
        assert self.peak_at is not None
        at, op_index, extra = self.peak_at
        self.peak_at = None
        freed = self.held_freed
        self.held_at_peak = {b for b in self.held_at_start if freed.get(b, at + 1) > at}
        ops, layers = self.ops, self.layers
        live = []
        for buffer in self.refs:
            record = self.before_change.get(buffer)
            if record is None:
                if not self._live_at(buffer, at):
                    continue
                record = self._record(buffer)
            o, cat, chunk, wanted, maker = record
            if chunk and o >= 0:
                layer = layers[o if maker is None else maker]
                live.append(Live(wanted, cat, layer, ops[o].name))
                if chunk > wanted:
                    live.append(Live(chunk - wanted, "fragmentation", layer, ops[o].name))
        for nbytes, chunk, cat, o in extra:
            live.append(Live(nbytes, cat, layers[o], ops[o].name))
            if chunk > nbytes:
                live.append(Live(chunk - nbytes, "fragmentation", layers[o], ops[o].name))
        op = ops[op_index]
        result = self.result
        result.live = live
        result.peak_op = op.name
        result.peak_op_type = op.type
        result.peak_phase = self.phases[op_index]
        result.peak_layer = layers[op_index]


def _shuffled(succs: list[list[int]], seed: float) -> list[list[int]]:
    """Each op's successors in an order drawn from `seed` (shuffled copies; `succs` is kept).

    A list of one successor draws nothing from the seed and is passed on as it is.
    """
    shuffle = random.Random(seed).shuffle
    drawn = [list(s) if len(s) > 1 else s for s in succs]
    for s in drawn:
        if len(s) > 1:
            shuffle(s)
    return drawn


def _feeds(op_name: str, ops: list[Any], index: dict[str, int], feeds_update: set[str]) -> bool:
    op = ops[index[op_name]]
    return any(name in feeds_update for name in op.outputs)
