"""One worker of test_backup's multi-worker preemption test: `memfit.fit(backup_dir=...)`.

Run as `python backup_worker.py BACKUP_DIR OUT.npz [READY_AT]` with TF_CONFIG set (one worker
of a loopback cluster). It trains a tiny dense model for 2 epochs of 6 updates (global batch 8)
with `backup_dir`; with READY_AT, at that update it writes BACKUP_DIR.ready-<task> and waits
(up to 10 s, until BACKUP_DIR.sent) for the test to send it SIGTERM. It saves the weights to
OUT.npz and prints `RESULT {json}` (update count, K per shape); preempted, it exits 143.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import memfit

GLOBAL_BATCH = 8


def main() -> None:
    backup_dir, out = sys.argv[1], sys.argv[2]
    ready_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    logging.getLogger("memfit").addHandler(logging.StreamHandler())  # its lines at verbose=0
    logging.getLogger("memfit").setLevel(logging.INFO)
    memfit.emulate("256MiB")  # before TensorFlow starts: this worker's own allocator
    import keras
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = strategy.cluster_resolver.task_id
    print("STRATEGY-UP", flush=True)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (48, 8)).astype("float32")
    y = rng.uniform(0, 1, (48, 2)).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)]
        )
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")

    class Ready(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if int(self.model.optimizer.iterations.numpy()) == ready_at:
                open(f"{backup_dir}.ready-{task}", "w").close()
                for _ in range(1000):
                    if os.path.exists(backup_dir + ".sent"):
                        break
                    time.sleep(0.01)

    history = memfit.fit(
        model, data, epochs=2, verbose=0, backup_dir=backup_dir, callbacks=[Ready()]
    )
    result = {
        "iterations": int(model.optimizer.iterations.numpy()),
        "micro_batches": history.memfit.to_dict()["micro_batches"],
        "loss": history.history["loss"],
    }
    np.savez(out, *model.get_weights())
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
