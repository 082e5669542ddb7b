"""The replay's copy-on-write of weights under several inter-op threads (`rehomed_updates`)."""

from __future__ import annotations

from memfit.backend.tf_graph import OpInfo, StepGraph
from memfit.estimation.bfc import BFC
from memfit.estimation.order import op_seconds
from memfit.estimation.simulate import rehomed_updates, replay
from memfit.estimation.step import StepRun, round_up

MIB = 1 << 20


def _step(threads: int) -> StepGraph:
    """A convolution and a batch norm's scale, their gradients and their updates.

    The convolution's kernel `w` is read again by its input gradient, which its update does
    not wait for (the update needs only the filter gradient); the scale `gamma` is read by
    the op that makes its own gradient, so its update runs after that read is done. The
    step's peak comes after both updates.
    """
    ops = [
        OpInfo("conv/w", "ReadVariableOp", [], ["conv/w:0"], [0], variable="w"),
        OpInfo("bn/gamma", "ReadVariableOp", [], ["bn/gamma:0"], [0], variable="gamma"),
        OpInfo("conv/Conv2D", "Conv2D", ["x:0", "conv/w:0"], ["conv/Conv2D:0"], [4 * MIB]),
        OpInfo("bn/mul", "Mul", ["conv/Conv2D:0", "bn/gamma:0"], ["bn/mul:0"], [4 * MIB]),
        OpInfo("loss", "Sum", ["bn/mul:0"], ["loss:0"], [256]),
        OpInfo("gradient_tape/g", "Fill", ["loss:0"], ["gradient_tape/g:0"], [4 * MIB]),
        OpInfo(
            "gradient_tape/bn/grad",
            "Mul",
            ["gradient_tape/g:0", "bn/gamma:0", "conv/Conv2D:0"],
            ["gradient_tape/bn/grad:0", "gradient_tape/bn/grad:1"],
            [4 * MIB, 256],
        ),
        OpInfo(
            "gradient_tape/conv/Conv2DBackpropInput",
            "Conv2DBackpropInput",
            ["conv/w:0", "gradient_tape/bn/grad:0"],
            ["gradient_tape/conv/Conv2DBackpropInput:0"],
            [4 * MIB],
        ),
        OpInfo(
            "gradient_tape/conv/Conv2DBackpropFilter",
            "Conv2DBackpropFilter",
            ["x:0", "gradient_tape/bn/grad:0"],
            ["gradient_tape/conv/Conv2DBackpropFilter:0"],
            [MIB],
        ),
        OpInfo(
            "opt/AssignSubVariableOp",
            "AssignSubVariableOp",
            ["w_handle", "gradient_tape/conv/Conv2DBackpropFilter:0"],
            [],
            [],
            variable="w",
        ),
        OpInfo(
            "opt/AssignSubVariableOp_1",
            "AssignSubVariableOp",
            ["gamma_handle", "gradient_tape/bn/grad:1"],
            [],
            [],
            variable="gamma",
        ),
        # After the updates: the step's peak.
        OpInfo(
            "gradient_tape/tail",
            "Mul",
            ["gradient_tape/conv/Conv2DBackpropInput:0"],
            ["gradient_tape/tail:0"],
            [16 * MIB],
            control_inputs=["opt/AssignSubVariableOp", "opt/AssignSubVariableOp_1"],
        ),
    ]
    return StepGraph(
        ops,
        ["x:0"],
        [4 * MIB],
        ["loss:0", "gradient_tape/tail:0"],
        {"w": (MIB, "weight"), "gamma": (256, "weight")},
        {"w": "conv", "gamma": "bn"},
        {"conv", "bn"},
        "opt",
        threads,
    )


def test_a_weight_read_by_a_gradient_its_update_does_not_wait_for_is_copied():
    graph = _step(threads=2)
    names = {graph.ops[i].name for i in rehomed_updates(graph)}
    # The kernel's update can run while its input gradient still reads it; the scale's
    # update needs the op that read it.
    assert names == {"opt/AssignSubVariableOp"}
    # One inter-op thread: inputs are released before the next op runs, no copy is forced.
    assert rehomed_updates(_step(threads=1)) == frozenset()


def _read_ends_first(graph: StepGraph) -> StepGraph:
    """The kernel's input gradient costed below its filter gradient: it ends, and lets the
    kernel's read go, before the kernel's update runs (no copy unless one is forced)."""
    seconds = list(op_seconds(graph))
    names = [op.name for op in graph.ops]
    quick = seconds[names.index("gradient_tape/conv/Conv2DBackpropFilter")] / 2
    seconds[names.index("gradient_tape/conv/Conv2DBackpropInput")] = quick
    graph.__dict__["_op_seconds"] = (graph.ops, seconds)
    return graph


def test_a_copied_weight_moves_to_a_new_buffer_in_every_step():
    graph = _step(threads=2)
    copies = rehomed_updates(graph)
    bfc = BFC(None)
    variables = {name: bfc.allocate(nbytes) for name, (nbytes, _) in graph.variables.items()}
    homes = [dict(variables)]
    for _ in range(2):
        StepRun(graph, bfc, variables, None, None, False, copies).run()
        homes.append(dict(variables))
    assert len({home["w"] for home in homes}) == 3
    assert {home["gamma"] for home in homes} == {homes[0]["gamma"]}
    # Without the copies the kernel stays where it was made (its read is consumed first).
    graph = _read_ends_first(_step(threads=2))
    bfc = BFC(None)
    variables = {name: bfc.allocate(nbytes) for name, (nbytes, _) in graph.variables.items()}
    before = dict(variables)
    StepRun(graph, bfc, variables, None, None, False).run()
    assert variables == before
    # Where the input gradient still reads the kernel when its update runs (it takes longer
    # than the filter gradient and the update), the update copies it unforced.
    graph = _step(threads=2)
    bfc = BFC(None)
    variables = {name: bfc.allocate(nbytes) for name, (nbytes, _) in graph.variables.items()}
    before = dict(variables)
    StepRun(graph, bfc, variables, None, None, False).run()
    assert variables["w"] != before["w"] and variables["gamma"] == before["gamma"]


def test_the_live_set_at_the_peak_counts_a_moved_weight_once():
    graph = _step(threads=2)
    result = replay(graph, steps=2, rehome=True)
    # The copied kernel's old buffer is gone by the peak; its new one holds the weight.
    assert sum(item.nbytes for item in result.live) == result.peak_bytes
    weights = sum(item.nbytes for item in result.live if item.category == "weights")
    assert weights == sum(round_up(nbytes) for nbytes, _ in graph.variables.values())


def test_a_weight_that_moves_each_step_leaves_holes_taken_whole():
    # A weight of 1.5 MiB that moves each step leaves holes the step's 4 MiB buffers take
    # whole (a chunk under twice the request), as TensorFlow's copied weights do.
    graph = _step(threads=2)
    graph.variables["w"] = (3 * MIB // 2, "weight")
    for op in graph.ops:
        if op.name == "gradient_tape/conv/Conv2DBackpropFilter":
            op.output_bytes = [3 * MIB // 2]
        if op.name == "gradient_tape/tail":
            op.output_bytes = [2 * MIB]
    region = 1 << 30
    likely = replay(_read_ends_first(graph), region_bytes=region)
    rehomed = replay(graph, region_bytes=region, rehome=True)
    assert rehomed.peak_bytes >= likely.peak_bytes + MIB
    assert any(i.category == "fragmentation" and i.op == "conv/Conv2D" for i in rehomed.live)
    assert not any(i.category == "fragmentation" and i.op == "conv/Conv2D" for i in likely.live)
