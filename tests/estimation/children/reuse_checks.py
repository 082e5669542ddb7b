"""Child of test_estimate_reuse.py: steps made from two traces, or one sized again, against
fresh traces.
"""

from child import emit

import keras
import memfit
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
built = memfit.estimate("factories:small_cnn", 8, what_ifs=True, options=memfit.Options(samples=0))
other = [r for r in built.what_ifs if r["change"].startswith("optimizer ")][0]
name = other["change"].split()[1]
results["recompiled"] = {
    "row": other.get("peak_bytes"),
    "fresh": memfit.estimate(
        "factories:small_cnn", 8, optimizer=name, options=memfit.Options(samples=0)
    ).peak_bytes,
    "base": built.peak_bytes,
    "alone": memfit.estimate(
        "factories:small_cnn", 8, options=memfit.Options(samples=0)
    ).peak_bytes,
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
