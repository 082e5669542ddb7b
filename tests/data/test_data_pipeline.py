"""memfit.data.detection_pipeline: boxes stay on their objects; a keras-hub RetinaNet trains."""

from __future__ import annotations

import numpy as np
import pytest

import memfit.data
from memfit.data import synth
from memfit.data.records import write_records

# (height, width, box in pixels ymin, xmin, ymax, xmax (max exclusive), colour)
KNOWN = [
    (60, 100, (10, 20, 30, 70), (255, 0, 0)),
    (100, 50, (40, 5, 90, 45), (0, 255, 0)),
    (128, 128, (0, 0, 64, 32), (0, 0, 255)),
]


@pytest.fixture(scope="module")
def known_file(tmp_path_factory):
    records = []
    for height, width, box, colour in KNOWN:
        image = np.zeros((height, width, 3), np.uint8)
        image[box[0] : box[2], box[1] : box[3]] = colour
        encoded = synth.encode_image(image, "png")
        records.append(synth.od_api_example(encoded, height, width, [box], [1], "png"))
    return write_records(str(tmp_path_factory.mktemp("known") / "known.tfrecord"), records)


@pytest.mark.parametrize("size", [(128, 128), (64, 96)])
def test_boxes_survive_resize_and_pad_exactly(known_file, size):
    dataset = memfit.data.detection_pipeline(
        known_file, size, batch_size=1, max_objects=3, drop_remainder=False, deterministic=True
    )
    batches = list(dataset.as_numpy_iterator())
    assert len(batches) == len(KNOWN)
    for (height, width, box, colour), (images, targets) in zip(KNOWN, batches, strict=True):
        image = images[0]
        assert image.shape == (*size, 3)
        scale = min(size[0] / height, size[1] / width)
        new_h, new_w = round(height * scale), round(width * scale)
        expected = (
            np.array(box, np.float64)
            / [height, width, height, width]
            * [new_h, new_w, new_h, new_w]
        )
        np.testing.assert_allclose(targets["boxes"][0, 0], expected, atol=1e-3)
        # The padded objects are -1, as keras-hub's label encoder expects.
        assert (targets["boxes"][0, 1:] == -1).all() and list(targets["labels"][0]) == [1, -1, -1]
        # The box still frames the coloured rectangle: inside is the colour, outside is black.
        y0, x0, y1, x1 = np.round(expected).astype(int)
        channel = int(np.argmax(colour))
        inside = image[y0 + 1 : y1 - 1, x0 + 1 : x1 - 1, channel]
        assert inside.min() > 200, (size, box)
        ring = np.ones(image.shape[:2], bool)
        ring[max(y0 - 1, 0) : y1 + 1, max(x0 - 1, 0) : x1 + 1] = False
        assert image[..., channel][ring].max() < 30
        # Padding is bottom/right only: nothing beyond the resized image.
        assert not image[new_h:, :].any() and not image[:, new_w:].any()


def test_largest_first_puts_the_largest_images_first(tmp_path):
    files = synth.write_dataset(str(tmp_path), count=10, shards=2, image_size=(32, 96, 32, 96))
    dataset = memfit.data.detection_pipeline(
        files, None, batch_size=1, largest_first=3, drop_remainder=False
    )
    sizes = [images.shape[1] * images.shape[2] for images, _ in dataset.as_numpy_iterator()]
    assert len(sizes) == 10
    assert sizes[:3] == sorted(sizes, reverse=True)[:3]


@pytest.mark.slow
def test_retinanet_trains_from_generated_tfrecords(tmp_path):
    pytest.importorskip("keras_hub")
    import keras

    import memfit.zoo

    files = synth.write_dataset(
        str(tmp_path), count=8, shards=2, image_size=(96, 160, 96, 160), max_objects=4
    )
    dataset = memfit.data.detection_pipeline(files, 128, batch_size=2, max_objects=8)
    keras.utils.set_random_seed(0)
    model = memfit.zoo.retinanet(128)
    history = model.fit(dataset.take(3), epochs=1, verbose=0)
    losses = history.history["loss"]
    assert len(losses) == 1 and np.isfinite(losses[0]) and losses[0] > 0
