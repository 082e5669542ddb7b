"""Model Garden experiments named by module path in the tests (`garden:garden_tasks:NAME`).

The data path comes from `MEMFIT_TEST_OD`: the folder of OD-API TFRecords a test wrote.
"""

from __future__ import annotations

import os
from typing import Any


def experiment() -> Any:
    """A small RetinaNet experiment: ResNet-18, 128 px, 6 classes, no checkpoint."""
    import official.vision  # noqa: F401 - registers the experiments
    from official.core import exp_factory

    config = exp_factory.get_exp_config("retinanet_resnetfpn_coco")
    config.override(
        {
            "task": {
                "init_checkpoint": None,
                "model": {
                    "input_size": [128, 128, 3],
                    "num_classes": 6,
                    "backbone": {"resnet": {"model_id": 18}},
                },
                "train_data": {
                    "input_path": os.path.join(os.environ["MEMFIT_TEST_OD"], "train-*"),
                    "global_batch_size": 4,
                    "parser": {"aug_rand_hflip": False},
                },
            }
        },
        is_strict=True,
    )
    return config


def not_a_config() -> Any:
    """Returns something that is not an experiment config."""
    return {"task": "retinanet"}


def tf_keras_model() -> Any:
    """A tf_keras (Keras 2) model, which the Keras 3 commands refuse."""
    import tf_keras

    return tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(2)])
