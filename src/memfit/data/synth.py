"""Sample detection data: synthetic images with boxes, written as OD-API TFRecords.

Nothing is downloaded: every image is drawn here (a noisy background with one filled,
coloured rectangle per object, so the boxes mark real content) and JPEG- or PNG-encoded with
TensorFlow. `write_dataset` writes shards; `large_shard=True` adds a shard at twice the
resolution (the "new images at a higher resolution" that make yesterday's batch size OOM);
`masks=True` adds an instance mask per object (the filled rectangle, PNG-encoded as the OD-API
and the Model Garden's Mask R-CNN read them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memfit.backend import tf as tfb
from memfit.data.records import write_records


@dataclass
class Sample:
    """One synthetic image and its objects (boxes in pixels, yxyx, as drawn).

    Attributes:
        image: uint8 array (height, width, 3).
        boxes: float array (objects, 4): ymin, xmin, ymax, xmax in pixels (ymax, xmax
            exclusive: the rectangle covers rows ymin..ymax-1).
        labels: int array (objects,): class ids, 1-based as in OD-API label maps.
    """

    image: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray


def make_sample(
    height: int,
    width: int,
    objects: int,
    num_classes: int = 20,
    rng: np.random.Generator | None = None,
) -> Sample:
    """Draw one image with `objects` filled rectangles (whole-pixel boxes).

    Example:
        >>> make_sample(64, 96, 3).boxes.shape
        (3, 4)
    """
    rng = rng or np.random.default_rng(0)
    image = rng.integers(0, 64, (height, width, 3), dtype=np.uint8)
    boxes = np.zeros((objects, 4), np.float32)
    labels = rng.integers(1, num_classes + 1, objects).astype(np.int64)
    for n in range(objects):
        h = int(rng.integers(max(1, height // 8), max(2, height // 2)))
        w = int(rng.integers(max(1, width // 8), max(2, width // 2)))
        y = int(rng.integers(0, height - h + 1))
        x = int(rng.integers(0, width - w + 1))
        image[y : y + h, x : x + w] = rng.integers(128, 256, 3, dtype=np.uint8)
        boxes[n] = (y, x, y + h, x + w)
    return Sample(image, boxes, labels)


def encode_image(image: np.ndarray, image_format: str = "jpeg") -> bytes:
    """JPEG- or PNG-encode a uint8 image with TensorFlow."""
    tf = tfb.import_tf()
    if image_format == "png":
        return bytes(tf.io.encode_png(image).numpy())
    return bytes(tf.io.encode_jpeg(image, quality=90).numpy())


def box_masks(height: int, width: int, boxes: Any) -> list[bytes]:
    """PNG-encoded instance masks of whole-pixel boxes, as OD-API's `image/object/mask` holds.

    Each mask is a single-channel `height` x `width` PNG, 1 inside its box and 0 elsewhere
    (the box as drawn, though a later object may cover part of it).

    Args:
        height: image height in pixels.
        width: image width in pixels.
        boxes: (objects, 4) ymin, xmin, ymax, xmax in pixels, ymax and xmax exclusive.

    Returns:
        One PNG (bytes) per box.

    Example:
        >>> len(box_masks(8, 8, [[0, 0, 4, 4], [2, 2, 8, 8]]))
        2
    """
    tf = tfb.import_tf()
    masks = []
    for ymin, xmin, ymax, xmax in np.asarray(boxes, np.float64).reshape(-1, 4).astype(int):
        mask = np.zeros((height, width, 1), np.uint8)
        mask[ymin:ymax, xmin:xmax] = 1
        masks.append(bytes(tf.io.encode_png(mask).numpy()))
    return masks


def od_api_example(
    encoded: bytes,
    height: int,
    width: int,
    boxes: Any,
    labels: Sequence[int],
    image_format: str = "jpeg",
    texts: Sequence[str] | None = None,
    filename: str = "",
    normalized: bool = False,
    drop: Sequence[str] = (),
    masks: Sequence[bytes] | None = None,
) -> bytes:
    """A serialized OD-API `tf.train.Example`.

    Args:
        encoded: the encoded image.
        height: image height in pixels (as written to `image/height`).
        width: image width in pixels.
        boxes: (objects, 4) ymin, xmin, ymax, xmax, in pixels (or already normalised).
        labels: class ids.
        image_format: written to `image/format`.
        texts: class names (default `class<id>`).
        filename: written to `image/filename`.
        normalized: `boxes` are already in [0, 1].
        drop: feature keys to leave out (for making faulty records).
        masks: PNG-encoded instance masks, one per box (`box_masks`), written to
            `image/object/mask`; None: no masks.

    Example:
        >>> record = od_api_example(b"...", 10, 10, [[0, 0, 5, 5]], [1])
    """
    tf = tfb.import_tf()
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    if not normalized:
        boxes = boxes / np.array([height, width, height, width], np.float64)
    texts = list(texts) if texts is not None else [f"class{int(label)}" for label in labels]

    def b(values: Sequence[bytes]) -> Any:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))

    def i(values: Sequence[int]) -> Any:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

    def f(values: Sequence[float]) -> Any:
        return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))

    feature = {
        "image/encoded": b([encoded]),
        "image/height": i([height]),
        "image/width": i([width]),
        "image/format": b([image_format.encode()]),
        "image/filename": b([filename.encode()]),
        "image/source_id": b([filename.encode()]),
        "image/object/bbox/ymin": f(boxes[:, 0]),
        "image/object/bbox/xmin": f(boxes[:, 1]),
        "image/object/bbox/ymax": f(boxes[:, 2]),
        "image/object/bbox/xmax": f(boxes[:, 3]),
        "image/object/class/label": i(labels),
        "image/object/class/text": b([t.encode() for t in texts]),
    }
    if masks is not None:
        if len(masks) != len(boxes):
            raise ValueError(f"{len(masks)} masks for {len(boxes)} boxes: give one per box")
        feature["image/object/mask"] = b(masks)
    for key in drop:
        feature.pop(key, None)
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString()


def write_dataset(
    directory: str,
    count: int = 64,
    shards: int = 2,
    image_size: tuple[int, int] | tuple[int, int, int, int] = (96, 160, 96, 160),
    max_objects: int = 6,
    num_classes: int = 20,
    image_format: str = "jpeg",
    large_shard: bool = False,
    gzip_compress: bool = False,
    seed: int = 0,
    prefix: str = "train",
    masks: bool = False,
) -> list[str]:
    """Write `count` synthetic OD-API examples into `shards` TFRecord files; return their paths.

    Args:
        directory: where to write (created if missing).
        count: examples over all shards (the large shard adds `count // shards` more).
        shards: number of files.
        image_size: `(height, width)`, or `(min_height, max_height, min_width, max_width)`
            for random sizes.
        max_objects: each image has 1 to `max_objects` objects.
        num_classes: class ids are 1..num_classes.
        image_format: `"jpeg"` or `"png"`.
        large_shard: add a shard whose images have twice the (largest) resolution.
        gzip_compress: write gzip-compressed files (`.tfrecord.gz`).
        seed: random seed.
        prefix: file name prefix.
        masks: also write an instance mask per object (`image/object/mask`, PNG, the
            object's rectangle), as Mask R-CNN trains on.

    Example:
        >>> files = write_dataset("/tmp/od", count=16, shards=2)  # doctest: +SKIP
        >>> files = write_dataset("/tmp/seg", masks=True)  # doctest: +SKIP
    """
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    if len(image_size) == 2:
        sizes = (image_size[0], image_size[0], image_size[1], image_size[1])
    else:
        sizes = tuple(image_size)  # type: ignore[assignment]
    suffix = ".tfrecord.gz" if gzip_compress else ".tfrecord"
    plan = [(n, sizes) for n in range(shards)]
    if large_shard:
        big = (sizes[1] * 2, sizes[1] * 2, sizes[3] * 2, sizes[3] * 2)
        plan.append((shards, big))
    total = shards + (1 if large_shard else 0)
    per_shard = [count // shards + (1 if n < count % shards else 0) for n in range(shards)]
    if large_shard:
        per_shard.append(max(1, count // shards))
    paths = []
    for (number, (h0, h1, w0, w1)), many in zip(plan, per_shard, strict=True):
        records = []
        for k in range(many):
            h = int(rng.integers(h0, h1 + 1))
            w = int(rng.integers(w0, w1 + 1))
            sample = make_sample(h, w, int(rng.integers(1, max_objects + 1)), num_classes, rng)
            records.append(
                od_api_example(
                    encode_image(sample.image, image_format),
                    h,
                    w,
                    sample.boxes,
                    sample.labels,
                    image_format,
                    filename=f"{prefix}-{number}-{k}.{'png' if image_format == 'png' else 'jpg'}",
                    masks=box_masks(h, w, sample.boxes) if masks else None,
                )
            )
        path = os.path.join(directory, f"{prefix}-{number:05d}-of-{total:05d}{suffix}")
        paths.append(write_records(path, records, gzip_compress))
    return paths


def write_label_map(path: str, num_classes: int = 20) -> str:
    """Write an OD-API label map (`item { id: N name: 'classN' }`) for ids 1..num_classes."""
    with open(path, "w") as handle:
        for n in range(1, num_classes + 1):
            handle.write(f"item {{\n  id: {n}\n  name: 'class{n}'\n}}\n")
    return path
