"""memfit.backend.tf_grappler: the graph grappler makes of the step, with its cheaper config."""

from __future__ import annotations

from helpers import run_isolated

SAME_NODES = """
import keras
from tensorflow.core.protobuf import config_pb2
from memfit.backend import tf as tfb, tf_grappler, tf_trace
from memfit.workload.workload import Workload

tf = tfb.import_tf()
inputs = keras.Input((16, 16, 3))
x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
x = keras.layers.BatchNormalization()(x)
y = keras.layers.Activation("swish")(x)
x = keras.layers.Add()([x, y, keras.layers.Conv2D(8, 1)(y)])  # gradients summed by AddN
x = keras.layers.GlobalAveragePooling2D()(x)
model = keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(x))
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
workload = Workload(model)
model.optimizer.build(model.trainable_variables)
concrete = tf.function(model.train_step).get_concrete_function(tf_trace.batch_specs(workload, 4))
graph_def = concrete.graph.as_graph_def()
fetches = [t.name for t in concrete.outputs]

used = []
chosen = tf_grappler.grappler_config
tf_grappler.grappler_config = lambda: used.append(1) or chosen()
cheaper = tf_grappler.grappler_graph(graph_def, fetches)
tf_grappler.grappler_config = config_pb2.ConfigProto  # TensorFlow's default
default = tf_grappler.grappler_graph(graph_def, fetches)

def plain(nodes):
    return {name: [n.rank, n.type, n.inputs] for name, n in nodes.items()}

emit({"used": len(used), "nodes": len(cheaper), "same": plain(cheaper) == plain(default)})
"""


def test_the_cheaper_config_gives_the_default_configs_nodes():
    # The passes left out cannot change the nodes, their order or their inputs.
    results = run_isolated(SAME_NODES)
    assert results["used"] == 1
    assert results["nodes"] > 0
    assert results["same"]


def test_the_config_leaves_out_tfg_and_on_cpu_the_layout_optimizer():
    from tensorflow.core.protobuf import rewriter_config_pb2

    from memfit.backend.tf_grappler import grappler_config

    cpu = grappler_config(gpus=False).graph_options.rewrite_options
    gpu = grappler_config(gpus=True).graph_options.rewrite_options
    assert cpu.disable_tfg_optimizer and gpu.disable_tfg_optimizer
    assert cpu.layout_optimizer == rewriter_config_pb2.RewriterConfig.OFF
    assert gpu.layout_optimizer == rewriter_config_pb2.RewriterConfig.DEFAULT
    # Everything else is TensorFlow's default: both iterations, every other pass.
    assert cpu.meta_optimizer_iterations == rewriter_config_pb2.RewriterConfig.DEFAULT_NUM_ITERS
    assert cpu.memory_optimization == rewriter_config_pb2.RewriterConfig.DEFAULT_MEM_OPT


def test_a_helper_process_runs_grappler_as_its_parent_does():
    from tensorflow.core.protobuf import rewriter_config_pb2

    from memfit.backend import tf_grappler

    seen = tf_grappler.sees_gpu()
    try:
        tf_grappler.describe_as(gpus=True)  # a parent beside a GPU, this process without
        layout = tf_grappler.grappler_config().graph_options.rewrite_options.layout_optimizer
        assert layout == rewriter_config_pb2.RewriterConfig.DEFAULT
        tf_grappler.describe_as(gpus=False)
        layout = tf_grappler.grappler_config().graph_options.rewrite_options.layout_optimizer
        assert layout == rewriter_config_pb2.RewriterConfig.OFF
    finally:
        tf_grappler._described_as.clear()
    assert tf_grappler.sees_gpu() == seen


RUNTIME_ORDER = """
import glob, os
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
memfit.measure(model, 8, repeats=1, recompute="sqrt")  # TensorFlow dumps the graph it runs
dumps = glob.glob(os.path.join(os.environ["TF_DUMP_GRAPH_PREFIX"], "*after_graph_optimization*"))
ran = graph_pb2.GraphDef()
text_format.Parse(open(max(dumps, key=os.path.getsize)).read(), ran)
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
"""


def test_grappler_orders_the_recompute_step_as_the_runtime(tmp_path):
    # The node order decides which of a convolution's two gradients the executor runs
    # inline (the other waits on the pool); the runtime's grappler also fetches the
    # function's control outputs, and without them 27 of MobileNetV2's 51 pairs came in
    # the other order (96 px b16, recompute sqrt).
    env = {
        "TF_DUMP_GRAPH_PREFIX": str(tmp_path),
        "TF_DUMP_GRAPH_NAME_FILTER": "*",
        "MEMFIT_MEMORY": "2GiB",
    }
    results = run_isolated(RUNTIME_ORDER, env=env)
    assert results["pairs"] >= 20
    assert results["same"] == results["pairs"]
