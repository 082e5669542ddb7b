"""Child of test_watch.py (the module fixture `runs`): the watched scenarios; `logs` is the
folder for their logs.
"""

from child import arguments, emit

import os
import time
import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np
import tensorflow as tf
import keras

ARGS = arguments()
LOGS = ARGS["logs"]
rng = np.random.default_rng(0)
x = rng.random((1024, 32, 32, 3), dtype=np.float32)
y = (x[:, :16, :16, 0].mean(axis=(1, 2)) * 10).astype("int64").clip(0, 9)  # learnable
result = {}

def cnn(lr=1e-3, seed=1):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    m.compile(keras.optimizers.Adam(lr),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m

def watch(log, **kw):
    return memfit.Watch(log_path=os.path.join(LOGS, log + ".jsonl"), verbose=False, **kw)

def done(name, w, **extra):
    # Each scenario starts clean: the repeated-fit detector would rightly see old models.
    import gc
    keras.backend.clear_session()
    gc.collect()
    result[name] = dict(
        findings=[f.to_dict() for f in w.findings], steps=len(w.steps),
        losses=[w._losses.get(s["step"]) for s in w.steps], summary=w.summary(), **extra)

# 1. memfit.fit retraces for every new input shape: memory grows, retracing named.
keras.utils.set_random_seed(2)
inp = keras.Input((None, None, 3))
h = keras.layers.Conv2D(16, 3, activation="relu")(inp)
h = keras.layers.GlobalAveragePooling2D()(h)
h = keras.layers.Dense(1024, activation="relu")(h)
m = keras.Model(inp, keras.layers.Dense(10)(h))
m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
def shapes():
    for s in rng.permutation(np.arange(24, 54)):
        yield rng.random((8, s, s, 3), dtype=np.float32), rng.integers(0, 10, 8)
ds = tf.data.Dataset.from_generator(shapes, output_signature=(
    tf.TensorSpec((8, None, None, 3)), tf.TensorSpec((8,), tf.int64)))
w = watch("retrace")
memfit.fit(m, ds, epochs=1, verbose=0, callbacks=[w])
done("retrace", w)

# 2. A callback keeps every step's feature maps (tensors) in a list: memory grows.
m = cnn()
probe = tf.constant(x[:16])
features = keras.Model(m.inputs, m.layers[0].output)
class KeepOutputs(keras.callbacks.Callback):
    kept = []
    def on_train_batch_end(self, batch, logs=None):
        self.kept.append(features(probe))  # noqa: F821 - deleted after the fit
w = watch("leak", name="<script>window.__pwned=1;document.title='PWNED'</script>",
          estimate=60 * 2**20)
m.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[KeepOutputs(), w])
KeepOutputs.kept.clear()
del m, probe, features
done("leak", w)

# 3. map without parallelism + a sleep per sample: input-bound.
def slow(a, b):
    time.sleep(0.004)
    return a, b
ds = (tf.data.Dataset.from_tensor_slices((x[:640], y[:640]))
      .map(lambda a, b: tf.numpy_function(slow, [a, b], [tf.float32, tf.int64]))
      .map(lambda a, b: (tf.ensure_shape(a, (32, 32, 3)), tf.ensure_shape(b, ())))
      .batch(16))
w = watch("input")
cnn().fit(ds, epochs=1, verbose=0, callbacks=[w])
done("input", w)

# 4. Learning rate 10 on a small CNN: diverging, flagged before any NaN.
w = watch("lr10")
cnn(lr=10.0).fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[w])
done("lr10", w)

# 5. Three clean models: no finding.
w = watch("clean_cnn")  # numpy arrays, two epochs with validation
cnn().fit(x[:768], y[:768], batch_size=16, epochs=2, verbose=0,
          validation_data=(x[768:], y[768:]), callbacks=[w])
done("clean_cnn", w)

keras.utils.set_random_seed(3)  # an MLP regression from a parallel, prefetched tf.data
tab = rng.normal(size=(2048, 20)).astype("float32")
target = (tab @ rng.normal(size=(20, 1)) + 0.1 * rng.normal(size=(2048, 1))).astype("float32")
ds = (tf.data.Dataset.from_tensor_slices((tab, target)).shuffle(2048)
      .map(lambda a, b: (a * 1.0, b), num_parallel_calls=tf.data.AUTOTUNE)
      .batch(32).prefetch(tf.data.AUTOTUNE))
mlp = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                        keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
mlp.compile(keras.optimizers.Adam(1e-3), "mse")
tb = os.path.join(LOGS, "tb")
w = watch("clean_mlp", log_dir=tb)
mlp.fit(ds, epochs=2, verbose=0, callbacks=[w])
tags = set()
for name in os.listdir(tb):
    for record in tf.data.TFRecordDataset(os.path.join(tb, name)):
        event = tf.compat.v1.Event.FromString(record.numpy())
        tags.update(v.tag for v in event.summary.value)
done("clean_mlp", w, tensorboard_tags=sorted(tags))

keras.utils.set_random_seed(4)  # a text classifier (embedding + GRU) through memfit.fit
tokens = rng.integers(1, 500, (640, 24))
labels = (tokens[:, :4].mean(axis=1) > 250).astype("int64")
txt = keras.Sequential([keras.Input((24,), dtype="int64"), keras.layers.Embedding(500, 32),
                        keras.layers.GRU(32), keras.layers.Dense(2)])
txt.compile(keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True))
w = watch("clean_text")
memfit.fit(txt, tokens, labels, batch_size=16, epochs=2, verbose=0, callbacks=[w])
done("clean_text", w)

keras.utils.set_random_seed(12)  # the false alarm: random targets, batch 4, 60 steps
noise_rng = np.random.default_rng(12)
noise_x = noise_rng.normal(size=(240, 8)).astype("float32")
noise_y = noise_rng.normal(size=(240, 1)).astype("float32")
reg = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                        keras.layers.Dense(1)])
reg.compile(keras.optimizers.Adam(1e-3), "mse")
w = watch("clean_batch4")
reg.fit(noise_x, noise_y, batch_size=4, epochs=1, verbose=0, shuffle=False, callbacks=[w])
done("clean_batch4", w)

# 6. Near the budget: a Watch budget just above the step's peak; names the batch that OOMs.
first = watch("near_probe")
cnn().fit(x[:160], y[:160], batch_size=16, epochs=1, verbose=0, callbacks=[first])
budget = int(first.summary()["peak_bytes"] / 0.95)
w = watch("near", budget=budget)
cnn().fit(x[:160], y[:160], batch_size=16, epochs=1, verbose=0, callbacks=[w])
done("near", w, budget=budget)

# 7. memfit.fit recovers from a real OOM (192x192 batch 16 under the 256 MiB budget).
keras.utils.set_random_seed(5)
inp = keras.Input((None, None, 3))
h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inp)
h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
h = keras.layers.GlobalAveragePooling2D()(h)
big = keras.Model(inp, keras.layers.Dense(4)(h))
big.compile(keras.optimizers.Adam(1e-3), "mse")
bx = rng.random((32, 192, 192, 3), dtype=np.float32)
by = rng.random((32, 4), dtype=np.float32)
w = watch("oom")
memfit.fit(big, bx, by, batch_size=16, epochs=1, verbose=0, callbacks=[w])
done("oom", w)
emit(result)
