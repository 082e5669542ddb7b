"""Child of test_tf_keras_step.py: a shard of 128 px images after one of 32 px; `mode` "tight" runs
tf_keras' own fit first (it dies), "roomy" only memfit.fit.
"""

from child import arguments, emit

from tf_keras_model import build, weights  # first: memfit, then TensorFlow
import tensorflow as tf

import memfit
import numpy as np

mode = arguments()["mode"]
rng = np.random.default_rng(5)
# A first shard at 32 px, then one at 128 px: 16x the activations.
def shard(size):
    images = rng.normal(size=(32, size, size, 3)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((images, rng.uniform(size=(32, 4)).astype("float32")))
data = shard(32).batch(16).concatenate(shard(128).batch(16))
out = {}
if mode == "tight":
    plain = build("legacy_sgd")
    try:
        plain.fit(data, epochs=1, verbose=0)
        out["plain"] = "completed"
    except tf.errors.ResourceExhaustedError:
        out["plain"] = "ResourceExhaustedError"
model = build("legacy_sgd")
h = memfit.fit(model, data, epochs=1, verbose=0)
out.update(weights=weights(model), iterations=int(model.optimizer.iterations),
           summary=h.memfit.to_dict())
emit(out)
