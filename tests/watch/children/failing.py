"""Child of test_watch_oom.py (the module fixture `failures`): the failing scenarios one after
the other, each watched.
"""

from child import emit

from oom_scenarios import batches, result, run  # first: memfit before TensorFlow

import tensorflow as tf
import keras

run("shard", batches([(16, 64, 8), (16, 160, 2)]))

aug = batches([(16, 80, 14)]).enumerate().map(
    lambda i, xy: (tf.cond(i >= 8, lambda: tf.image.resize(xy[0], (160, 160)),
                           lambda: xy[0]), xy[1]))
run("augmentation", aug)
run("batch", batches([(16, 96, 8), (64, 96, 2)]))


class Keep(keras.callbacks.Callback):
    kept = []

    def on_train_batch_end(self, batch, logs=None):
        self.kept.append(tf.ones((2**20,)))  # 4 MiB kept per step


run("growth", batches([(16, 64, 60)]), callbacks=[Keep()])
Keep.kept.clear()
run("guarded", batches([(16, 64, 8), (16, 160, 2)]), guarded=True)
emit(result)
