"""A naive detection input pipeline and the fixed one, for `memfit data audit`.

    memfit data audit examples.data_pipelines:naive_dataset --steps 20
    memfit data audit examples.data_pipelines:fixed_dataset --steps 20

Both read OD-API TFRecords: the files named by MEMFIT_DATA_FILES (a glob), or else a small
synthetic sample written once to a temporary folder. The naive pipeline is the one people
write first: files read in turn, records parsed one at a time, images decoded after batching,
nothing cached, nothing prefetched. The fixed one is `memfit.data.detection_pipeline`.
"""

from __future__ import annotations

import glob
import os
import tempfile
from typing import Any

import tensorflow as tf

import memfit.data
from memfit.data.pipeline import resize_and_pad

IMAGE_SIZE = 128
BATCH_SIZE = 8
MAX_OBJECTS = 16


def sample_files(count: int = 64, shards: int = 4) -> list[str]:
    """The MEMFIT_DATA_FILES glob, or a synthetic sample (written once, then reused)."""
    pattern = os.environ.get("MEMFIT_DATA_FILES")
    if pattern:
        return sorted(glob.glob(pattern))
    folder = os.path.join(tempfile.gettempdir(), f"memfit-sample-od-{count}-{shards}")
    files = sorted(glob.glob(os.path.join(folder, "*.tfrecord")))
    if len(files) != shards:
        files = memfit.data.write_dataset(
            folder, count=count, shards=shards, image_size=(240, 480, 240, 480)
        )
    return files


def _parse(serialized: Any) -> Any:
    features = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/object/bbox/ymin": tf.io.VarLenFeature(tf.float32),
        "image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32),
        "image/object/bbox/ymax": tf.io.VarLenFeature(tf.float32),
        "image/object/bbox/xmax": tf.io.VarLenFeature(tf.float32),
        "image/object/class/label": tf.io.VarLenFeature(tf.int64),
    }
    parsed = tf.io.parse_single_example(serialized, features)
    boxes = tf.stack(
        [
            tf.sparse.to_dense(parsed[f"image/object/bbox/{k}"])
            for k in ("ymin", "xmin", "ymax", "xmax")
        ],
        axis=-1,
    )
    labels = tf.cast(tf.sparse.to_dense(parsed["image/object/class/label"]), tf.int32)
    pad = MAX_OBJECTS - tf.minimum(tf.shape(labels)[0], MAX_OBJECTS)
    boxes = tf.pad(boxes[:MAX_OBJECTS], [[0, pad], [0, 0]], constant_values=-1.0)
    labels = tf.pad(labels[:MAX_OBJECTS], [[0, pad]], constant_values=-1)
    return parsed["image/encoded"], boxes, labels


def _decode_batch(encoded: Any, boxes: Any, labels: Any) -> Any:
    def one(item: Any) -> Any:
        image = tf.io.decode_image(item[0], channels=3, expand_animations=False)
        image, pixels = resize_and_pad(image, item[1], (IMAGE_SIZE, IMAGE_SIZE))
        return image, pixels

    images, pixels = tf.map_fn(
        one,
        (encoded, boxes),
        fn_output_signature=(
            tf.TensorSpec([IMAGE_SIZE, IMAGE_SIZE, 3], tf.float32),
            tf.TensorSpec([MAX_OBJECTS, 4], tf.float32),
        ),
    )
    valid = tf.cast(labels >= 0, tf.float32)[..., None]
    return images, {"boxes": pixels * valid - (1.0 - valid), "labels": labels}


def naive(files: list[str], batch_size: int = BATCH_SIZE, parallel_files: bool = True) -> Any:
    """The pipeline as often first written (every line a finding of `memfit data audit`).

    `parallel_files=False` reads the files with `TFRecordDataset(files)` (one after
    another) instead of a serial `interleave`.
    """
    if parallel_files:
        records = tf.data.Dataset.from_tensor_slices(files).interleave(
            tf.data.TFRecordDataset, cycle_length=len(files)
        )
    else:
        records = tf.data.TFRecordDataset(files)
    return records.map(_parse).batch(batch_size, drop_remainder=True).map(_decode_batch)


def fixed(files: list[str], batch_size: int = BATCH_SIZE, cache: bool = True) -> Any:
    """The same batches from `memfit.data.detection_pipeline`, with the audit's fixes."""
    return memfit.data.detection_pipeline(
        files,
        IMAGE_SIZE,
        batch_size,
        max_objects=MAX_OBJECTS,
        cache=cache,
        ignore_errors=True,
    )


def naive_dataset() -> Any:
    """`memfit data audit examples.data_pipelines:naive_dataset`."""
    return naive(sample_files())


def fixed_dataset() -> Any:
    """`memfit data audit examples.data_pipelines:fixed_dataset`."""
    return fixed(sample_files())


if __name__ == "__main__":
    for name, dataset in (("naive", naive_dataset()), ("fixed", fixed_dataset())):
        result = memfit.data.audit(dataset, steps=10)
        print(f"{name}: {result.samples_per_second:.1f} samples/s")
        for finding in result.findings:
            print(f"  {finding.kind}: {finding.fix}")


def waiting_dataset() -> tf.data.Dataset:
    """Batches that each wait 50 ms without using the CPU, as reads from slow storage do.

    `memfit data audit examples.data_pipelines:waiting_dataset --workers 0,1,2,4` shows
    tf.data service workers lifting its rate (each worker waits on its own batches).
    """
    from tensorflow.python.data.experimental.ops import testing  # TensorFlow's sleep op

    features = tf.data.Dataset.range(100_000).map(lambda i: tf.fill([16], tf.cast(i, tf.float32)))
    return features.batch(8).apply(testing.sleep(50_000)).prefetch(2)
