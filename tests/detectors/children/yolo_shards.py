"""Child of test_detectors_yolo.py: kyolo's YOLOv8 on 16 images at 128 px, then a new shard of
16 at 256 px, batches of 8, under a 250 MiB card. `mode` "plain": Keras' own fit (it dies);
"watched": `memfit.fit` with a Watch logging to `log`.
"""

from child import arguments, emit

import memfit

memfit.emulate("250MiB")
import tensorflow as tf
from mypkg import detectors as d

ARGS = arguments()


def data():  # 16 images at 128 px, then a new shard of 16 at 256 px; batches of 8
    small = d.yolo_samples(16, 128).batch(8)
    return small.concatenate(d.yolo_samples(16, 256, seed=1).batch(8))


if ARGS["mode"] == "plain":
    try:
        d.yolo_detector(None).fit(data(), epochs=1, verbose=0)
        emit("completed")
    except tf.errors.ResourceExhaustedError:
        emit("ResourceExhaustedError")
else:
    model = d.yolo_detector(None)
    watch = memfit.Watch(log_path=ARGS["log"], name="yolo", verbose=False)
    history = memfit.fit(model, data(), epochs=1, callbacks=[watch], verbose=0)
    emit({"summary": history.memfit.to_dict(),
          "updates": int(model.optimizer.iterations.numpy()),
          "loss": float(history.history["loss"][-1]),
          "findings": [f.to_dict()["kind"] for f in watch.findings]})
