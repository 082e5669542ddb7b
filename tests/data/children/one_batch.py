"""Child of test_data_service.py::test_served_pipelines_hold_one_batch_like_the_card."""

from child import emit

from served import B, Probe, build, summary, workers, x, y
import memfit
import tensorflow as tf


def run(feed, data_service="auto"):
    model, probe = build(), Probe()
    kw = dict(epochs=1, callbacks=[probe], verbose=0, data_service=data_service)
    if feed == "one":
        def one():
            while True:
                yield x[:B], y[:B]
        memfit.fit(model, one(), steps_per_epoch=16, **kw)
    elif feed == "arrays":
        memfit.fit(model, x[:128], y[:128], batch_size=B, **kw)
    else:
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000, seed=0).batch(B)
        memfit.fit(model, ds.repeat().prefetch(tf.data.AUTOTUNE), steps_per_epoch=16, **kw)
    return dict(summary(probe), left=len(workers()))

emit({f: run(f) for f in ("one", "arrays", "tfdata")} | {"local": run("tfdata", None)})
