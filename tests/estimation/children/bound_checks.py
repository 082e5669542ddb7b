"""Child of test_estimate_bounds.py: estimates and measured steps its tests compare with the
high bound.
"""

from child import emit

import memfit
from memfit.backend import tf as tfb
tf = tfb.import_tf()
tf.config.threading.set_inter_op_parallelism_threads(1)
from memfit.backend import tf_trace
from memfit.backend.tf_graph import op_dependencies
from memfit.estimation.bounds import peak_range
from memfit.estimation.simulate import execution_order, replay
from memfit.budget.budget import emulated_budget
from memfit.workload.workload import Workload

model = memfit.load_model("factories:small_cnn")
measured = memfit.measure(model, 16, options=memfit.Options(repeats=3))
graph = tf_trace.trace_step(Workload(model), 16)
region = emulated_budget().usable_bytes
likely = replay(graph, region_bytes=region).peak_bytes
first = peak_range(graph, likely, region_bytes=region, samples=3, seed=7)
again = peak_range(graph, likely, region_bytes=region, samples=3, seed=7)
preds, _, _ = op_dependencies(graph.ops)
orders = [execution_order(graph), execution_order(graph, 0.25), execution_order(graph, 0.75)]

def topological(order):
    seen = set()
    for i in order:
        if not preds[i] <= seen:
            return False
        seen.add(i)
    return len(seen) == len(graph.ops)

e = memfit.estimate(model, 16, options=memfit.Options(samples=2))
five = memfit.estimate(model, 16, steps=5, options=memfit.Options(samples=2))
try:
    memfit.estimate(model, 16, steps=0)
    zero = None
except memfit.MemfitError as exc:
    zero = str(exc)
from memfit.backend.tf_kernels import assume_threads
with assume_threads(2, 512):
    other_machine = tf_trace.trace_step(Workload(model), 16)
threaded = memfit.estimate(model, 16, options=memfit.Options(samples=0, threads=(2, 512)))
after = tf_trace.trace_step(Workload(model), 16)
none = memfit.estimate(model, 16, options=memfit.Options(samples=0))
# Three inter-op threads: here a sampled process peaks above the likely order (with two, since
# grappler's node order is the runtime's, the likely order is the highest at this batch).
raced = memfit.estimate(model, 16, options=memfit.Options(samples=4, threads=(3, 2)))
raced_alone = memfit.estimate(model, 16, options=memfit.Options(samples=0, threads=(3, 2)))
emit({
    "raced": raced.to_dict(), "raced_alone": raced_alone.to_dict(),
    "likely": likely, "high": first.high_bytes, "samples": first.sample_bytes,
    "again": again.sample_bytes, "measured": measured.peak_bytes,
    "topological": [topological(o) for o in orders],
    "distinct_orders": len({tuple(o) for o in orders}),
    "estimate": e.to_dict(), "five": five.to_dict(), "zero_steps": zero,
    "no_samples": none.to_dict(), "str": str(e),
    "threads": [graph.inter_op_threads, other_machine.inter_op_threads, after.inter_op_threads],
    "scratch": [sum(op.scratch_bytes for op in g.ops) for g in (graph, other_machine)],
    "threaded_peak": threaded.peak_bytes,
})
