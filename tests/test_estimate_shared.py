"""memfit.estimation: a layer shared by several inputs, its per-input gradients and their sum.

A detector's heads are applied at every pyramid level: each level makes its own weight
gradient of the same kernel (`Conv2DBackpropFilter`), and the tape sums them (`AddN`) once the
last is made. TensorFlow's executor runs each thread depth first and hands the other ready
ops to the pool, so the weight gradient the first backward chain handed off is made near the
end of the backward pass, and the other levels' gradients stay live until then (RetinaNet
192 px, default threading: four of five per level, measured with TensorFlow's allocator
profile; see bench/RESULTS.md, "Shared heads' weight gradients").
"""

from __future__ import annotations

from helpers import run_isolated

from memfit.backend.tf_graph import OpInfo, StepGraph
from memfit.estimation.simulate import replay

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


def test_per_input_weight_gradients_are_held_until_their_sum_under_several_threads():
    # Each thread runs depth first: the last level's input gradient continues into the
    # backbone and its weight gradient waits on the stack, so the other levels' weight
    # gradients are live at the backbone's peak, with one or several inter-op threads.
    for threads in (1, 2):
        result = replay(_shared_step(threads))
        assert result.peak_op == "b1"
        assert _held(result, "dw") == {"dw0", "dw1"}
        assert result.order.index("dw2") > result.order.index("b1")
        assert result.order.index("sum") > result.order.index("dw2")
        assert result.step_peak_bytes >= 6 * MIB
    # The ready-queue reading of several threads (the high bound's other half) makes every
    # weight gradient as soon as it can and sums them before the backbone: nothing held.
    raced = replay(_shared_step(2), race=True)
    assert _held(raced, "dw") == set()
    assert raced.step_peak_bytes < replay(_shared_step(2)).step_peak_bytes


SHARED = """
from memfit.backend import tf as tfb
tf = tfb.import_tf()
tf.config.threading.set_inter_op_parallelism_threads(1)
import dataclasses
import keras
from memfit.backend import tf_trace
from memfit.estimation.simulate import replay
from memfit.workload import Workload

x = keras.Input((16, 16, 8))
levels, h = [], x
for i in range(3):
    h = keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu", name=f"c{i}")(h)
    levels.append(keras.layers.Conv2D(64, 1, name=f"lateral{i}")(h))
head = keras.layers.Conv2D(64, 3, padding="same", name="head")
outs = [keras.layers.GlobalAveragePooling2D()(head(level)) for level in levels]
model = keras.Model(x, keras.layers.Dense(10)(keras.layers.Add()(outs)))
model.compile(optimizer=keras.optimizers.SGD(), loss="mse")
graph = dataclasses.replace(tf_trace.trace_step(Workload(model), 2), inter_op_threads=2)
producer = {name: op for op in graph.ops for name in op.outputs}
sums = []
for op in graph.ops:
    made = [producer[t] for t in op.inputs if t in producer]
    if op.type == "AddN" and any(p.type == "Conv2DBackpropFilter" for p in made):
        sums.append({"sum": op.name, "inputs": [[p.name, p.type] for p in made]})
result = replay(graph)
emit({"sums": sums, "order": result.order[-len(graph.ops):]})
"""


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
