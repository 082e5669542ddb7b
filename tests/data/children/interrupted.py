"""Child of test_data_service.py::test_workers_end_with_an_exception_and_with_ctrl_c, run
with `raise` or `sigint` as its argument: trains with two workers until its callback raises
or Ctrl-C arrives.
"""

from served import B, build, workers, x, y
import signal
import sys
import time
import memfit
import tensorflow as tf
import keras

import faulthandler
faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks, should it hang
# Ctrl-C as in a terminal: a job started in the background (CI) inherits SIGINT
# ignored, and Python then installs no KeyboardInterrupt for it.
signal.signal(signal.SIGINT, signal.default_int_handler)


class Stop(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            print("pids", *[p.pid for p in workers()], flush=True)
            if sys.argv[1] == "raise":
                raise RuntimeError("the user's callback failed")
            time.sleep(600)  # Ctrl-C arrives here


ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(B).repeat()
memfit.fit(build(), ds, steps_per_epoch=50, verbose=0, callbacks=[Stop()],
           data_service=2)
