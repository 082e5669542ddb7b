"""memfit.estimate, trace once, replay many: a step made from two traces equals a fresh trace."""

from __future__ import annotations

import os

import pytest
from helpers import run_cli, run_isolated

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECKS = """
import keras, memfit
from memfit.backend import tf_trace
from memfit.backend.tf_graph import at_batch_size
from memfit.estimation import estimate_workload
from memfit.estimation.simulate import replay
from memfit.workload.workload import Workload
import factories

def flat_bn_sgd():
    # BatchNorm, swish, a flatten (batch x features) and plain SGD, whose name scope is
    # `sgd_1` in the first trace and `sgd` in the next.
    keras.utils.set_random_seed(1)
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Activation("swish")(h)
    h = keras.layers.Dense(5, activation="softmax")(keras.layers.Flatten()(h))
    model = keras.Model(inputs, h)
    model.compile(optimizer="sgd", loss="categorical_crossentropy")
    return model

def summary(graph):
    # Op names aside (a scope may be `sgd_1` in one trace, `sgd` in another): bytes, what is
    # live at the peak, in which layers.
    r = replay(graph)
    live = [(item.nbytes, item.category, item.layer) for item in r.live]
    return r.peak_bytes, r.resident_bytes, r.activations_kept_bytes, r.peak_phase, live

results = {}
for name, make in (("small_cnn", factories.small_cnn), ("flat_bn_sgd", flat_bn_sgd)):
    workload = Workload(make())
    first, second = tf_trace.trace_step(workload, 8), tf_trace.trace_step(workload, 16)
    rows = {}
    for size in (6, 40):
        made = at_batch_size(first, second, size)
        rows[size] = {
            "made": made is not None,
            "same": made is not None
            and summary(made) == summary(tf_trace.trace_step(workload, size)),
        }
    rows["refused"] = {
        str(size): at_batch_size(first, second, size) is None for size in (1, 3)
    }
    # One trace sized again at another batch: the step a fresh trace at that batch gives,
    # at sizes the two-trace rule refuses too.
    pending = tf_trace.start_trace(workload, 8)
    rows["sized"] = {
        str(size): summary(pending.at_batch(size)) == summary(tf_trace.trace_step(workload, size))
        for size in (3, 12)
    }
    rows["sized_ops"] = [op.name for op in pending.at_batch(12).ops] == [
        op.name for op in pending.result().ops
    ]
    results[name] = rows

model = factories.small_cnn()
est = memfit.estimate(model, 8, what_ifs=True, budget="96MiB")
batch_rows = {
    r["batch_size"]: r["peak_bytes"] for r in est.what_ifs if r["change"].startswith("batch")
}
# A what-if row is its likely order's peak times the base step's highest replayed step over
# its likely order's (several inter-op threads: each step's order races).
run = est.peak_bytes / est.order_peak_bytes
results["what_ifs"] = {
    "rows": [r["change"] for r in est.what_ifs],
    "batch_rows": batch_rows,
    "fresh": {
        b: int(estimate_workload(Workload(model), b).peak_bytes * run) for b in batch_rows
    },
    "largest": [r for r in est.what_ifs if r["change"].startswith("largest")][0],
    "estimate_seconds": est.estimate_seconds,
    "json_seconds": est.to_dict()["estimate_seconds"],
}

# The optimizer what-if compiles memfit's own model again instead of building it again: the
# row equals a fresh estimate built with that optimizer.
built = memfit.estimate("factories:small_cnn", 8, what_ifs=True, samples=0)
other = [r for r in built.what_ifs if r["change"].startswith("optimizer ")][0]
name = other["change"].split()[1]
results["recompiled"] = {
    "row": other.get("peak_bytes"),
    "fresh": memfit.estimate("factories:small_cnn", 8, optimizer=name, samples=0).peak_bytes,
    "base": built.peak_bytes,
    "alone": memfit.estimate("factories:small_cnn", 8, samples=0).peak_bytes,
}

# The high bound's samples replayed partly or wholly in a forked child: the same bound.
import gc
from memfit.estimation.background import start_peak_range
from memfit.estimation.bounds import peak_range

graph = tf_trace.trace_step(Workload(factories.small_cnn()), 8)
likely = replay(graph).peak_bytes
serial = peak_range(graph, likely, samples=5)
ranges = {}
for here in (0, 1, 2, 5):
    got = start_peak_range(graph, samples=5, here=here).result(likely)
    same_high = got.high_bytes == serial.high_bytes
    ranges[str(here)] = [same_high, got.sample_bytes == serial.sample_bytes]
results["background"] = {
    "ranges": ranges,
    "samples": len(serial.sample_bytes),
    "frozen_after": gc.get_freeze_count(),
}
emit(results)
"""


