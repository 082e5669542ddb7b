"""memfit.estimation: a layer shared by several inputs, its per-input gradients and their sum.

A detector's heads are applied at every pyramid level: each level makes its own weight
gradient of the same kernel (`Conv2DBackpropFilter`), and the tape sums them (`AddN`) once the
last is made. TensorFlow's executor runs each thread depth first and hands the other ready
ops to the pool, so the levels' gradients made first stay live until the last level's. With
several inter-op threads an idle thread steals the oldest op handed to the pool: the box and
the class head run side by side, and at the last level both heads' gradients of the other
four levels are live (RetinaNet 192 and 320 px, default threading, TensorFlow's allocator
profile; see bench/history/estimate_accuracy.md, "Shared heads' weight gradients").
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from helpers import run_isolated

from memfit.backend.tf_graph import OpInfo, StepGraph
from memfit.estimation.order import (
    execution_order,
    op_seconds,
    single_thread_order,
    threaded_order,
)
from memfit.estimation.simulate import replay

CHILDREN = Path(__file__).resolve().parent / "children"

KIB, MIB = 1 << 10, 1 << 20


def _shared_step(threads: int, levels: int = 3) -> StepGraph:
    """A backward pass through a kernel shared by `levels` inputs, then a backbone.

    Each level: the loss gradient `g`, the input gradient `dx` (listed first, so it continues
    inline as in grappler's node order) and the weight gradient `dw` (1 MiB). `sum` adds the
    `dw`s; the backbone (`b0`, `b1` with a 4 MiB output) needs every `dx`.
    """
    ops = [OpInfo("dy", "Fill", [], ["dy:0"], [KIB])]
    for k in range(levels):
        ops += [
            OpInfo(f"g{k}", "ReluGrad", ["dy:0"], [f"g{k}:0"], [KIB]),
            OpInfo(f"dx{k}", "Conv2DBackpropInput", [f"g{k}:0"], [f"dx{k}:0"], [KIB]),
            OpInfo(f"dw{k}", "Conv2DBackpropFilter", [f"g{k}:0"], [f"dw{k}:0"], [MIB]),
        ]
    ops += [
        OpInfo("sum", "AddN", [f"dw{k}:0" for k in range(levels)], ["sum:0"], [MIB]),
        OpInfo("update", "Sum", ["sum:0"], ["update:0"], [4]),
        OpInfo("b0", "AddN", [f"dx{k}:0" for k in range(levels)], ["b0:0"], [KIB]),
        OpInfo("b1", "Conv2DBackpropInput", ["b0:0"], ["b1:0"], [4 * MIB]),
        OpInfo("b2", "Sum", ["b1:0"], ["b2:0"], [4]),
    ]
    return StepGraph(
        ops=ops,
        arguments=[],
        argument_bytes=[],
        fetches=["update:0", "b2:0"],
        variables={},
        variable_layers={},
        layers=set(),
        optimizer_name="opt",
        inter_op_threads=threads,
    )


def _held(result, prefix: str) -> set[str]:
    return {item.op for item in result.live if item.op.startswith(prefix) and item.nbytes >= MIB}


def test_per_input_weight_gradients_are_held_until_their_sum_with_one_thread():
    # One thread runs depth first: the last level's input gradient continues into the
    # backbone and its weight gradient waits on the stack, so the other levels' weight
    # gradients are live at the backbone's peak.
    result = replay(_shared_step(1))
    assert result.peak_op == "b1"
    assert _held(result, "dw") == {"dw0", "dw1"}
    assert result.order.index("dw2") > result.order.index("b1")
    assert result.order.index("sum") > result.order.index("dw2")
    assert result.step_peak_bytes >= 6 * MIB
    # The ready-queue reading of several threads (the high bound's other half) makes every
    # weight gradient as soon as it can and sums them before the backbone: nothing held.
    raced = replay(_shared_step(2), race=True)
    assert _held(raced, "dw") == set()
    assert raced.step_peak_bytes < result.step_peak_bytes


def _two_heads_step(threads: int, levels: int = 5) -> StepGraph:
    """Two heads (box `b`, class `c`) applied at `levels` pyramid levels, then a backbone.

    The loss gradient `dy` feeds both heads' gradients `hb`, `hc`; each feeds one `Slice`
    per level (more than four consumers: TensorFlow meets them in traced order, whatever
    grappler's node order, given here reversed). Each level: the head's input gradient `dx`
    and its weight gradient `dw` (1 MiB) of the kernel the levels share; `sum` adds a head's
    `dw`s; the backbone (`bb`, `bb1`) needs every level's input gradients.
    """
    ops = [OpInfo("dy", "Fill", [], ["dy:0"], [KIB])]
    for h in "bc":
        ops.append(OpInfo(f"h{h}", "ReluGrad", ["dy:0"], [f"h{h}:0"], [KIB]))
    for h in "bc":
        for k in range(levels):
            ops += [
                OpInfo(f"s{h}{k}", "Slice", [f"h{h}:0"], [f"s{h}{k}:0"], [KIB]),
                OpInfo(f"dx{h}{k}", "Conv2DBackpropInput", [f"s{h}{k}:0"], [f"dx{h}{k}:0"], [KIB]),
                OpInfo(f"dw{h}{k}", "Conv2DBackpropFilter", [f"s{h}{k}:0"], [f"dw{h}{k}:0"], [MIB]),
            ]  # fmt: skip
        dws = [f"dw{h}{k}:0" for k in range(levels)]
        ops += [
            OpInfo(f"sum{h}", "AddN", dws, [f"sum{h}:0"], [MIB]),
            OpInfo(f"update{h}", "Sum", [f"sum{h}:0"], [f"update{h}:0"], [4]),
        ]
    dxs = [f"dx{h}{k}:0" for h in "bc" for k in range(levels)]
    ops += [
        OpInfo("bb", "AddN", dxs, ["bb:0"], [KIB]),
        OpInfo("bb1", "Conv2DBackpropInput", ["bb:0"], ["bb1:0"], [4 * MIB]),
        OpInfo("bb2", "Sum", ["bb1:0"], ["bb2:0"], [4]),
    ]
    return StepGraph(
        ops=ops,
        arguments=[],
        argument_bytes=[],
        fetches=["updateb:0", "updatec:0", "bb2:0"],
        variables={},
        variable_layers={},
        layers=set(),
        optimizer_name="opt",
        inter_op_threads=threads,
        node_rank={op.name: -i for i, op in enumerate(ops)},
    )


def test_two_threads_run_the_two_heads_side_by_side_level_by_level():
    # Each head's five levels run in the reverse of their traced order (the last Slice met
    # continues inline, the others wait on the thread's own queue, newest first), and each
    # level's weight gradient right after its input gradient.
    for threads in (1, 2):
        order = replay(_two_heads_step(threads)).order
        for h in "bc":
            slices = [order.index(f"s{h}{k}") for k in range(5)]
            assert slices == sorted(slices, reverse=True)
            assert order.index(f"dw{h}3") < order.index(f"s{h}2")
    # Two threads: the idle one steals the other head, so both heads' gradients of four
    # levels are live when the last level's are made (TensorFlow's profile of RetinaNet:
    # 76 MiB of head weight gradients at the peak). One thread: one head at a time.
    two, one = replay(_two_heads_step(2)), replay(_two_heads_step(1))
    assert _held(two, "dwb") >= {f"dwb{k}" for k in range(1, 5)}
    assert _held(two, "dwc") >= {f"dwc{k}" for k in range(1, 5)}
    assert len(_held(one, "dw")) <= 5
    assert two.step_peak_bytes >= 9 * MIB


def test_the_threaded_order_with_one_thread_is_the_single_thread_order():
    rng = random.Random(3)
    for _ in range(40):
        n = rng.randrange(2, 30)
        preds = [{p for p in range(i) if rng.random() < 0.2} for i in range(n)]
        succs: list[list[int]] = [[] for _ in range(n)]
        for i, ps in enumerate(preds):
            for p in ps:
                succs[p].append(i)
        cheap = [rng.random() < 0.3 for _ in range(n)]
        seconds = [rng.random() for _ in range(n)]
        expected = single_thread_order(preds, succs, cheap)
        assert threaded_order(preds, succs, cheap, seconds, 1) == expected
        # Several threads: every op once, each after all it depends on.
        for threads in (2, 3):
            order = threaded_order(preds, succs, cheap, seconds, threads)
            assert sorted(order) == list(range(n))
            place = {op: k for k, op in enumerate(order)}
            assert all(place[p] < place[i] for i in range(n) for p in preds[i])


def test_an_idle_thread_steals_the_oldest_op_handed_to_the_pool():
    # `a` makes b, c, d ready: d continues inline, c then b go to a's queue (b oldest). The
    # second thread steals b; after d, the first takes c, its own newest.
    preds = [set(), {0}, {0}, {0}, {1}, {2}, {3}]
    succs = [[1, 2, 3], [4], [5], [6], [], [], []]
    cheap = [False] * 7
    seconds = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    order = threaded_order(preds, succs, cheap, seconds, 2)
    assert order[:3] == [0, 3, 1]
    assert order.index(2) > order.index(6) or order.index(2) > order.index(4)


def test_ops_with_more_than_four_consumers_meet_them_in_traced_order():
    step = _two_heads_step(1)
    order = [step.ops[i].name for i in execution_order(step)]
    # `hb` has five consumers: traced order, the last continuing inline. `sb4` has two:
    # grappler's order (the reverse of traced order here), so `dx` continues inline.
    assert order.index("sb4") < order.index("sb3") < order.index("sb0")
    assert order.index("dxb4") < order.index("dwb4")


def test_op_seconds_counts_a_convolutions_arithmetic():
    conv = OpInfo("c", "Conv2D", ["x:0", "k:0"], ["c:0"], [4 * 64 * 64 * 64])
    conv.output_shapes = [((1, 64, 64, 64), 4)]
    x = OpInfo("x", "Relu", [], ["x:0"], [4 * 64 * 64 * 64])
    x.output_shapes = [((1, 64, 64, 64), 4)]
    k = OpInfo("k", "Const", [], ["k:0"], [4 * 3 * 3 * 64 * 64])
    k.output_shapes = [((3, 3, 64, 64), 4)]
    add = OpInfo("a", "AddV2", ["x:0", "x:0"], ["a:0"], [4 * 64 * 64 * 64])
    graph = StepGraph([x, k, conv, add], [], [], [], {}, {}, set(), "opt", 2)
    seconds = op_seconds(graph)
    assert seconds[1] == 0.0  # inexpensive: inline, no time
    # 2 * 64*64*64 outputs * 3*3*64 multiply-adds: ~0.3 GFLOP, far above the add's bytes.
    assert seconds[2] > 10 * seconds[3] > 0


def _conv_and_backprops(batch: int, pixels: int, cin: int, cout: int, taps: int) -> StepGraph:
    """A convolution (`taps` x `taps`, stride 1) and both its gradients, shapes as traced."""

    def op(name: str, kind: str, inputs: list[str], shape: tuple[int, ...]) -> OpInfo:
        info = OpInfo(name, kind, inputs, [f"{name}:0"], [4 * math.prod(shape)])
        info.output_shapes = [(shape, 4)]
        return info

    image, out = (batch, pixels, pixels, cin), (batch, pixels, pixels, cout)
    return StepGraph(
        [
            op("x", "Relu", [], image),
            op("k", "ReadVariableOp", [], (taps, taps, cin, cout)),
            op("dy", "Relu", [], out),
            op("xs", "Const", [], (4,)),
            op("ks", "Const", [], (4,)),
            op("conv", "Conv2D", ["x:0", "k:0"], out),
            op("dx", "Conv2DBackpropInput", ["xs:0", "k:0", "dy:0"], image),
            op("dk", "Conv2DBackpropFilter", ["x:0", "ks:0", "dy:0"], (taps, taps, cin, cout)),
        ],
        [], [], [], {}, {}, set(), "opt", 2,
    )  # fmt: skip


def test_op_seconds_costs_a_convolutions_gradients_as_its_multiply_adds():
    # Each gradient of a convolution does the forward's multiply-adds (one per output-gradient
    # element, kernel tap and input channel), whichever of kernel and image is larger:
    # MobileNet's conv_pw_13 (1x1, 1024 -> 1024 channels on 3x3 pixels, kernel larger than
    # the image) and a projection (1x1, 384 -> 64 channels, output smaller than the input).
    for shape in [(2, 3, 1024, 1024, 1), (2, 12, 384, 64, 1), (2, 24, 32, 96, 3)]:
        seconds = op_seconds(_conv_and_backprops(*shape))
        forward, to_input, to_kernel = seconds[5:8]
        assert forward / 2 < to_input < 2 * forward, shape
        assert forward / 2 < to_kernel < 2 * forward, shape


SHARED = CHILDREN / "shared_weights.py"


def test_a_shared_conv_kernel_gradient_is_the_sum_of_one_gradient_per_call():
    results = run_isolated(SHARED, {"MEMFIT_MEMORY": "1GiB"})
    # The tape sums the shared kernel's gradient from one Conv2DBackpropFilter per call.
    (kernel,) = [s for s in results["sums"] if len(s["inputs"]) == 3]
    kinds = {kind for _, kind in kernel["inputs"]}
    names = [name for name, _ in kernel["inputs"]]
    assert kinds == {"Conv2DBackpropFilter"}
    assert all("/head" in name for name in names) and len(set(names)) == 3
    # The replay under two inter-op threads sums them only once all three are made.
    order = results["order"]
    assert order.index(kernel["sum"]) > max(order.index(name) for name in names)
