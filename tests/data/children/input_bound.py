"""Child of test_data_service.py::test_workers_lower_an_input_bound_runs_wait."""

from child import emit

import served  # noqa: F401  (its model and data, imported as the other children do)
import memfit
import numpy as np
import tensorflow as tf
import keras

from tensorflow.python.data.experimental.ops import testing  # a sleep op a worker can run


def run(data_service):
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
    model.compile("sgd", "mse")
    ds = tf.data.Dataset.from_tensor_slices(
        (np.ones((512, 16), "float32"), np.ones((512, 4), "float32"))).batch(8).repeat()
    ds = ds.apply(testing.sleep(40_000)).prefetch(2)
    watch = memfit.Watch(verbose=0)
    memfit.fit(model, ds, steps_per_epoch=60, verbose=0, callbacks=[watch],
               data_service=data_service)
    found = [f for f in watch.findings if f.kind == "input_bound"]
    return {"wait": watch.summary()["input_wait_fraction"],
            "step": watch.summary().get("step_seconds_median"),
            "fix": found[0].fix if found else None}

emit({"local": run(None), "served": run(4)})
