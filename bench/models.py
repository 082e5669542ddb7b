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


def accuracy_model(name: str, size: int, batch: int, optimizer: Any) -> tuple[Any, Any]:
    """A model of `bench.estimate_accuracy` and its data (None: memfit synthesises the batch).

    Args:
        name: a `keras.applications` name, `RegNetX002`, `UNet` (a segmenter, 4 classes),
            `RetinaNet` (keras-hub, ResNet-10 encoder, compiled here with its own losses and
            `optimizer`) or `ViT` (ViT-Tiny, 8-pixel patches). Classifiers have 10 classes
            and random weights.
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
