"""Child of test_estimate_shared.py: a layer shared by several inputs, estimated and replayed."""

from child import emit

from memfit.backend import tf as tfb
tf = tfb.import_tf()
tf.config.threading.set_inter_op_parallelism_threads(1)
import dataclasses
import keras
from memfit.backend import tf_trace
from memfit.estimation.simulate import replay
from memfit.workload.workload import Workload

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
