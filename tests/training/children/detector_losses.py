"""Child of test_accumulate_detectors.py::test_detector_losses_are_not_sums_over_images."""

from child import emit

import keras
import tensorflow as tf


def additivity(model, x, y):
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False

    def loss(a, b):
        xs = tf.nest.map_structure(lambda t: t[a:b], x)
        ys = tf.nest.map_structure(lambda t: t[a:b], y)
        pred = model(xs, training=True)
        return float(model.compute_loss(x=xs, y=ys, y_pred=pred, sample_weight=None))

    full = loss(0, 4)
    return abs(full - (loss(0, 2) + loss(2, 4)) / 2) / abs(full)


import memfit.zoo as zoo
from mypkg import detectors as d
keras.utils.set_random_seed(0)
out = {}
x, y = next(iter(zoo.detection_samples(4, 128, max_objects=4).batch(4)))
out["retinanet"] = additivity(zoo.retinanet(128), x, y)
x, y = next(iter(d.dfine_samples(4, 64).batch(4)))
out["d_fine"] = additivity(d.dfine_detector(64), x, y)
try:
    import kyolo  # noqa: F401
    x, y = next(iter(d.yolo_samples(4, 128).batch(4)))
    out["yolo"] = additivity(d.yolo_detector(128), x, y)
except ImportError:
    pass
emit(out)
