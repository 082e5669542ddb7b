"""Keras 3 detectors the tests train through every memfit command, built from config offline.

Two families people train, each small enough for a test on 2 CPU cores and each trained the
way its own package documents it:

- keras-hub **D-FINE** (`DFineObjectDetector`): a DETR-family detector on a small HGNetV2,
  Hungarian matching, its own `compute_loss` (compiled with `model.compile(optimizer=...)`).
  Targets per image: `{"boxes": (N, 4) normalised center_xywh, "labels": (N,)}`. Its anchors
  are fixed by `anchor_image_size`, so one model takes one image size.
- kyolo **YOLOv8-n** wrapped in `kyolo.training.YOLODetector` with `YOLODetectionLoss` (TAL
  assignment, CIoU, DFL, BCE), compiled with Adam as kyolo's README trains it. Targets per
  image: `{"boxes": (M, 4) xyxy pixels, "labels": (M,), "mask": (M,)}`; any image size that is
  a multiple of 32.

The CLI takes them as `mypkg.detectors:dfine` / `mypkg.detectors:dfine_data` and
`mypkg.detectors:yolo` / `mypkg.detectors:yolo_data` (the tests directory on `PYTHONPATH`).
Sizes can be changed without code through `DFINE_SIZE`, `DFINE_QUERIES` and `YOLO_SIZE`.
"""

from __future__ import annotations

import os
from typing import Any

DFINE_CLASSES = 4
DFINE_OBJECTS = 4
YOLO_CLASSES = 4
YOLO_OBJECTS = 8


def dfine_detector(image_size: int = 64, num_queries: int = 16, decoder_layers: int = 2) -> Any:
    """A compiled keras-hub D-FINE detector on a small HGNetV2, random weights.

    The backbone is HGNetV2 with four one-block stages (widths 32-256) feeding the hybrid
    encoder at strides 16 and 32; the decoder is `decoder_layers` deep with 2 heads and
    `num_queries` queries. The encoder proposes its top `num_queries` anchors, so the image
    must hold at least that many anchor cells: `(size/16)^2 + (size/32)^2 >= num_queries`.

    Args:
        image_size: square input size in pixels (a multiple of 32).
        num_queries: object queries (detections per image).
        decoder_layers: decoder layers (each adds an auxiliary matched loss).

    Returns:
        A `keras_hub.models.DFineObjectDetector`, compiled with Adam.

    Example:
        ```python
        model = dfine_detector(64)
        model.fit(dfine_samples(4, 64).batch(2), epochs=1)
        ```
    """
    import keras_hub as hub

    shape = (image_size, image_size, 3)
    hgnet = hub.models.HGNetV2Backbone(
        stem_channels=[3, 8, 8],
        stackwise_stage_filters=[
            [8, 8, 32, 1, 1, 3],
            [32, 16, 64, 1, 1, 3],
            [64, 32, 128, 1, 1, 5],
            [128, 64, 256, 1, 1, 5],
        ],
        apply_downsample=[False, True, True, True],
        use_lightweight_conv_block=[False, False, True, True],
        depths=[1, 1, 1, 1],
        hidden_sizes=[32, 64, 128, 256],
        embedding_size=8,
        use_learnable_affine_block=True,
        hidden_act="relu",
        image_shape=shape,
        out_features=["stage3", "stage4"],
    )
    backbone = hub.models.DFineBackbone(
        backbone=hgnet,
        decoder_in_channels=[32, 32],
        encoder_hidden_dim=32,
        num_denoising=0,
        num_labels=DFINE_CLASSES,
        hidden_dim=32,
        learn_initial_query=False,
        num_queries=num_queries,
        anchor_image_size=(image_size, image_size),
        feat_strides=[16, 32],
        num_feature_levels=2,
        encoder_in_channels=[128, 256],
        encode_proj_layers=[1],
        num_attention_heads=2,
        encoder_ffn_dim=64,
        num_encoder_layers=1,
        hidden_expansion=0.34,
        depth_multiplier=0.5,
        eval_idx=-1,
        num_decoder_layers=decoder_layers,
        decoder_attention_heads=2,
        decoder_ffn_dim=64,
        decoder_n_points=[2, 2],
        lqe_hidden_dim=16,
        num_lqe_layers=1,
        out_features=["stage3", "stage4"],
        image_shape=shape,
        seed=0,
    )
    model = hub.models.DFineObjectDetector(
        backbone=backbone, num_classes=DFINE_CLASSES, bounding_box_format="yxyx"
    )
    model.compile(optimizer="adam")
    return model


