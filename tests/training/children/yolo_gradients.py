"""Child of test_accumulate_detectors.py::test_yolo_micro_batches_train_a_different_objective."""

from child import emit

import keras
import numpy as np
from memfit.workload.accumulate import AccumulatingStep


def freeze_batchnorm(model):
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False


def difference(model, data):
    step = AccumulatingStep(model)
    full, split = step.gradients(data, 1), step.gradients(data, 2)
    a = np.concatenate([g.numpy().ravel() for g in full])
    b = np.concatenate([g.numpy().ravel() for g in split])
    return float(np.linalg.norm(b - a) / np.linalg.norm(a))


from mypkg import detectors as d
data = next(iter(d.yolo_samples(4, 128).batch(4)))
live = difference(d.yolo_detector(128), data)
model = d.yolo_detector(128)
freeze_batchnorm(model)
emit({"live": live, "frozen": difference(model, data)})
