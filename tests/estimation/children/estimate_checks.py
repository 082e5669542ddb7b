"""Child of test_estimate.py: the estimates and measurements its tests check, in one fresh
process.
"""

from child import emit

import memfit
import keras
from memfit.backend import tf as tfb
tf = tfb.import_tf()
# The conditions the estimate predicts best: one inter-op thread (the executor's own order).
tf.config.threading.set_inter_op_parallelism_threads(1)

def est(*args, **kwargs):
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    e = memfit.estimate(*args, **kwargs)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return e, peak - before

model = memfit.load_model("factories:small_cnn")
# Measured first, as a fresh process would: nothing but this model and its optimizer yet.
measured = memfit.measure(model, 8, options=memfit.Options(repeats=2))
e8, used8 = est(model, 8)
e16, _ = est(model, 16)
e32, _ = est(model, 32)
sgd, _ = est(model, 8, optimizer=keras.optimizers.SGD(momentum=0.9))
mixed, _ = est("factories:small_cnn", 8, precision="mixed_float16")
weights = sum(int(v.numpy().nbytes) for v in model.trainable_variables)
from memfit.backend import tf_trace
from memfit.workload.workload import Workload
graph = tf_trace.trace_step(Workload(model), 8)
temps = tf_trace.initializer_temps(model)
swish_in = keras.Input((8,))
swish = keras.Model(
    swish_in, keras.layers.Dense(2)(keras.layers.Dense(16, activation="swish")(swish_in))
)
swish.compile(optimizer="sgd", loss="mse")
swish_graph = tf_trace.trace_step(Workload(swish), 4)
update_reads_gradient = any(
    op.name.startswith(graph.optimizer_name)
    and any(t.startswith("gradient_tape/") for t in op.inputs)
    for op in graph.ops
)
from memfit.estimation import largest_batch
room = 3 * e8.peak_bytes
largest = largest_batch(model, 64, room)
default = largest_batch(model, 8, samples=0)  # the emulated card's budget
emit({
    "largest": largest.to_dict(), "largest_room": room,
    "largest_too_small": largest_batch(model, 8, 4096, samples=0),
    "largest_default": default.to_dict(),
    "identity_n_left": [op.name for op in graph.ops if op.type == "IdentityN"],
    "update_reads_gradient": update_reads_gradient,
    "e8": e8.to_dict(), "e16": e16.to_dict(), "e32": e32.to_dict(),
    "sgd": sgd.to_dict(), "mixed": mixed.to_dict(),
    "used_during_estimate": used8, "weights": weights, "measured": measured.peak_bytes,
    "threads": graph.inter_op_threads,
    "grappler_nodes": len(graph.node_rank),
    "initializer_temps": {v.path: temps.get(id(v)) for v in model.weights},
    "swish_beta_muls": [
        op.name for op in swish_graph.ops
        if op.type == "Mul" and any(t.split(":")[0].endswith("beta") for t in op.inputs)
    ],
    "measured_resident": measured.resident_bytes,
    "str": str(e8),
})