def dfine_samples(count: int = 16, image_size: int = 64, seed: int = 0) -> Any:
    """Unbatched `(image, {"boxes", "labels"})` samples in D-FINE's target format.

    Images are random float32 in [0, 255]; each holds `DFINE_OBJECTS` boxes as normalised
    `(center_x, center_y, width, height)`, the format D-FINE's matcher and losses compare its
    predictions with.

    Args:
        count: number of samples.
        image_size: square image size.
        seed: random seed (same seed, same samples).

    Returns:
        A `tf.data.Dataset`.

    Example:
        ```python
        image, target = next(iter(dfine_samples(1, 64)))
        ```
    """
    import tensorflow as tf

    base = tf.constant(seed, tf.int64)

    def sample(index: Any) -> Any:
        key = tf.stack([base, index])
        image = tf.random.stateless_uniform((image_size, image_size, 3), key, 0.0, 255.0)
        center = tf.random.stateless_uniform((DFINE_OBJECTS, 2), key + 1, 0.25, 0.75)
        extent = tf.random.stateless_uniform((DFINE_OBJECTS, 2), key + 2, 0.05, 0.4)
        labels = tf.random.stateless_uniform(
            (DFINE_OBJECTS,), key + 3, 0, DFINE_CLASSES, dtype=tf.int32
        )
        return image, {"boxes": tf.concat([center, extent], axis=-1), "labels": labels}

    return tf.data.Dataset.range(count).map(sample)


def yolo_detector(image_size: int | None = None, num_classes: int = YOLO_CLASSES) -> Any:
    """A compiled kyolo YOLOv8-n detector, random weights, trained through kyolo's own step.

    `kyolo.training.YOLODetector` wraps the raw YOLOv8-n (its three feature maps) with
    `YOLODetectionLoss` in `compute_loss`, compiled with Adam, as kyolo documents training.

    Args:
        image_size: fixed square input size (a multiple of 32); None accepts any size.
        num_classes: object classes.

    Returns:
        A compiled `kyolo.training.YOLODetector`.

    Example:
        ```python
        model = yolo_detector(128)
        model.fit(yolo_samples(4, 128).batch(2), epochs=1)
        ```
    """
    import keras
    from kyolo.losses import YOLODetectionLoss
    from kyolo.models import yolov8n
    from kyolo.training import YOLODetector

    keras.utils.set_random_seed(0)
    shape = (image_size, image_size, 3) if image_size else (None, None, 3)
    body = yolov8n(nc=num_classes, input_shape=shape)
    loss = YOLODetectionLoss(nc=num_classes, reg_max=16, strides=(8, 16, 32))
    model = YOLODetector(body, loss=loss)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    return model


def yolo_samples(count: int = 16, image_size: int = 128, seed: int = 0) -> Any:
    """Unbatched `(image, {"boxes", "labels", "mask"})` samples in kyolo's target format.

    Images are random float32 in [0, 1]; each holds `YOLO_OBJECTS` slots of xyxy pixel boxes,
    the last quarter padding (`mask` 0), as a dataset of images with varying object counts
    pads them.

    Args:
        count: number of samples.
        image_size: square image size.
        seed: random seed (same seed, same samples).

    Returns:
        A `tf.data.Dataset`.

    Example:
        ```python
        image, target = next(iter(yolo_samples(1, 128)))
        ```
    """
    import tensorflow as tf

    base = tf.constant(seed, tf.int64)
    real = YOLO_OBJECTS - YOLO_OBJECTS // 4
    mask = tf.constant([1.0] * real + [0.0] * (YOLO_OBJECTS - real))

    def sample(index: Any) -> Any:
        key = tf.stack([base, index])
        image = tf.random.stateless_uniform((image_size, image_size, 3), key, 0.0, 1.0)
        corner = tf.random.stateless_uniform((YOLO_OBJECTS, 2), key + 1, 0.0, 0.6)
        extent = tf.random.stateless_uniform((YOLO_OBJECTS, 2), key + 2, 0.1, 0.4)
        boxes = tf.concat([corner, corner + extent], axis=-1) * float(image_size)
        labels = tf.random.stateless_uniform(
            (YOLO_OBJECTS,), key + 3, 0, YOLO_CLASSES, dtype=tf.int32
        )
        return image, {"boxes": boxes * mask[:, None], "labels": labels, "mask": mask}

    return tf.data.Dataset.range(count).map(sample)


def _size(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def dfine() -> Any:
    """CLI factory: `dfine_detector` at `DFINE_SIZE` px (64) with `DFINE_QUERIES` queries."""
    return dfine_detector(_size("DFINE_SIZE", 64), _size("DFINE_QUERIES", 16))


def dfine_data() -> Any:
    """CLI dataset: 64 `dfine_samples` at `DFINE_SIZE` px (64)."""
    return dfine_samples(64, _size("DFINE_SIZE", 64))


def yolo() -> Any:
    """CLI factory: `yolo_detector` for any image size."""
    return yolo_detector(None)


def yolo_data() -> Any:
    """CLI dataset: 64 `yolo_samples` at `YOLO_SIZE` px (128)."""
    return yolo_samples(64, _size("YOLO_SIZE", 128))
