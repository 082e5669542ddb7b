"""The Model Garden's Mask R-CNN trains in micro-batches through `GuardedStep.from_task`.

A small `maskrcnn_resnetfpn_coco` (ResNet-18, 128 px, few sampled ROIs and masks) on
synthetic OD-API records with instance masks (`write_dataset(masks=True)`): the mask head
trains on them, so this is Mask R-CNN training, not Faster R-CNN's. Its ROI and mask samplers
loop over the batch in Python and need a static batch size: micro-batches of one size get
one; unequal ones cannot, and memfit says so in one line.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow

BATCH = 4


def _config(input_path: str, batch: int) -> Any:
    from official.core import exp_factory

    config = exp_factory.get_exp_config("maskrcnn_resnetfpn_coco")
    small = {"num_filters": 64}
    config.override(
        {
            "runtime": {"mixed_precision_dtype": "float32"},
            "task": {
                "init_checkpoint": None,
                "model": {
                    "input_size": [128, 128, 3],
                    "num_classes": 6,
                    "include_mask": True,
                    "backbone": {"resnet": {"model_id": 18}},
                    "decoder": {"fpn": small},
                    "rpn_head": small,
                    "detection_head": {**small, "fc_dims": 128},
                    "mask_head": {**small, "num_convs": 1},
                    "roi_sampler": {"num_sampled_rois": 32},
                    "mask_sampler": {"num_sampled_masks": 8},
                },
                "train_data": {
                    "input_path": input_path,
                    "global_batch_size": batch,
                    "parser": {
                        "aug_rand_hflip": False,
                        "aug_scale_min": 1.0,
                        "aug_scale_max": 1.0,
                        "rpn_batch_size_per_im": 32,
                        "mask_crop_size": 28,
                        "max_num_instances": 8,
                    },
                },
            },
        },
        is_strict=False,
    )
    return config


@pytest.fixture(scope="module")
def garden(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The task, one batch of its pipeline, and a factory of identically initialised models."""
    import official.vision  # noqa: F401  (registers the experiments)
    from official.core import task_factory

    from memfit.data.synth import write_dataset

    directory = tmp_path_factory.mktemp("seg")
    write_dataset(
        str(directory), count=8, shards=2, image_size=(128, 128), num_classes=5, masks=True
    )
    config = _config(str(directory / "train-*"), BATCH)
    task = task_factory.get_task(config.task)
    batch = next(iter(task.build_inputs(config.task.train_data)))
    first = task.build_model()

    def build() -> tuple[Any, Any]:
        model = task.build_model()
        model.set_weights(first.get_weights())
        optimizer = task.create_optimizer(config.trainer.optimizer_config, config.runtime)
        return model, optimizer

    return {"task": task, "batch": batch, "build": build, "input_path": str(directory / "train-*")}


def _train(garden: dict[str, Any], k: int, steps: int = 2) -> dict[str, Any]:
    import memfit

    model, optimizer = garden["build"]()
    before = [w.copy() for w in model.get_weights()]
    trainable_before = [v.numpy().copy() for v in model.trainable_variables]
    step = memfit.GuardedStep.from_task(garden["task"], model, optimizer, micro_batches=k)
    losses = [float(step(garden["batch"])["loss"]) for _ in range(steps)]
    return {
        "step": step,
        "losses": losses,
        "iterations": int(optimizer.iterations.numpy()),
        "moved": [
            float(np.max(np.abs(v.numpy() - b)))
            for v, b in zip(model.trainable_variables, trainable_before, strict=True)
        ],
        "names": [v.name for v in model.trainable_variables],
        "changed": sum(
            not np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True)
        ),
    }


def test_mask_rcnn_trains_at_two_micro_batches_like_one(garden: dict[str, Any]) -> None:
    labels = garden["batch"][1]
    assert "gt_masks" in labels  # the parser read the instance masks: the mask head trains
    one = _train(garden, k=1)
    two = _train(garden, k=2)
    for run in (one, two):
        assert run["step"].summary.updates == 2 == run["iterations"]
        assert not run["step"].summary.recoveries
        assert all(math.isfinite(loss) for loss in run["losses"])
        assert run["losses"][1] < run["losses"][0]  # the first update lowered the loss
    assert two["step"].summary.micro_batches == {next(iter(two["step"].summary.micro_batches)): 2}
    # Every head got an update, the mask head included.
    moved = dict(zip(two["names"], two["moved"], strict=True))
    for head in ("rpn_head", "detection_head", "mask_head", "lateral_", "residual_block"):
        assert max(m for name, m in moved.items() if head in name) > 0, head
    # Same weights, same batch: the first step's loss is the same model's loss on it, up to
    # what differs between one batch of 4 and two of 2 (the samplers draw their own ROIs and
    # anchors, batch norm's statistics are per micro-batch, each half normalised alone).
    assert two["losses"][0] == pytest.approx(one["losses"][0], rel=0.15)


def test_unequal_micro_batches_are_refused_naming_the_layer(garden: dict[str, Any]) -> None:
    import tensorflow as tf

    import memfit

    model, optimizer = garden["build"]()
    step = memfit.GuardedStep.from_task(garden["task"], model, optimizer, micro_batches=2)
    three = tf.nest.map_structure(lambda t: t[:3], garden["batch"])
    with pytest.raises(memfit.MemfitError) as raised:
        step(three)
    message = str(raised.value)
    assert "\n" not in message
    assert "batch of 3 into 2 micro-batches" in message
    assert re.search(r"layer 'box_sampler(_\d+)?' \(BoxSampler\)", message), message
    assert "batch size that 2 divides" in message
    assert int(optimizer.iterations.numpy()) == 0


def test_plan_splits_the_batch_into_equal_micro_batches_and_confirms_them(
    garden: dict[str, Any],
) -> None:
    """`memfit plan` of Mask R-CNN's own step: batch 16 runs out of memory whole under
    600 MiB; only K that split it equally are tried (its samplers need a static batch), and
    the one chosen trains 20 steps of `GuardedStep.from_task` in a fresh process."""
    import json

    from helpers import run_cli
    from mypkg.garden import as_options, mask_rcnn_sets

    proc = run_cli(
        "plan", "garden:maskrcnn_resnetfpn_coco", *as_options(mask_rcnn_sets(garden["input_path"])),
        "-b", "16", "--memory", "600MiB", "--json", env={"TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["fits"] and plan["confirmed"] and plan["precision"] == "task's own", plan
    assert plan["micro_batches"] in (2, 4, 8) and plan["peak_bytes"] <= plan["limit_bytes"]
    whole = [c for c in plan["candidates"] if c["micro_batches"] == 1]
    assert whole and not whole[0]["fits"], plan["candidates"]
    assert all(16 % c["micro_batches"] == 0 for c in plan["candidates"])
