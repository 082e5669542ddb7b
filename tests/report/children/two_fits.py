"""Child of test_report.py (the two_fit_log fixture): one memfit.Watch for two fits, its log
written to `log`.
"""

from child import arguments, emit

ARGS = arguments()
import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np
import keras
rng = np.random.default_rng(0)
x = rng.random((320, 32, 32, 3), dtype=np.float32)
y = (x[:, :8, :8, 0].mean(axis=(1, 2)) * 10).astype("int64").clip(0, 9)
keras.utils.set_random_seed(1)
m = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(16, 3, activation="relu"),
                      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
m.compile(keras.optimizers.Adam(1e-3),
          keras.losses.SparseCategoricalCrossentropy(from_logits=True))
w = memfit.Watch(log_path=ARGS["log"], name="two-fits", verbose=False)
m.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[w])
m.fit(x[:160], y[:160], batch_size=8, epochs=1, verbose=0, callbacks=[w])
emit({"runs": w.runs, "steps": len(w.steps)})
