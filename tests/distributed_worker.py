"""One worker of test_distributed: `memfit.fit` under MultiWorkerMirroredStrategy.

Run as `python distributed_worker.py BUDGET OUT.npz [ARM_AT]` with TF_CONFIG set (one worker
of a loopback cluster), or without TF_CONFIG for the single-worker reference. It trains
`factories.any_size_cnn` (with `FlakyAdam`) on two shards of images, the later at a higher
resolution, at a global batch of 16, saves the weights to OUT.npz and prints one line
`RESULT {json}`: the summary (K per shape, recoveries), the update count, and how many
collective ops each of the step's compiled functions holds.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import memfit

GLOBAL_BATCH = 16


def shards() -> list[tuple[Any, Any]]:
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for size, count in ((24, 48), (256, 32)):
        x = rng.uniform(0, 1, (count, size, size, 3)).astype("float32")
        y = rng.uniform(0, 1, (count, 4)).astype("float32")
        out.append((x, y))
    return out


def dataset() -> Any:
    import tensorflow as tf

    parts = [tf.data.Dataset.from_tensor_slices(s).batch(GLOBAL_BATCH) for s in shards()]
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return parts[0].concatenate(parts[1]).with_options(options)


def flaky_adam(arm_at: int) -> Any:
    """Adam that, on update `arm_at` (once), runs out of memory for real inside the update:
    after updating the third variable it allocates 2 GiB. Adam otherwise, bit for bit."""
    import keras
    import tensorflow as tf

    class FlakyAdam(keras.optimizers.Adam):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.armed = tf.Variable(0.0, trainable=False)

        def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
            super().update_step(gradient, variable, learning_rate)
            if self._get_variable_index(variable) != 2:
                return

            def boom() -> Any:
                with tf.control_dependencies([self.armed.assign(0.0)]):
                    big = tf.random.uniform([512 * 1024 * 1024])
                return tf.minimum(tf.reduce_max(big), 0.0)

            hit = tf.cond(
                tf.logical_and(self.armed > 0, tf.equal(self.iterations, arm_at)),
                boom,
                lambda: 0.0,
            )
            with tf.control_dependencies([hit]):
                variable.assign_add(tf.zeros_like(variable))

    return FlakyAdam(learning_rate=1e-3)


def collectives(fn: Any) -> int:
    """How many collective ops the traced graphs of tf.function `fn` hold (nested too)."""
    count = 0
    for concrete in fn._list_all_concrete_functions():
        graph = concrete.graph.as_graph_def()
        nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
        count += sum(1 for n in nodes if n.op.startswith("Collective"))
    return count


def main() -> None:
    budget, out = sys.argv[1], sys.argv[2]
    arm_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    memfit.emulate(budget)  # before TensorFlow starts: this worker's own allocator
    import keras
    import numpy as np
    import tensorflow as tf
    from factories import any_size_cnn

    if "TF_CONFIG" in os.environ:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        print("STRATEGY-UP", flush=True)  # the cluster started: a failure after it is memfit's
    else:
        strategy = tf.distribute.get_strategy()
    with strategy.scope():
        model = any_size_cnn()
        optimizer = flaky_adam(arm_at)
        model.compile(optimizer=optimizer, loss="mse")
    # Armed after it is created: a variable's first value is worker 0's on every worker.
    optimizer.armed.assign(1.0 if arm_at >= 0 else 0.0)
    functions: dict[str, int] = {}  # collective ops per compiled function of the step
    agreement: dict[str, bool] = {}

    class CountCollectives(keras.callbacks.Callback):
        def on_train_end(self, logs: Any = None) -> None:
            guarded = self.model.train_function.guarded_step
            agreement["active"] = guarded._agreement.active
            step = guarded._step
            for k, fn in step._gradient_fns.items():
                functions[f"gradients_k{k}"] = collectives(fn)
            if step._apply_reduced_fn is not None:
                functions["apply_reduced"] = collectives(step._apply_reduced_fn)
                functions["reduce"] = collectives(step._reduce_fn)

    history = memfit.fit(model, dataset(), epochs=1, verbose=0, callbacks=[CountCollectives()])
    result = {
        "summary": history.memfit.to_dict(),
        "iterations": int(model.optimizer.iterations.numpy()),
        "replicas": strategy.num_replicas_in_sync,
        "collectives": functions,
        "agreement_active": agreement["active"],
    }
    np.savez(out, *model.get_weights())
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