@pytest.fixture(scope="module")
def results():
    return run_isolated(CHECKS, env={"PYTHONPATH": TESTS})


@pytest.mark.parametrize("model", ["small_cnn", "flat_bn_sgd"])
def test_a_step_made_from_two_traces_equals_a_fresh_trace(results, model):
    rows = results[model]
    for size in ("6", "40"):
        assert rows[size] == {"made": True, "same": True}, (size, rows)


@pytest.mark.parametrize("model", ["small_cnn", "flat_bn_sgd"])
def test_one_trace_sized_again_equals_a_fresh_trace(results, model):
    assert results[model]["sized"] == {"3": True, "12": True}
    assert results[model]["sized_ops"]


def test_the_optimizer_what_if_recompiled_equals_a_fresh_build(results):
    got = results["recompiled"]
    assert got["row"] is not None and got["row"] == got["fresh"], got
    assert got["row"] != got["base"]  # another optimizer: other slots
    assert got["base"] == got["alone"]  # the base estimate is the one made alone


@pytest.mark.parametrize("model", ["small_cnn", "flat_bn_sgd"])
def test_sizes_that_may_build_other_ops_are_traced(results, model):
    # Batch 1 (other kernels) and a batch equal to a fixed dimension (3: the kernels' 3x3,
    # RGB) may trace to other ops: the estimate traces them instead.
    assert results[model]["refused"] == {"1": True, "3": True}


def test_what_ifs_at_other_batch_sizes_equal_fresh_estimates(results):
    what_ifs = results["what_ifs"]
    assert what_ifs["rows"][:2] == ["batch size 4", "batch size 16"]
    assert what_ifs["rows"][2].startswith("largest batch for")
    assert what_ifs["batch_rows"] == what_ifs["fresh"]
    largest = what_ifs["largest"]
    assert largest["batch_size"] and largest["peak_bytes"] <= 96 << 20


def test_samples_replayed_in_a_child_give_the_same_bound(results):
    background = results["background"]
    assert background["samples"] == 5
    assert background["ranges"] == {here: [True, True] for here in ("0", "1", "2", "5")}
    # The estimates gave the garbage collector back what they froze.
    assert background["frozen_after"] == 0


def test_the_time_is_reported(results):
    what_ifs = results["what_ifs"]
    assert 0 < what_ifs["estimate_seconds"] == what_ifs["json_seconds"]
    proc = run_cli(
        "estimate", "factories:small_cnn", "-b", "4", "--no-what-ifs", env={"PYTHONPATH": TESTS}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "estimated in " in proc.stdout and " s" in proc.stdout.split("estimated in ")[1]


def test_a_high_bound_child_that_hangs_is_stopped_and_replayed_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from memfit.estimation import background
    from memfit.estimation.bounds import PeakRange

    parent = os.getpid()

    def replayed(graph: object, region: object, seed: int, first: int, count: int) -> PeakRange:
        if os.getpid() != parent:  # the forked child: hang (a deadlock, say)
            time.sleep(60)
        return PeakRange(0, 100 + first, [100 + first + i for i in range(count)])

    def own(graph: object, likely: int, *, samples: int, **_: object) -> PeakRange:
        return PeakRange(likely, max(likely, 50), [50] * samples)

    monkeypatch.setattr(background, "_replayed", replayed)
    monkeypatch.setattr(background, "peak_range", own)
    monkeypatch.setattr(background, "CHILD_GRACE_S", 0.5)
    pending = background.start_peak_range(object(), samples=4, here=2)
    child = pending.pid
    started = time.monotonic()
    got = pending.result(10)
    assert time.monotonic() - started < 20
    # The child was stopped, its samples (2 and 3) replayed here.
    assert got.high_bytes == 102 and got.sample_bytes == [50, 50, 102, 103]
    assert child is not None and pending.pid is None
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)
