"""memfit.data.audit: image shapes produced vs stored, and a map that enlarges images."""

from __future__ import annotations

import pytest

import memfit.data
from memfit.data import synth


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return synth.write_dataset(
        str(tmp_path_factory.mktemp("enlarge")), count=16, shards=2, image_size=(64, 64)
    )


def _pipeline(files, scale=None):
    import tensorflow as tf

    def load(record):
        parsed = tf.io.parse_single_example(
            record, {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
        )
        image = tf.io.decode_jpeg(parsed["image/encoded"], channels=3)
        image = tf.cast(image, tf.float32) / 255.0
        if scale is not None:  # the augmentation that doubles the resolution
            image = tf.image.resize(image, tf.shape(image)[:2] * scale)
        return image, tf.constant(1.0)

    return (
        tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
        .map(load, num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .batch(4)
        .prefetch(tf.data.AUTOTUNE)
    )


def test_shapes_produced_are_listed_beside_the_stored_sizes(files):
    result = memfit.data.audit(_pipeline(files), steps=3)
    assert result.element_shapes == [[4, 64, 64, 3]]
    assert result.stored_sizes == {"64x64": 16}
    assert "map_enlarges_images" not in result.kinds()
    assert result.to_dict()["stored_sizes"] == {"64x64": 16}


def test_a_map_that_doubles_the_side_is_flagged_with_its_memory(files):
    import keras

    model = keras.Sequential(
        [
            keras.Input((None, None, 3)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile("adam", "mse")
    result = memfit.data.audit(_pipeline(files, scale=2), steps=3, model=model)
    assert result.element_shapes == [[4, 128, 128, 3]]
    found = [f for f in result.findings if f.kind == "map_enlarges_images"]
    assert len(found) == 1, result.findings
    finding = found[0]
    assert "images of 128x128" in finding.message and "stored at most 64x64" in finding.message
    assert "4x the pixels" in finding.message and "Map" in finding.node
    memory = result.memory
    assert memory["pixel_ratio"] == 4.0 and memory["batch_size"] == 4
    # Activations grow with pixels: the enlarged step costs more, up to 4x the stored one.
    assert memory["stored_peak_bytes"] < memory["produced_peak_bytes"]
    assert memory["produced_peak_bytes"] <= 4.2 * memory["stored_peak_bytes"]
    assert "+" in finding.message and "peaks at" in finding.message


PIPELINE_MODULE = '''
import glob, os
import tensorflow as tf

def doubled():
    files = sorted(glob.glob(os.environ["ENLARGE_FILES"]))
    def load(record):
        parsed = tf.io.parse_single_example(
            record, {"image/encoded": tf.io.FixedLenFeature([], tf.string)})
        image = tf.cast(tf.io.decode_jpeg(parsed["image/encoded"], channels=3), tf.float32)
        return tf.image.resize(image, tf.shape(image)[:2] * 2), tf.constant(1.0)
    return (tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
            .map(load, num_parallel_calls=tf.data.AUTOTUNE).cache().batch(4)
            .prefetch(tf.data.AUTOTUNE))
'''


def test_cli_lists_shapes_and_flags_the_enlarging_map(files, tmp_path):
    import json
    import os

    from helpers import run_cli

    (tmp_path / "enlarge_pipeline.py").write_text(PIPELINE_MODULE)
    env = {
        "PYTHONPATH": str(tmp_path),
        "ENLARGE_FILES": os.path.join(os.path.dirname(files[0]), "*.tfrecord"),
    }
    proc = run_cli("data", "audit", "enlarge_pipeline:doubled", "--steps", "2", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Images: the pipeline yields 4x128x128x3; stored: 64x64 (16)" in proc.stdout
    assert "map_enlarges_images" in proc.stdout
    args = ("data", "audit", "enlarge_pipeline:doubled", "--steps", "2", "--json")
    data = json.loads(run_cli(*args, env=env).stdout)
    assert data["element_shapes"] == [[4, 128, 128, 3]] and data["stored_sizes"] == {"64x64": 16}
