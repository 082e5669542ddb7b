"""The replay of a recompute step (`memfit.recompute`) against what TensorFlow runs.

Measured on this machine (2 CPUs, so 2 inter-op threads by default; `memfit.measure` in
fresh processes, 1 warm-up + 4 steps, highest; see bench/history/recompute.md, "Estimate of
the recompute step"): TensorFlow frees each recomputed segment's activations before
it recomputes the next one under two inter-op threads, and holds them with one. The chain
below measured 107.9 and 115.9 MiB with recompute, 171.9 MiB without.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from memfit.estimation.simulate import replay


def _chain() -> Any:
    """Eight conv/BatchNorm/ReLU blocks at 64 px: `sqrt` makes 5 segments, 4 recomputed."""
    import keras

    x = inputs = keras.Input((64, 64, 3))
    for _ in range(8):
        x = keras.layers.Conv2D(32, 3, padding="same")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(10)(x))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _traced(recompute: Any) -> Any:
    """The chain's training step at batch 16, traced (not run)."""
    from memfit.estimation.replayed import start_trace
    from memfit.workload.workload import Workload

    return start_trace(Workload(_chain()), 16, recompute).result()


@pytest.fixture(scope="module")
def recompute_step() -> Any:
    """The chain's step under `memfit.recompute(model, "sqrt")`, traced once for the module."""
    return _traced("sqrt")


def _with_threads(graph: Any, threads: int) -> Any:
    copied = copy.copy(graph)
    copied.inter_op_threads = threads
    return copied


def _shared_head_step() -> Any:
    """A pyramid-like model whose 4-conv head (a nested model) runs on 5 levels, b8, traced
    with recompute sqrt (each head call recomputed): the pending `TracedStep`."""
    import keras

    from memfit.estimation.replayed import start_trace
    from memfit.workload.workload import Workload

    inputs = keras.Input((64, 64, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    levels = []
    for i in range(5):
        x = keras.layers.Conv2D(16, 3, strides=2 if i else 1, padding="same", activation="relu")(x)
        levels.append(x)
    convs = [keras.layers.Conv2D(16, 3, padding="same", activation="relu") for _ in range(4)]
    head = keras.Sequential([keras.Input((None, None, 16)), *convs], name="head")
    pooled = [keras.layers.GlobalAveragePooling2D()(head(level)) for level in levels]
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Concatenate()(pooled)))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return start_trace(Workload(model), 8, "sqrt")


def test_a_custom_gradients_identity_n_grappler_keeps_stays_a_barrier() -> None:
    # Grappler keeps a recomputed call's gradient IdentityN where bypassing it would add
    # edges (here four of the five head calls': 9 gradients in, 8 sums out), and TensorFlow's
    # executor runs its consumers (a shared kernel's gradient summed over the calls, then
    # the kernel's update) only once all of the call's gradients exist, its input gradient
    # included (RetinaNet's executor log). The replay keeps those, with grappler's inputs
    # (the traced op's unread outputs dropped), and drops the others as grappler does.
    pending = _shared_head_step()
    step = pending.result()
    kept = {name for name, node in pending._nodes.items() if node.type == "IdentityN"}
    barriers = [op for op in step.ops if op.type == "IdentityN"]
    assert kept and {op.name for op in barriers} == kept
    produced_by = {name: op.type for op in step.ops for name in op.outputs}
    for op in barriers:
        assert op.inputs == pending._nodes[op.name].inputs
        assert len(op.outputs) == len(op.inputs)
        kinds = {produced_by.get(name) for name in op.inputs}
        assert {"Conv2DBackpropInput", "Conv2DBackpropFilter"} <= kinds


def test_recomputed_activations_go_early_under_two_inter_op_threads(recompute_step: Any) -> None:
    """With two inter-op threads a segment's weight gradients run as soon as they are ready.

    The backward chain hands each convolution's weight gradient to the pool; a second
    thread runs it at once and frees the recomputed activation it reads, so the segments'
    recomputed activations are not alive together. With one thread the weight gradients
    wait until the input-gradient chain ends and hold them all (TensorFlow: MobileNetV2
    96 px batch 16 with recompute peaked at 197 MiB pinned to one inter-op thread, 124 MiB
    with two). A replay that ran each thread depth first, weight gradients last, predicted
    217 MiB there (+75%), and on this chain 152 MiB with two threads against 131 with one.
    """
    graph = recompute_step
    one = replay(_with_threads(graph, 1), region_bytes=1 << 30)
    two = replay(_with_threads(graph, 2), region_bytes=1 << 30)
    assert two.peak_bytes < 0.9 * one.peak_bytes, (two.peak_bytes, one.peak_bytes)


def test_recompute_step_replays_well_below_the_plain_step(recompute_step: Any) -> None:
    """The replayed recompute step saves what TensorFlow saves (measured 0.63-0.67x here)."""
    plain = replay(_with_threads(_traced(None), 2), region_bytes=1 << 30)
    recomputed = replay(_with_threads(recompute_step, 2), region_bytes=1 << 30)
    assert recomputed.peak_bytes < 0.8 * plain.peak_bytes, (recomputed.peak_bytes, plain.peak_bytes)


def test_the_replay_takes_the_highest_of_the_steps_a_measurement_takes() -> None:
    # With one inter-op thread every step runs one order, but weights that move every step
    # (here the updates copy 8 kernels a step: a read of each is still held when its update
    # runs) leave the free chunks different after each step, so the steps peak apart.
    # TensorFlow's EfficientNetB0 recompute step (224 px, one inter-op thread) held the
    # replay's tensors at every step's peak (batch 16) and peaked at 995-1138 MiB over 24
    # steps (batch 32); the replay at 1015-1131 over 10, but the highest of its first two
    # was 1069.3. The replay reports the highest of the 5 steps after a warm-up that the
    # accuracy benchmark measures in each process.
    graph = _with_threads(_shared_head_step().result(), 1)
    first_two = replay(graph, steps=2).peak_bytes
    five = replay(graph, steps=5).peak_bytes
    assert five > first_two  # a later step finds the free chunks cut otherwise
    assert replay(graph).peak_bytes == five
