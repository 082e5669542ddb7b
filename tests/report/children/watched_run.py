"""Child of test_report.py (the run_log fixture): a watched run that diverges, its log written
to `log`, named `name`.
"""

from child import arguments, emit

ARGS = arguments()
import memfit  # first: applies MEMFIT_MEMORY before TensorFlow is imported
import numpy as np
import keras
rng = np.random.default_rng(0)
x = rng.random((320, 32, 32, 3), dtype=np.float32)
y = rng.integers(0, 10, 320)
keras.utils.set_random_seed(1)
m = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(16, 3, activation="relu"),
                      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
m.compile(keras.optimizers.Adam(10.0),
          keras.losses.SparseCategoricalCrossentropy(from_logits=True))
w = memfit.Watch(log_path=ARGS["log"], name=ARGS["name"], estimate=40 * 2**20, verbose=False,
                 config={"remat": "none"})
m.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[w])
emit([f.kind for f in w.findings])
