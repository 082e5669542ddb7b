"""memfit.backend.tf_grappler: the graph grappler makes of the step, with its cheaper config."""

from __future__ import annotations

from pathlib import Path

from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"

SAME_NODES = CHILDREN / "same_nodes.py"


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


RUNTIME_ORDER = CHILDREN / "runtime_order.py"


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
