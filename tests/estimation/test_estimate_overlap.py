"""Ops side by side under several threads: inputs held to the op's end, reductions' cost.

MobileNetV2's recompute step (224 px, batch 64, two inter-op threads) peaks in
block_1_expand_BN's gradient. TensorFlow's allocator records hold five 150 MiB tensors there
at 160 px (conv output, `Relu6Grad`, `Mul`, `Mul_1`, `BroadcastTo`): `Mul_1` (`dy * x`) starts
on one thread while the other thread's `Sum` (`sum(dy)`) still reads `dy`, so it cannot take
`dy`'s buffer over. The replay let every op's inputs go the moment it started, and costed
the `Sum` at a third of an elementwise product: `Mul_1` took `dy` over and four tensors were
live. This is a small copy of that gradient.
"""

from __future__ import annotations

import math

import pytest

from memfit.backend.tf_graph import OpInfo, StepGraph
from memfit.estimation import order
from memfit.estimation.bfc import BFC
from memfit.estimation.order import execution_events, execution_order, op_seconds
from memfit.estimation.simulate import replay
from memfit.estimation.step import StepRun

MIB = 1 << 20
IMAGE = (4, 32, 32, 1024)  # 16 MiB of float32


def _op(name: str, kind: str, inputs: list[str], shape: tuple[int, ...], **kw) -> OpInfo:
    info = OpInfo(name, kind, inputs, [f"{name}:0"], [4 * math.prod(shape)], **kw)
    info.output_shapes = [(shape, 4)]
    return info


def _bn_gradient(threads: int) -> StepGraph:
    """A batch norm's gradient after its `Relu6Grad`: `sum(dy)`, `dy * scale`, `dy * x`."""
    channels = IMAGE[-1:]
    ops = [
        _op("x", "Relu", [], IMAGE),
        _op("scale", "Const", [], channels),
        _op("gradient_tape/dy", "Relu6Grad", ["x:0"], IMAGE),
        _op("gradient_tape/sum", "Sum", ["gradient_tape/dy:0"], channels),
        _op("gradient_tape/dx", "Mul", ["gradient_tape/dy:0", "scale:0"], IMAGE),
        _op("gradient_tape/dyx", "Mul", ["gradient_tape/dy:0", "x:0"], IMAGE, forwards=True),
        _op("gradient_tape/dscale", "Sum", ["gradient_tape/dyx:0"], channels),
        _op("gradient_tape/mean", "BroadcastTo", ["gradient_tape/sum:0"], IMAGE),
        _op(
            "gradient_tape/div",
            "RealDiv",
            ["gradient_tape/mean:0", "scale:0"],
            IMAGE,
            forwards=True,
        ),
        # The variance's gradient reads `x` again, last: `x` stays live throughout.
        _op("gradient_tape/dvar", "Sum", ["x:0"], channels, control_inputs=["gradient_tape/div"]),
    ]
    fetches = ["gradient_tape/dx:0", "gradient_tape/dscale:0", "gradient_tape/div:0"]
    graph = StepGraph(ops, [], [], fetches, {}, {}, set(), "opt", threads)
    # Grappler's order, as in the traced step: `dy`'s consumers `dx`, `dyx`, `sum`. The thread
    # that ran `dy` keeps `sum` and hands `dx` and `dyx` to the pool; the other takes `dx`.
    ranked = ["x", "scale", "gradient_tape/dy", "gradient_tape/dx", "gradient_tape/dyx"]
    graph.node_rank = {name: i for i, name in enumerate(ranked)}
    return graph


def _peak(graph: StepGraph, events: list[int]) -> int:
    return StepRun(graph, BFC(None), None, events, None, False).run().step_peak_bytes


def test_an_op_started_while_another_reads_its_input_cannot_take_it_over():
    graph = _bn_gradient(threads=2)
    x, scale, dy, total, dx, dyx, dscale, mean, div, dvar = range(10)
    # `dyx` starts on one thread while `sum` (which reads `dy`) still runs on the other.
    side_by_side = [x, ~x, scale, ~scale, dy, ~dy, total, dx, ~dx, dyx, ~dyx, dscale, ~dscale]
    side_by_side += [~total, mean, ~mean, div, ~div, dvar, ~dvar]
    # The same starts, each op done before the next starts (the replay before).
    at_once = [e for e in side_by_side if e >= 0]
    at_once = [e for i in at_once for e in (i, ~i)]
    # Side by side: x, dy, dx and dyx's own buffer (dy is still read by `sum`).
    assert 4 * 16 * MIB <= _peak(graph, side_by_side) < 4 * 16 * MIB + MIB
    # One after another: `dyx` takes `dy` over, three 16 MiB buffers.
    assert 3 * 16 * MIB <= _peak(graph, at_once) < 3 * 16 * MIB + MIB


