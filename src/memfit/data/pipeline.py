"""An efficient tf.data input pipeline from OD-API TFRecords to keras-hub RetinaNet batches.

Files are read in parallel (interleaved), records parsed and images decoded in parallel,
each image resized to fit within `image_size` keeping its aspect ratio and padded at the
bottom and right to exactly `image_size`, so box pixel coordinates are the normalised
coordinates times the resized (unpadded) height and width: the boxes stay on the objects.
Variable object counts are padded to `max_objects` with -1 (keras-hub's padding: its label
encoder ignores boxes and labels of -1). Batches are prefetched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.backend import tf as tfb
from memfit.checks import check_batch_size, check_positive_int
from memfit.data.records import expand_paths, is_gzip
from memfit.errors import DataError

DEFAULT_MAX_OBJECTS = 100
BOX_FORMAT = "yxyx"  # pixels, as memfit.zoo.retinanet(bounding_box_format="yxyx") expects


def _features(tf: Any) -> dict[str, Any]:
    var = tf.io.VarLenFeature
    return {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/height": tf.io.FixedLenFeature([], tf.int64, default_value=0),
        "image/width": tf.io.FixedLenFeature([], tf.int64, default_value=0),
        "image/object/bbox/ymin": var(tf.float32),
        "image/object/bbox/xmin": var(tf.float32),
        "image/object/bbox/ymax": var(tf.float32),
        "image/object/bbox/xmax": var(tf.float32),
        "image/object/class/label": var(tf.int64),
    }


def parse_example(serialized: Any) -> tuple[Any, Any, Any]:
    """One OD-API record → (uint8 image (H, W, 3), normalised yxyx boxes (N, 4), labels (N,))."""
    import tensorflow as tf  # not tfb.import_tf(): this runs inside traced map functions

    parsed = tf.io.parse_single_example(serialized, _features(tf))
    image = tf.io.decode_image(parsed["image/encoded"], channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    coords = [
        tf.sparse.to_dense(parsed[f"image/object/bbox/{k}"])
        for k in ("ymin", "xmin", "ymax", "xmax")
    ]
    boxes = tf.stack(coords, axis=-1)
    labels = tf.cast(tf.sparse.to_dense(parsed["image/object/class/label"]), tf.int32)
    return image, boxes, labels


def resize_and_pad(
    image: Any,
    boxes: Any,
    image_size: tuple[int, int] | None,
    resolution_cap: int | None = None,
) -> tuple[Any, Any]:
    """Resize keeping the aspect ratio to fit within `image_size`, pad bottom/right to it.

    Args:
        image: (H, W, 3) image.
        boxes: (N, 4) normalised yxyx boxes.
        image_size: `(height, width)` to fit and pad to; None keeps the image's size.
        resolution_cap: longest side allowed (images above it are scaled down first).

    Returns:
        float32 image, (N, 4) yxyx boxes in pixels of the returned image.
    """
    import tensorflow as tf  # not tfb.import_tf(): this runs inside traced map functions

    shape = tf.shape(image)
    height = tf.cast(shape[0], tf.float32)
    width = tf.cast(shape[1], tf.float32)
    scale = tf.constant(1.0)
    if image_size is not None:
        scale = tf.minimum(image_size[0] / height, image_size[1] / width)
    if resolution_cap is not None:
        scale = tf.minimum(scale, resolution_cap / tf.maximum(height, width))
    new_h = tf.maximum(1, tf.cast(tf.round(height * scale), tf.int32))
    new_w = tf.maximum(1, tf.cast(tf.round(width * scale), tf.int32))
    if image_size is not None:
        new_h = tf.minimum(new_h, image_size[0])
        new_w = tf.minimum(new_w, image_size[1])
    image = tf.image.resize(image, tf.stack([new_h, new_w]), antialias=True)
    if image_size is not None:
        image = tf.image.pad_to_bounding_box(image, 0, 0, image_size[0], image_size[1])
        image.set_shape([image_size[0], image_size[1], 3])
    size = tf.cast(tf.stack([new_h, new_w, new_h, new_w]), tf.float32)
    return image, boxes * size


def detection_pipeline(
    files: str | Sequence[str],
    image_size: int | tuple[int, int] | None,
    batch_size: int,
    *,
    max_objects: int = DEFAULT_MAX_OBJECTS,
    shuffle: int = 0,
    repeat: bool = False,
    cache: bool = False,
    resolution_cap: int | None = None,
    largest_first: int | bool = 0,
    drop_remainder: bool = True,
    ignore_errors: bool = False,
    deterministic: bool = False,
    seed: int | None = None,
) -> Any:
    """Batches of `(images, {"boxes", "labels"})` from OD-API TFRecords, for keras-hub RetinaNet.

    Images are float32 in [0, 255], resized to fit within `image_size` (aspect kept) and
    padded at the bottom and right; boxes are `yxyx` pixel coordinates of the padded image
    (`memfit.zoo.retinanet` uses `bounding_box_format="yxyx"`), padded with -1 to
    `max_objects` per image, labels int32 padded with -1 (objects beyond `max_objects` are
    dropped). Files are read interleaved in parallel, records decoded in parallel, batches
    prefetched.

    Args:
        files: TFRecord files, folders or globs (gzip files detected by their bytes).
        image_size: `S` or `(H, W)`; None keeps each image's size (batches padded to the
            largest image in each batch; give `resolution_cap` to bound it).
        batch_size: images per batch.
        max_objects: boxes per image after padding.
        shuffle: shuffle buffer in records (0: no shuffling).
        repeat: repeat forever.
        cache: keep decoded, resized samples in memory after the first epoch.
        resolution_cap: longest side allowed; larger images are scaled down to it.
        largest_first: put the N largest images (by `image/height` × `image/width`) first,
            largest first, then the rest (`True`: one batch). Reads the sizes once up front;
            for probing memory with the worst batch.
        drop_remainder: drop a last, smaller batch (static batch shapes).
        ignore_errors: skip records that fail to parse or decode (check them first with
            `memfit data check`; skipped records are logged by TensorFlow).
        deterministic: keep the files' record order (and a seeded shuffle's) at some cost
            in speed; by default records are yielded as soon as they are ready.
        seed: shuffle seed.

    Example:
        ```python
        model = memfit.zoo.retinanet(256)
        train = memfit.data.detection_pipeline("data/train-*.tfrecord", 256, batch_size=8)
        model.fit(train, epochs=10)
        ```
    """
    tf = tfb.import_tf()
    paths = expand_paths(files)
    size = (image_size, image_size) if isinstance(image_size, int) else image_size
    if size is not None and (len(size) != 2 or min(size) < 1):
        raise DataError(f"image_size must be S or (H, W) of positive ints, got {image_size!r}")
    check_batch_size(batch_size, error=DataError)
    check_positive_int(max_objects, "max_objects", error=DataError)
    gz = {is_gzip(p) for p in paths}
    if len(gz) > 1:
        raise DataError("mix of gzip and plain TFRecord files; give one kind per pipeline")
    compression = "GZIP" if gz.pop() else ""
    autotune = tf.data.AUTOTUNE

    count = (
        int(largest_first)
        if not isinstance(largest_first, bool)
        else (batch_size if largest_first else 0)
    )
    if count:
        records = _largest_first(tf, paths, compression, count)
    else:
        names = tf.data.Dataset.from_tensor_slices(paths)
        if shuffle:
            names = names.shuffle(len(paths), seed=seed)
        records = names.interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
            cycle_length=min(len(paths), 8),
            num_parallel_calls=autotune,
            deterministic=deterministic,
        )
    if shuffle:
        records = records.shuffle(shuffle, seed=seed)

    def prepare(serialized: Any) -> Any:
        image, boxes, labels = parse_example(serialized)
        image, boxes = resize_and_pad(image, boxes, size, resolution_cap)
        keep = tf.minimum(tf.shape(labels)[0], max_objects)
        return image, {"boxes": boxes[:keep], "labels": labels[:keep]}

    dataset = records.map(
        prepare, num_parallel_calls=autotune, deterministic=deterministic or count > 0
    )
    if ignore_errors:
        dataset = dataset.ignore_errors(log_warning=True)
    if cache:
        dataset = dataset.cache()
    if repeat:
        dataset = dataset.repeat()
    dataset = dataset.padded_batch(
        batch_size,
        padded_shapes=(
            [size[0], size[1], 3] if size else [None, None, 3],
            {"boxes": [max_objects, 4], "labels": [max_objects]},
        ),
        padding_values=(0.0, {"boxes": -1.0, "labels": -1}),
        drop_remainder=drop_remainder,
    )
    return dataset.prefetch(autotune)


def _largest_first(tf: Any, paths: list[str], compression: str, count: int) -> Any:
    """Records in file order, the `count` largest (declared pixels) moved first, largest first."""
    import numpy as np

    def pixels(serialized: Any) -> Any:
        parsed = tf.io.parse_single_example(
            serialized,
            {
                "image/height": tf.io.FixedLenFeature([], tf.int64, default_value=0),
                "image/width": tf.io.FixedLenFeature([], tf.int64, default_value=0),
            },
        )
        return parsed["image/height"] * parsed["image/width"]

    records = tf.data.TFRecordDataset(paths, compression_type=compression)
    sizes = np.fromiter(
        records.map(pixels, num_parallel_calls=tf.data.AUTOTUNE).as_numpy_iterator(), np.int64
    )
    count = min(count, len(sizes))
    if count == 0:
        return records
    top = np.sort(np.argsort(-sizes, kind="stable")[:count])  # positions, in file order
    order = np.argsort(-sizes[top], kind="stable")  # among them, largest first
    chosen = tf.constant(top, tf.int64)

    def is_top(position: Any, _serialized: Any) -> Any:
        return tf.reduce_any(tf.equal(chosen, position))

    def drop_position(_position: Any, serialized: Any) -> Any:
        return serialized

    first = (
        records.enumerate()
        .filter(is_top)
        .map(drop_position)
        .batch(count)
        .map(lambda batch: tf.gather(batch, tf.constant(order)))
        .unbatch()
    )
    rest = records.enumerate().filter(lambda p, s: tf.logical_not(is_top(p, s)))
    return first.concatenate(rest.map(drop_position))
