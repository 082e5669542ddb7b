"""What the children of test_data_service.py share: a conv net at 96 px, batch 8 (0.84 MiB a
batch), its data, and `Probe`, which records the bytes in use between steps and each step's
peak (GuardedStep's phases). A child imports it first: it imports memfit before TensorFlow.
"""

import memfit  # noqa: F401  (first: applies MEMFIT_MEMORY before TensorFlow is imported)
import numpy as np
import tensorflow as tf
import keras
import psutil

B = 8
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).random((256, 96, 96, 3), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 10, 256)


def build():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([
        keras.Input((96, 96, 3)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


class Probe(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.in_use, self.peaks, self.workers = [], [], []
    def on_train_batch_end(self, batch, logs=None):
        info = tf.config.experimental.get_memory_info("CPU:0")
        step = self.model.train_function.guarded_step
        self.in_use.append(info["current"])
        self.peaks.append(max(step._gradients_peak or 0, step._update_peak or 0))
        self.workers.append(len(workers()))


def workers():
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "memfit.data.service_worker" in " ".join(
                p.cmdline()
            ):
                found.append(p)
        except psutil.Error:
            pass
    return found


def summary(probe):
    return {"in_use": float(np.median(probe.in_use[3:])), "peak": max(probe.peaks[3:]),
            "workers": max(probe.workers)}