def test_execution_events_start_as_the_order_and_end_each_op_once():
    for threads in (1, 2):
        graph = _bn_gradient(threads)
        events = execution_events(graph)
        assert [e for e in events if e >= 0] == execution_order(graph)
        assert sorted(~e for e in events if e < 0) == list(range(len(graph.ops)))
        for i in range(len(graph.ops)):
            assert events.index(i) < events.index(~i)
    # One thread: each op ends before the next starts.
    events = execution_events(_bn_gradient(threads=1))
    assert all(events[k] == ~events[k - 1] for k in range(1, len(events), 2))


def test_an_outer_reduction_costs_more_than_an_elementwise_product():
    # On this CPU `sum(x, axis=[0, 1, 2])` of an NHWC tensor took 0.9-1.8 times `x * g`;
    # a sum over the channels a fifth to four fifths of it.
    graph = _bn_gradient(threads=2)
    graph.ops.append(_op("inner", "Sum", ["gradient_tape/dy:0"], IMAGE[:-1]))
    seconds = op_seconds(graph)
    names = [op.name for op in graph.ops]
    outer = seconds[names.index("gradient_tape/sum")]
    product = seconds[names.index("gradient_tape/dyx")]
    assert product < outer < 2 * product
    assert seconds[names.index("inner")] < product / 2


def test_the_bn_gradient_replays_the_product_beside_the_sum(monkeypatch: pytest.MonkeyPatch):
    # The other thread ends `dx` before `sum` ends and starts `dyx`, which cannot take `dy`
    # over: x, dy, dx, dyx and the mean's gradient live together, as in TensorFlow's records.
    result = replay(_bn_gradient(threads=2), warmup=False)
    assert result.step_peak_bytes >= 5 * 16 * MIB
    assert result.peak_op == "gradient_tape/mean"
    # With one thread nothing runs beside it.
    assert replay(_bn_gradient(threads=1), warmup=False).step_peak_bytes < 4 * 16 * MIB
    # Costed by its bytes alone the sum ends first, `dyx` starts after `dx` and `sum` have
    # let `dy` go and takes it over: a buffer fewer (the replay before).
    monkeypatch.setattr(order, "OUTER_REDUCTION_BYTES", 1)
    assert replay(_bn_gradient(threads=2), warmup=False).step_peak_bytes < 5 * 16 * MIB


def test_the_order_kept_on_a_graph_follows_its_threads_and_grappler_order():
    import copy

    graph = _bn_gradient(threads=2)
    two = execution_events(graph)
    # A copy under one thread (the estimate's `threads=` option) plays its own order.
    single = copy.copy(graph)
    single.inter_op_threads = 1
    assert execution_events(single) == execution_events(_bn_gradient(threads=1)) != two
    assert execution_events(graph) == two
    # A seeded order draws from the kept inputs as a fresh graph's does.
    assert execution_events(graph, 0.5) == execution_events(_bn_gradient(threads=2), 0.5)
    # Another grappler order: the order is played again.
    fresh = _bn_gradient(threads=2)
    fresh.node_rank = {}
    graph.node_rank = {}
    assert execution_events(graph) == execution_events(fresh) != two


def test_the_order_kept_on_a_graph_follows_costs_set_on_it():
    graph = _bn_gradient(threads=2)
    before = execution_events(graph)
    # Costs given to the graph afterwards (as `op_seconds` keeps them): the order follows.
    seconds = list(op_seconds(graph))
    names = [op.name for op in graph.ops]
    seconds[names.index("gradient_tape/sum")] = 100 * max(seconds)
    graph.__dict__["_op_seconds"] = (graph.ops, seconds)
    after = execution_events(graph)
    assert after != before
    fresh = _bn_gradient(threads=2)
    fresh.__dict__["_op_seconds"] = (fresh.ops, seconds)
    assert after == execution_events(fresh)
