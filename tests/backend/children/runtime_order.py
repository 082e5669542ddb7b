"""Child of test_tf_grappler.py: the order TensorFlow's executor runs the step's nodes in,
against grappler's graph.
"""

from child import emit

import glob
import os
import memfit
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2
from memfit.backend import tf as tfb
tf = tfb.import_tf()
import keras
from memfit.estimation.replayed import start_trace
from memfit.workload.workload import Workload

model = keras.applications.MobileNetV2(
    weights=None, input_shape=(64, 64, 3), classes=10, alpha=0.35
)
model.compile("adam", "sparse_categorical_crossentropy")
rank = start_trace(Workload(model), 8, "sqrt").result().node_rank
# TensorFlow dumps the graph it runs
memfit.measure(model, 8, recompute="sqrt", options=memfit.Options(repeats=1))
dumps = glob.glob(os.path.join(os.environ["TF_DUMP_GRAPH_PREFIX"], "*after_graph_optimization*"))
ran = graph_pb2.GraphDef()
with open(max(dumps, key=os.path.getsize)) as dump:
    text_format.Parse(dump.read(), ran)
prefix = "StatefulPartitionedCall/"
runtime = {
    n.name[len(prefix):] if n.name.startswith(prefix) else n.name: i for i, n in enumerate(ran.node)
}
pairs = same = 0
for name in rank:
    if name.endswith("BackpropFilter"):
        other = name[: -len("Filter")] + "Input"
        if other in rank and name in runtime and other in runtime:
            pairs += 1
            same += (rank[name] < rank[other]) == (runtime[name] < runtime[other])
emit({"pairs": pairs, "same": same})
