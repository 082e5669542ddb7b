"""Zero-argument model and dataset factories the benchmarks hand to child processes."""

from __future__ import annotations

from typing import Any

from memfit import zoo

RETINANET_IMAGE = 192


def retinanet() -> Any:
    """keras-hub RetinaNet, ResNet-10 encoder, 192x192 inputs, Adam."""
    return zoo.retinanet(RETINANET_IMAGE)


def detection_samples() -> Any:
    """256 synthetic 192x192 detection samples with 16 boxes each, for the RetinaNet."""
    return zoo.detection_samples(256, RETINANET_IMAGE)


# RegNetX-200MF as Keras 2's `keras.applications.RegNetX002` built it (keras 2.15,
# keras/applications/regnet.py; Apache 2.0): Keras 3 ships no RegNet. Stage depths, widths and
# the group width are the paper's (Radosavovic et al. 2020, "Designing Network Design Spaces").
REGNETX002 = {"depths": (1, 1, 4, 7), "widths": (24, 56, 152, 368), "group_width": 8}


def regnetx002(input_shape: tuple[int, int, int], classes: int = 10) -> Any:
    """RegNetX002 (X blocks: 1x1, grouped 3x3, 1x1, residual), random weights.

    Args:
        input_shape: one image's `(height, width, channels)`.
        classes: outputs of the softmax head.

    Returns:
        An uncompiled `keras.Model`.

    Example:
        >>> regnetx002((64, 64, 3)).count_params() > 2_000_000
        True
    """
    import keras
    from keras import layers

    def norm(name: str) -> Any:
        return layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name)

    def x_block(x: Any, filters_in: int, filters_out: int, stride: int, name: str) -> Any:
        groups = filters_out // REGNETX002["group_width"]
        if stride != 1 or filters_in != filters_out:
            skip = layers.Conv2D(
                filters_out, 1, strides=stride, use_bias=False, name=f"{name}_skip_1x1"
            )(x)
            skip = norm(f"{name}_skip_bn")(skip)
        else:
            skip = x
        x = layers.Conv2D(filters_out, 1, use_bias=False, name=f"{name}_conv_1x1_1")(x)
        x = layers.ReLU(name=f"{name}_conv_1x1_1_relu")(norm(f"{name}_conv_1x1_1_bn")(x))
        x = layers.Conv2D(
            filters_out,
            3,
            strides=stride,
            groups=groups,
            padding="same",
            use_bias=False,
            name=f"{name}_conv_3x3",
        )(x)
        x = layers.ReLU(name=f"{name}_conv_3x3_relu")(norm(f"{name}_conv_3x3_bn")(x))
        x = layers.Conv2D(filters_out, 1, use_bias=False, name=f"{name}_conv_1x1_2")(x)
        x = norm(f"{name}_conv_1x1_2_bn")(x)
        return layers.ReLU(name=f"{name}_exit_relu")(x + skip)

    inputs = keras.Input(input_shape)
    x = layers.Rescaling(1.0 / 255.0, name="prestem_rescaling")(inputs)
    x = layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False, name="stem_conv")(x)
    x = layers.ReLU(name="stem_relu")(norm("stem_bn")(x))
    filters_in = 32
    for stage, (depth, width) in enumerate(
        zip(REGNETX002["depths"], REGNETX002["widths"], strict=True)
    ):
        for block in range(depth):
            stride = 2 if block == 0 else 1
            x = x_block(x, filters_in, width, stride, name=f"stage{stage}_xblock{block}")
            filters_in = width
    x = layers.GlobalAveragePooling2D(name="head_gap")(x)
    outputs = layers.Dense(classes, activation="softmax", name="head_dense")(x)
    return keras.Model(inputs, outputs, name="regnetx002")


def unet(input_shape: tuple[int, int, int], classes: int = 4, width: int = 16) -> Any:
    """A U-Net segmenter (Ronneberger et al. 2015): 3 down and 3 up stages, random weights.

    Each stage is two 3x3 convolutions with BatchNormalization and ReLU; the encoder halves
    the resolution with max pooling, the decoder doubles it with a strided
    `Conv2DTranspose` and concatenates the encoder's output of the same resolution. The head
    is a 1x1 convolution with a per-pixel softmax (memfit trains it with sparse categorical
    cross-entropy on `(height, width)` integer masks).

    Args:
        input_shape: one image's `(height, width, channels)`; sides divisible by 8.
        classes: segmentation classes (channels of the per-pixel softmax).
        width: filters of the first stage (doubled at each stage down).

    Returns:
        An uncompiled `keras.Model`.

    Example:
        >>> unet((64, 64, 3)).output.shape
        (None, 64, 64, 4)
    """
    import keras
    from keras import layers

    def stage(x: Any, filters: int, name: str) -> Any:
        for i in (1, 2):
            x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv{i}")(x)
            x = layers.BatchNormalization(name=f"{name}_bn{i}")(x)
            x = layers.ReLU(name=f"{name}_relu{i}")(x)
        return x

    inputs = keras.Input(input_shape)
    skips, x = [], inputs
    for level in range(3):
        x = stage(x, width * 2**level, f"down{level}")
        skips.append(x)
        x = layers.MaxPooling2D(name=f"down{level}_pool")(x)
    x = stage(x, width * 8, "bottom")
    for level in reversed(range(3)):
        x = layers.Conv2DTranspose(
            width * 2**level, 2, strides=2, padding="same", name=f"up{level}_transpose"
        )(x)
        x = layers.Concatenate(name=f"up{level}_concat")([x, skips[level]])
        x = stage(x, width * 2**level, f"up{level}")
    outputs = layers.Conv2D(classes, 1, activation="softmax", name="head")(x)
    return keras.Model(inputs, outputs, name="unet")


