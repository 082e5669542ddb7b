"""Child of test_search.py (the module fixture `searches`): the searches every test of the file
checks a part of, run once.
"""

from child import emit

import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import numpy as np
import memfit
import keras
import tensorflow as tf
from memfit.backend import tf as tfb

def mobilenet(size):
    model = keras.applications.MobileNetV2(weights=None, input_shape=(size, size, 3), classes=10)
    model.compile("adam", "sparse_categorical_crossentropy")
    return model

FIT_STEPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fit_steps.py")
out = {}
# 1. In process: the model is given here; the trials run on a saved copy in a child.
model = mobilenet(64)
model.optimizer.build(model.trainable_variables)


def state():
    variables = model.variables + model.optimizer.variables  # noqa: F821 - deleted later
    return [np.array(v.numpy()) for v in variables]


before = state()
baseline = tfb.memory_info("CPU:0")["current"]
result = memfit.find_batch_size(model, margin=0.0, max_batch=96)
out["search"] = result.to_dict()
# The default: a 5% margin, confirmed by 20 steps in a fresh process within 95% of the card.
out["default"] = memfit.find_batch_size(model, max_batch=96).to_dict()
out["same"] = all(np.array_equal(a, b) for a, b in zip(before, state(), strict=True))
out["iterations"] = int(model.optimizer.iterations.numpy())
out["baseline"], out["after"] = baseline, tfb.memory_info("CPU:0")["current"]

# 2-4 side by side (mostly waiting on child processes): the size found in a fresh process,
# independently of the search; batch 1 not fitting (an isolated search of
# a MODEL string: a real OOM in its child); and here, a dataset with one huge image.
folder = tempfile.mkdtemp()
path = os.path.join(folder, "model.keras")
model.save(path)
del model
size = result.batch_size

def train(b):
    # What a user does with the answer: model.fit on arrays, in a fresh process.
    proc = subprocess.run([sys.executable, FIT_STEPS, path, str(b)], capture_output=True,
                          text=True, timeout=600)
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {
        "batch_size": b, "error": proc.stderr[-2000:]}

with concurrent.futures.ThreadPoolExecutor(3) as pool:
    fresh = [pool.submit(train, out["default"]["batch_size"])]
    nothing = pool.submit(memfit.find_batch_size, path, budget="48MiB",
                          options=memfit.Options(isolated=True))

    images = [np.zeros((32, 32, 3), "float32")] * 30
    images[17] = np.zeros((320, 320, 3), "float32")
    ds = tf.data.Dataset.from_generator(
        lambda: ((img, np.int32(1)) for img in images),
        output_signature=(tf.TensorSpec((None, None, 3), tf.float32),
                          tf.TensorSpec((), tf.int32)))
    inputs = keras.Input((None, None, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    anysize = keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(x))
    anysize.compile("adam", "sparse_categorical_crossentropy")
    huge = memfit.find_batch_size(anysize, data=ds, margin=0.0)
    first = memfit.measure(anysize, 1, data=ds, options=memfit.Options(repeats=1))  # 1st sample
    out["huge"] = {**huge.to_dict(), "first_step": first.step_bytes,
                   "resident": first.resident_bytes}
    out["fresh"] = [f.result() for f in fresh]
    none = nothing.result()
    out["none"] = {**none.to_dict(), "summary": none.summary()}
emit(out)
