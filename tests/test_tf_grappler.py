"""memfit.backend.tf_grappler: the graph grappler makes of the step, with its cheaper config."""

from __future__ import annotations

from helpers import run_isolated

SAME_NODES = """
import keras
from tensorflow.core.protobuf import config_pb2
from memfit.backend import tf as tfb, tf_grappler, tf_trace
from memfit.workload import Workload

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