def _hub() -> Any:
    import keras_hub

    return keras_hub


def hgnetv2_backbone(size: int) -> Any:
    """keras-hub HGNetV2-B0 as a backbone, random weights (the B0 stage widths and depths)."""
    return _hub().models.HGNetV2Backbone(
        stem_channels=[3, 16, 16],
        stackwise_stage_filters=[
            [16, 16, 64, 1, 3, 3],
            [64, 32, 256, 1, 3, 3],
            [256, 64, 512, 2, 3, 5],
            [512, 128, 1024, 1, 3, 5],
        ],
        apply_downsample=[False, True, True, True],
        use_lightweight_conv_block=[False, False, True, True],
        depths=[1, 1, 2, 1],
        hidden_sizes=[64, 256, 512, 1024],
        embedding_size=16,
        use_learnable_affine_block=True,
        hidden_act="relu",
        image_shape=(size, size, 3),
    )


def cspnet_backbone(size: int) -> Any:
    """keras-hub CSPNet: a CSPDarkNet (CSP stages of dark blocks) at four stages, random weights.

    Stem 32 filters, 3x3, stride 2; stages of 1, 2, 3, 1 dark blocks at 64-512 filters, each
    stage stride 2 (a reduced CSPDarkNet-53: its widths, fewer blocks).
    """
    return _hub().models.CSPNetBackbone(
        stem_filters=32,
        stem_kernel_size=3,
        stem_strides=2,
        stackwise_depth=[1, 2, 3, 1],
        stackwise_strides=[2, 2, 2, 2],
        stackwise_num_filters=[64, 128, 256, 512],
        block_type="dark_block",
        stage_type="csp",
        bottle_ratio=[0.5],
        block_ratio=[1.0],
        expand_ratio=[2.0],
        down_growth=True,
        image_shape=(size, size, 3),
    )


def mit_backbone(size: int) -> Any:
    """keras-hub MiT-B0 (SegFormer's Mix Transformer encoder), random weights."""
    return _hub().models.MiTBackbone(
        layerwise_depths=[2, 2, 2, 2],
        num_layers=4,
        layerwise_num_heads=[1, 2, 5, 8],
        layerwise_sr_ratios=[8, 4, 2, 1],
        max_drop_path_rate=0.1,
        layerwise_patch_sizes=[7, 3, 3, 3],
        layerwise_strides=[4, 2, 2, 2],
        hidden_dims=[32, 64, 160, 256],
        image_shape=(size, size, 3),
    )


def _labelled(count: int, size: int, classes: int, mask: bool = False) -> Any:
    """`count` unbatched (image, label) samples: random images, integer labels (or masks)."""
    import tensorflow as tf

    def sample(index: Any) -> Any:
        key = tf.stack([tf.constant(0, tf.int64), index])
        image = tf.random.stateless_uniform((size, size, 3), key, 0.0, 255.0)
        shape = (size, size) if mask else ()
        label = tf.random.stateless_uniform(shape, key + 1, 0, classes, dtype=tf.int32)
        return image, label

    return tf.data.Dataset.range(count).map(sample)


