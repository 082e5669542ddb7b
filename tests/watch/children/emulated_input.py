"""Child of test_watch_emulated_input.py: plain `model.fit` and `memfit.fit`, each with a
Watch, on arrays under an emulated card; the warnings each printed.
"""

from child import emit

import contextlib
import io
import memfit
import numpy as np
import keras

def run(plain):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((96, 96, 3)), keras.layers.Conv2D(16, 3),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.rand(256, 96, 96, 3).astype("float32")
    y = np.random.randint(0, 10, 256)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        kw = dict(batch_size=8, epochs=2, verbose=0, callbacks=[memfit.Watch(verbose=1)])
        model.fit(x, y, **kw) if plain else memfit.fit(model, x, y, **kw)
    return [line for line in err.getvalue().splitlines() if line.startswith("memfit: warning:")]

emit({"plain": run(True), "memfit": run(False)})
