"""Zoo: real models and datasets memfit's demo, benchmarks and tests train, built offline.

Nothing here downloads: models are built from configuration with random weights, samples
are synthesised. The RetinaNet comes from keras-hub (`pip install memfit[hub]`, see the
README for the one-line install that keeps TensorFlow's CPU build).
"""

from __future__ import annotations

from typing import Any

from memfit.backend import tf as tfb
from memfit.errors import BackendMissingError

RETINANET_CLASSES = 20
RETINANET_MAX_OBJECTS = 16


def _import_keras_hub() -> Any:
    try:
        import keras_hub
    except ImportError as exc:
        raise BackendMissingError(
            f"the RetinaNet needs keras-hub, which is not installed ({exc}); run `make install` "
            f"or `pip install --no-deps keras-hub && pip install regex tokenizers sentencepiece "
            f"kagglehub`"
        ) from None
    return keras_hub


def retinanet(
    image_size: int | None = None,
    num_classes: int = RETINANET_CLASSES,
    blocks: tuple[int, ...] = (1, 1, 1, 1),
    compile: bool = True,
) -> Any:
    """A keras-hub RetinaNet object detector with a small ResNet encoder, random weights.

    The encoder is a ResNet with basic blocks (`blocks=(2, 2, 2, 2)` is ResNet-18; the default
    `(1, 1, 1, 1)` is ResNet-10), a feature pyramid on levels 3 to 7, and keras-hub's focal and
    smooth-L1 losses, compiled with Adam. Targets are `{"boxes": (N, 4) yxyx pixels,
    "labels": (N,)}` per image, as `detection_samples()` makes them.

    Args:
        image_size: fixed square input size; None accepts any size.
        num_classes: object classes.
        blocks: residual blocks in each of the encoder's four stages.
        compile: compile with Adam and the detector's default losses.

    Returns:
        A `keras_hub.models.RetinaNetObjectDetector`.

    Example:
        ```python
        model = memfit.zoo.retinanet(256)
        memfit.measure(model, 4, data=memfit.zoo.detection_samples(8, 256))
        ```
    """
    hub = _import_keras_hub()
    shape = (image_size, image_size, 3) if image_size else (None, None, 3)
    encoder = hub.models.ResNetBackbone(
        input_conv_filters=[64],
        input_conv_kernel_sizes=[7],
        stackwise_num_filters=[64, 128, 256, 512],
        stackwise_num_blocks=list(blocks),
        stackwise_num_strides=[1, 2, 2, 2],
        block_type="basic_block",
        use_pre_activation=False,
        image_shape=shape,
    )
    backbone = hub.models.RetinaNetBackbone(
        image_encoder=encoder, min_level=3, max_level=7, use_p5=False, image_shape=shape
    )
    model = hub.models.RetinaNetObjectDetector(
        backbone=backbone, num_classes=num_classes, bounding_box_format="yxyx"
    )
    if compile:
        model.compile(optimizer="adam")
    return model


def detection_samples(
    count: int = 32,
    image_size: int | tuple[int, int] = 256,
    max_objects: int = RETINANET_MAX_OBJECTS,
    num_classes: int = RETINANET_CLASSES,
    seed: int = 0,
) -> Any:
    """A `tf.data.Dataset` of unbatched `(image, {"boxes", "labels"})` detection samples.

    Images are random float32 in [0, 255]; each has `max_objects` boxes (yxyx, pixels) with
    random classes — the RetinaNet's target format. Samples are made as they are read (the
    same ones every time), so the dataset holds no memory of its own.

    Args:
        count: number of samples.
        image_size: `H` or `(H, W)`.
        max_objects: boxes per image.
        num_classes: labels are drawn from `range(num_classes)`.
        seed: random seed (same seed, same samples).
    """
    tf = tfb.import_tf()
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    scale = tf.constant([height, width, height, width], tf.float32)
    base = tf.constant(seed, tf.int64)

    def sample(index: Any) -> Any:
        # Made when read, so a large dataset costs no memory until a batch is taken from it.
        seed = tf.stack([base, index])
        image = tf.random.stateless_uniform((height, width, 3), seed, 0.0, 255.0)
        corner = tf.random.stateless_uniform((max_objects, 2), seed + 1, 0.0, 0.6)
        extent = tf.random.stateless_uniform((max_objects, 2), seed + 2, 0.1, 0.4)
        boxes = tf.concat([corner, corner + extent], axis=-1) * scale
        labels = tf.random.stateless_uniform(
            (max_objects,), seed + 3, 0, num_classes, dtype=tf.int32
        )
        return image, {"boxes": boxes, "labels": labels}

    return tf.data.Dataset.range(count).map(sample)


def vit_classifier(
    image_size: int = 96,
    num_classes: int = 10,
    patch_size: int = 8,
    num_layers: int = 12,
    num_heads: int = 3,
    hidden_dim: int = 192,
    mlp_dim: int = 768,
) -> Any:
    """A keras-hub Vision Transformer image classifier (ViT-Tiny widths), random weights.

    The defaults are ViT-Ti's widths (12 layers, 3 heads, 192 wide, MLP 768) with 8-pixel
    patches, so a 96-pixel image is 144 tokens plus the class token. Not compiled: memfit
    chooses the loss from the output (or compile it yourself).

    Args:
        image_size: square input size.
        num_classes: output classes.
        patch_size: side of a patch in pixels.
        num_layers: transformer blocks.
        num_heads: attention heads.
        hidden_dim: token width.
        mlp_dim: width of each block's MLP.

    Returns:
        A `keras_hub.models.ViTImageClassifier`.

    Example:
        ```python
        model = memfit.zoo.vit_classifier(96)
        memfit.estimate(model, 8)
        ```
    """
    hub = _import_keras_hub()
    backbone = hub.models.ViTBackbone(
        image_shape=(image_size, image_size, 3),
        patch_size=patch_size,
        num_layers=num_layers,
        num_heads=num_heads,
        hidden_dim=hidden_dim,
        mlp_dim=mlp_dim,
    )
    return hub.models.ViTImageClassifier(backbone=backbone, num_classes=num_classes)
