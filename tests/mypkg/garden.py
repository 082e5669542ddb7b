"""Small TF Model Garden detectors for tests and benchmarks, as `memfit --set` overrides.

The Model Garden's experiments (`retinanet_resnetfpn_coco`, `maskrcnn_resnetfpn_coco`) are
COCO-sized; these overrides make them small enough for 2 CPU cores (ResNet-18 or -50, a
given image side, 6 classes, no checkpoint to download) and point them at OD-API TFRecords
that `memfit.data.synth.write_dataset` writes (with `masks=True` for Mask R-CNN).
"""

from __future__ import annotations


def retinanet_sets(input_path: str, size: int = 128, model_id: int = 18) -> list[str]:
    """`key.path=value` overrides of a small `retinanet_resnetfpn_coco`.

    Args:
        input_path: the training records' file pattern (`.../train-*`).
        size: the image side the task resizes to.
        model_id: the ResNet's depth.
    """
    return [
        "task.init_checkpoint=null",
        f"task.model.input_size=[{size},{size},3]",
        "task.model.num_classes=6",
        f"task.model.backbone.resnet.model_id={model_id}",
        f"task.train_data.input_path={input_path}",
        "task.train_data.parser.aug_rand_hflip=false",
    ]


def mask_rcnn_sets(input_path: str, size: int = 128, model_id: int = 18) -> list[str]:
    """`key.path=value` overrides of a small `maskrcnn_resnetfpn_coco`: 64-filter heads, 32
    sampled ROIs and 8 masks an image, float32, no augmentation.

    Args:
        input_path: the training records' file pattern (records with instance masks).
        size: the image side the task resizes to.
        model_id: the ResNet's depth.
    """
    return [
        "runtime.mixed_precision_dtype=float32",
        "task.init_checkpoint=null",
        f"task.model.input_size=[{size},{size},3]",
        "task.model.num_classes=6",
        "task.model.include_mask=true",
        f"task.model.backbone.resnet.model_id={model_id}",
        "task.model.decoder.fpn.num_filters=64",
        "task.model.rpn_head.num_filters=64",
        "task.model.detection_head.num_filters=64",
        "task.model.detection_head.fc_dims=128",
        "task.model.mask_head.num_filters=64",
        "task.model.mask_head.num_convs=1",
        "task.model.roi_sampler.num_sampled_rois=32",
        "task.model.mask_sampler.num_sampled_masks=8",
        f"task.train_data.input_path={input_path}",
        "task.train_data.parser.aug_rand_hflip=false",
        "task.train_data.parser.aug_scale_min=1.0",
        "task.train_data.parser.aug_scale_max=1.0",
        "task.train_data.parser.rpn_batch_size_per_im=32",
        "task.train_data.parser.mask_crop_size=28",
        "task.train_data.parser.max_num_instances=8",
    ]


def as_options(values: list[str]) -> list[str]:
    """The overrides as CLI options: `["--set", value, ...]`."""
    return [arg for value in values for arg in ("--set", value)]