def hub_model(name: str, size: int, batch: int, optimizer: Any) -> tuple[Any, Any]:
    """A keras-hub task of `bench.estimate_accuracy`'s `new` group, compiled, and its data.

    Classifiers (`HGNetV2`, `CSPNet`, `MiT`: 10 classes) and the `SegFormer` segmenter (MiT-B0
    encoder, 4 classes, per-pixel logits at the image's size) train with sparse categorical
    cross-entropy on logits; `DFine` is the tests' D-FINE detector (`mypkg.detectors`, a
    small HGNetV2, 16 queries, 2 decoder layers) trained through its own matched losses.
    Each gets `batch` samples.

    Example:
        ```python
        model, data = hub_model("MiT", 128, 4, keras.optimizers.Adam())
        ```
    """
    import keras

    hub = _hub()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if name == "DFine":
        import os
        import sys

        tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
        if tests not in sys.path:
            sys.path.insert(0, tests)
        from mypkg import detectors

        model = detectors.dfine_detector(size, 16)
        model.compile(optimizer=optimizer)
        return model, detectors.dfine_samples(batch, size)
    if name == "SegFormer":
        backbone = hub.models.SegFormerBackbone(
            image_encoder=mit_backbone(size), projection_filters=256
        )
        model = hub.models.SegFormerImageSegmenter(backbone=backbone, num_classes=4)
        model.compile(optimizer=optimizer, loss=loss, metrics=[])
        return model, _labelled(batch, size, 4, mask=True)
    if name == "HGNetV2":
        model = hub.models.HGNetV2ImageClassifier(
            backbone=hgnetv2_backbone(size), preprocessor=None, num_classes=10
        )
    elif name == "CSPNet":
        model = hub.models.CSPNetImageClassifier(backbone=cspnet_backbone(size), num_classes=10)
    elif name == "MiT":
        model = hub.models.MiTImageClassifier(backbone=mit_backbone(size), num_classes=10)
    else:
        raise ValueError(f"not a keras-hub model of the benchmark: {name}")
    model.compile(optimizer=optimizer, loss=loss, metrics=[])
    return model, _labelled(batch, size, 10)


HUB_MODELS = ("HGNetV2", "CSPNet", "MiT", "SegFormer", "DFine")


def accuracy_model(name: str, size: int, batch: int, optimizer: Any) -> tuple[Any, Any]:
    """A model of `bench.estimate_accuracy` and its data (None: memfit synthesises the batch).

    Args:
        name: a `keras.applications` name, `RegNetX002`, `UNet` (a segmenter, 4 classes),
            `RetinaNet` (keras-hub, ResNet-10 encoder, compiled here with its own losses and
            `optimizer`), `ViT` (ViT-Tiny, 8-pixel patches) or a keras-hub model of
            `HUB_MODELS` (`hub_model`: compiled here, with its data). Classifiers have 10
            classes and random weights.
        size: image side in pixels.
        batch: the batch size (the detector's dataset holds this many samples).
        optimizer: the Keras optimizer the detector is compiled with; classifiers are left
            uncompiled (the benchmark hands the optimizer to its `memfit.Workload`).

    Returns:
        `(model, data)`.

    Example:
        >>> model, data = accuracy_model("RegNetX002", 64, 2, None)
        >>> data is None
        True
    """
    import keras

    from memfit import zoo

    if name in HUB_MODELS:
        return hub_model(name, size, batch, optimizer)
    if name == "RetinaNet":
        model = zoo.retinanet(size, compile=False)
        model.compile(optimizer=optimizer)
        return model, zoo.detection_samples(batch, size)
    if name == "ViT":
        return zoo.vit_classifier(size, num_classes=10), None
    if name == "RegNetX002":
        return regnetx002((size, size, 3), classes=10), None
    if name == "UNet":
        return unet((size, size, 3)), None
    factory = getattr(keras.applications, name)
    return factory(weights=None, input_shape=(size, size, 3), classes=10), None


def detector_cnn(seed: int = 1, optimizer: Any = None) -> Any:
    """A small detector-style CNN without BatchNorm, for RGB images of any size, compiled.

    Conv, conv, max-pool, conv, global pooling, a 4-number box head; mse. The tests build the
    same network (`tests/factories.py`); the benchmarks' real-OOM runs train it on
    `box_dataset`.

    Args:
        seed: `keras.utils.set_random_seed` before the layers are built (same weights).
        optimizer: the optimizer it is compiled with (default: Adam, learning rate 1e-3).

    Returns:
        A compiled `keras.Model`.

    Example:
        >>> detector_cnn().count_params()
        28900
    """
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((None, None, 3))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(4)(h))
    model.compile(optimizer=optimizer or keras.optimizers.Adam(1e-3), loss="mse")
    return model


def box_dataset(sizes: tuple[int, ...], per_size: int = 32, batch: int = 16) -> Any:
    """Random RGB images and 4-number boxes, `per_size` at each of `sizes` in turn, batched.

    Args:
        sizes: the image sides, in order (e.g. `(64, 256)`: today's images at 4x the size).
        per_size: samples at each size.
        batch: the batch size (each size's samples are batched apart).

    Returns:
        A `tf.data.Dataset` of `(x, y)` float32 batches (numbers drawn with seed 0).

    Example:
        >>> [tuple(x.shape) for x, _ in box_dataset((64, 128), 16, 16)]
        [(16, 64, 64, 3), (16, 128, 128, 3)]
    """
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    parts = []
    for size in sizes:
        x = rng.uniform(0, 1, (per_size, size, size, 3)).astype("float32")
        y = rng.uniform(0, 1, (per_size, 4)).astype("float32")
        parts.append(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))
    dataset = parts[0]
    for part in parts[1:]:
        dataset = dataset.concatenate(part)
    return dataset
