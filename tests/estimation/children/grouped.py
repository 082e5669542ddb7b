"""Child of test_estimate.py: a grouped convolution's step, estimated and measured."""

from child import emit

import memfit
import keras
from memfit.backend import tf as tfb
tf = tfb.import_tf()
tf.config.threading.set_inter_op_parallelism_threads(1)
inputs = keras.Input((3, 3, 256))
x = inputs
for _ in range(2):
    x = keras.layers.Conv2D(256, 7, padding="same", groups=256)(x)
model = keras.Model(inputs, x)
model.compile(optimizer="sgd", loss="mse")
measured = memfit.measure(model, 2, options=memfit.Options(repeats=2))
emit({"measured": measured.peak_bytes, "predicted": memfit.estimate(model, 2).peak_bytes})
