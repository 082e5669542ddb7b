"""memfit.data.check and `memfit data check`: every planted problem found, with file and index."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memfit.data
from memfit.data import synth
from memfit.data.records import frame, read_records, write_records


def _example(height: int, width: int, boxes, labels, **kwargs) -> bytes:
    rng = np.random.default_rng(height * 7 + width)
    image = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    encoded = synth.encode_image(image, "jpeg")
    return synth.od_api_example(encoded, height, width, boxes, labels, **kwargs)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Two clean shards, a gzip shard, a shard with planted problems, a truncated copy."""
    root = tmp_path_factory.mktemp("od")
    clean = synth.write_dataset(
        str(root / "clean"), count=12, shards=2, image_size=(48, 80, 48, 80), num_classes=5
    )
    gz = synth.write_dataset(
        str(root / "gz"),
        count=4,
        shards=1,
        image_size=(40, 40),
        gzip_compress=True,
        prefix="gz",
        num_classes=5,
    )
    good = _example(64, 96, [[8, 8, 40, 60]], [1])
    bad = [
        good,  # 0
        synth.od_api_example(b"this is not an image", 64, 96, [[8, 8, 40, 60]], [1]),  # 1
        _example(64, 96, [[8, 8, 40, 60]], [1], drop=("image/height",)),  # 2: missing feature
        _example(64, 96, [[40, 8, 8, 60]], [2]),  # 3: inverted box (ymin > ymax)
        _example(3000, 4000, [[100, 100, 2000, 3000]], [3]),  # 4: 4000x3000 image
        _example(64, 96, [[8, 8, 40, 60]], [9]),  # 5: class 9, not in a 5-class label map
        b"\x00\x01garbage",  # 6: not a tf.train.Example
        good,  # 7: a damaged data checksum (below)
        good,  # 8
    ]
    bad_path = write_records(str(root / "bad.tfrecord"), bad)
    blob = bytearray(Path(bad_path).read_bytes())
    offsets = [r.offset for r in read_records(bad_path)]
    blob[offsets[7] + 12 + 5] ^= 0xFF  # flip one byte of record 7's data
    Path(bad_path).write_bytes(bytes(blob))
    truncated = str(root / "truncated.tfrecord")
    data = Path(clean[0]).read_bytes()
    second = [r.offset for r in read_records(clean[0])][2]
    Path(truncated).write_bytes(data[: second + 40])  # ends inside record 2
    label_map = synth.write_label_map(str(root / "label_map.pbtxt"), num_classes=5)
    return {
        "root": root,
        "clean": clean,
        "gz": gz,
        "bad": bad_path,
        "truncated": truncated,
        "label_map": label_map,
    }


def _found(result):
    return {(p.kind, os.path.basename(p.file), p.index) for p in result.problems}


def test_every_planted_problem_is_reported_with_file_and_index(dataset):
    files = [*dataset["clean"], *dataset["gz"], dataset["bad"], dataset["truncated"]]
    result = memfit.data.check(files, label_map=dataset["label_map"], batch_size=4)
    found = _found(result)
    expected = {
        ("decode_error", "bad.tfrecord", 1),
        ("missing_feature", "bad.tfrecord", 2),
        ("inverted_box", "bad.tfrecord", 3),
        ("resolution_outlier", "bad.tfrecord", 4),
        ("unknown_class", "bad.tfrecord", 5),
        ("not_an_example", "bad.tfrecord", 6),
        ("corrupt_record", "bad.tfrecord", 7),
        ("truncated_record", "truncated.tfrecord", 2),
    }
    assert expected <= found, sorted(found - expected)
    errors = {(p.file, p.index) for p in result.errors}
    assert len(errors) == 7  # 6 in bad.tfrecord (not the large image: a warning), 1 truncated
    assert not result.ok
    # The rest is still counted: 12 clean + 4 gzip + 9 bad + 3 in the truncated file.
    assert result.records == 12 + 4 + 9 + 3
    assert result.valid_records == result.records - 7
    big = result.largest[0]
    assert (big.width, big.height, os.path.basename(big.file), big.index) == (
        4000,
        3000,
        "bad.tfrecord",
        4,
    )
    assert result.largest_batch_bytes() == 4000 * 3000 * 3 * 4 * 4
    # Sized images: 12 clean, 4 gzip, 2 before the truncation, 7 in bad.tfrecord (not 6, 7).
    assert sum(result.resolution_histogram.values()) == 25
    assert result.resolution_histogram["2049-4096"] == 1


def test_cli_exits_1_on_problems_and_0_on_clean_data(dataset):
    bad = run_cli("data", "check", str(dataset["root"] / "*.tfrecord"), "--json")
    assert bad.returncode == 1, bad.stderr
    payload = json.loads(bad.stdout)
    kinds = {(p["kind"], os.path.basename(p["file"]), p["index"]) for p in payload["problems"]}
    assert ("decode_error", "bad.tfrecord", 1) in kinds
    assert ("truncated_record", "truncated.tfrecord", 2) in kinds
    # Without a label map class 9 is fine: errors are records 1, 2, 3, 6, 7 and the truncation.
    assert payload["records"] == 9 + 3 and payload["valid_records"] == 12 - 6
    clean = run_cli("data", "check", *dataset["clean"], *dataset["gz"])
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "16 records in 3 file(s), 16 valid" in clean.stdout
    missing = run_cli("data", "check", str(dataset["root"] / "nothing-*.tfrecord"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("memfit: error:") and "matches no file" in missing.stderr


def test_truncated_and_damaged_gzip_keeps_the_records_before_the_damage(dataset, tmp_path):
    data = Path(dataset["gz"][0]).read_bytes()
    cut = tmp_path / "cut.tfrecord.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    result = memfit.data.check([str(cut)])
    kinds = [p.kind for p in result.errors]
    assert "corrupt_gzip" in kinds
    assert result.valid_records >= 1 and result.records < 4


def test_memory_consequence_of_the_largest_image_is_measured(dataset, tmp_path):
    keras = pytest.importorskip("keras")
    inputs = keras.Input((None, None, 3))
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(h))
    model.compile("adam", "sparse_categorical_crossentropy")
    path = str(tmp_path / "tiny.keras")
    model.save(path)
    result = memfit.data.check([dataset["bad"]], model=path, batch_size=2)
    memory = result.memory
    assert memory["mode"] == "scaled"
    assert (memory["largest_width"], memory["largest_height"]) == (4000, 3000)
    assert max(memory["measured_width"], memory["measured_height"]) == 256
    ratio = 4000 * 3000 / (memory["measured_width"] * memory["measured_height"])
    step = memory["measured_peak_bytes"] - memory["resident_bytes"]
    assert memory["peak_bytes"] == int(memory["resident_bytes"] + step * ratio)
    assert memory["peak_bytes"] > 10 * memory["measured_peak_bytes"] > 0
    assert "4000x3000" in memory["message"] and "batch of 2" in memory["message"]


# -- fuzz ---------------------------------------------------------------------------------------
_POOL: list[bytes] = []


def _pool() -> list[bytes]:
    if not _POOL:
        _POOL.extend(_example(16, 16 + 8 * n, [[2, 2, 10, 10]], [1]) for n in range(2))
    return _POOL


records_strategy = st.lists(
    st.one_of(st.integers(0, 1), st.binary(min_size=0, max_size=40)), min_size=1, max_size=6
)


@settings(
    max_examples=60,
    deadline=3000,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    items=records_strategy,
    mutation=st.sampled_from(["none", "truncate", "flip", "gzip"]),
    where=st.floats(0, 1, exclude_max=True),
)
def test_fuzz_every_bad_record_is_reported(tmp_path, items, mutation, where):
    records = [_pool()[i] if isinstance(i, int) else i for i in items]
    junk = {n for n, i in enumerate(items) if not isinstance(i, int)}
    frames = [frame(r) for r in records]
    starts = np.cumsum([0] + [len(f) for f in frames])
    blob = bytearray(b"".join(frames))
    position = int(where * len(blob))
    hit = int(np.searchsorted(starts, position, side="right") - 1)  # frame holding position
    if mutation == "truncate":
        blob = blob[:position]
    elif mutation == "flip":
        blob[position] ^= 0x5A
    path = tmp_path / f"fuzz-{mutation}.tfrecord"
    path.write_bytes(gzip.compress(bytes(blob)) if mutation == "gzip" else bytes(blob))

    result = memfit.data.check([str(path)])  # must not raise or hang
    bad = {p.index for p in result.errors}
    if mutation in ("none", "gzip"):
        assert bad == junk
        assert result.records == len(records)
        return
    before = set(range(hit))
    assert bad & before == junk & before  # records before the damage: exactly the junk
    if mutation == "truncate" and position > starts[hit]:
        assert hit in bad and result.records == hit + 1
    if mutation == "truncate" and position == starts[hit]:
        assert result.records == hit
    if mutation == "flip":
        assert hit in bad


def test_read_records_matches_tensorflow_on_sound_files(dataset):
    tf = pytest.importorskip("tensorflow")
    path = dataset["clean"][0]
    ours = [r.data for r in read_records(path)]
    theirs = [bytes(x.numpy()) for x in tf.data.TFRecordDataset(path)]
    assert ours == theirs and len(ours) == 6


def _flat_png(height: int, width: int) -> bytes:
    """A real grayscale PNG of one flat colour: tiny on disk, huge decoded."""
    import struct
    import zlib

    pack = zlib.compressobj(9)
    row = b"\x00" * (width + 1)  # filter byte + one byte per pixel
    body = b"".join(pack.compress(row) for _ in range(height)) + pack.flush()

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    signature = b"\x89PNG\r\n\x1a\n"
    return signature + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def test_image_size_reads_headers_without_decoding():
    from memfit.data.check import image_size

    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (37, 53, 3), dtype=np.uint8)
    for fmt in ("jpeg", "png"):
        assert image_size(synth.encode_image(image, fmt)) == (37, 53)
    assert image_size(_flat_png(20, 30000)) == (20, 30000)
    assert image_size(b"GIF89a" + (640).to_bytes(2, "little") + (480).to_bytes(2, "little")) == (
        480,
        640,
    )
    assert image_size(b"\xff\xd8\xff") is None and image_size(b"not an image") is None


def test_empty_file_and_huge_image_are_problems(tmp_path):
    # A new user's findings: a 0-byte .tfrecord said "no problems"; a 20000x20000
    # PNG of 389 KB was decoded to 1.1 GiB of RAM without a word.
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    png = _flat_png(20000, 20000)
    assert len(png) < 400_000
    huge = write_records(
        str(tmp_path / "huge.tfrecord"),
        [
            _example(64, 96, [[8, 8, 40, 60]], [1]),
            synth.od_api_example(png, 20000, 20000, [[8, 8, 40, 60]], [1], image_format="png"),
        ],
    )
    result = memfit.data.check([str(empty), huge])
    assert not result.ok
    found = _found(result)
    assert ("no_records", "empty.tfrecord", -1) in found
    assert ("huge_image", "huge.tfrecord", 1) in found
    message = next(p.message for p in result.problems if p.kind == "huge_image")
    assert "20000x20000" in message and "1.12 GiB" in message and "not decoded" in message
    assert result.records == 2 and result.valid_records == 1
    # Its size still counts, read from the header: it is the largest image.
    assert (result.largest[0].height, result.largest[0].width) == (20000, 20000)
    # A lower limit makes a 64x96 image huge too; a higher one lets the big one be decoded
    # (not run here: 400 MB).
    small = memfit.data.check([huge], max_pixels=1000)
    assert {p.index for p in small.problems if p.kind == "huge_image"} == {0, 1}

    proc = run_cli("data", "check", str(empty), "--json")
    assert proc.returncode == 1, proc.stderr
    payload = json.loads(proc.stdout)
    assert [p["kind"] for p in payload["problems"]] == ["no_records"]


def test_declared_size_that_disagrees_with_the_image_is_a_size_mismatch(tmp_path):
    image = np.zeros((40, 60, 3), dtype=np.uint8)
    encoded = synth.encode_image(image, "png")
    path = write_records(
        str(tmp_path / "sizes.tfrecord"),
        [
            synth.od_api_example(encoded, 50, 60, [[4, 4, 20, 30]], [1], image_format="png"),
            synth.od_api_example(_flat_png(30, 20), 31, 20, [[2, 2, 10, 10]], [1], "png"),
        ],
    )

    def mismatches(result) -> list[str]:
        return [p.message for p in result.problems if p.kind == "size_mismatch"]

    assert mismatches(memfit.data.check([path])) == [
        "image/height x image/width say 50x60, the image is 40x60 (height x width)",
        "image/height x image/width say 31x20, the image is 30x20 (height x width)",
    ]
    # An image over max_pixels is not decoded: its size is read from the header.
    assert mismatches(memfit.data.check([path], max_pixels=100)) == [
        "image/height x image/width say 50x60, the image header says 40x60 (height x width)",
        "image/height x image/width say 31x20, the image header says 30x20 (height x width)",
    ]


def test_records_with_instance_masks_check_clean(tmp_path):
    # Mask R-CNN's records (`image/object/mask`, one PNG per object) as the Model Garden's
    # tests train on them: their images and boxes are checked; the masks are read past.
    synth.write_dataset(
        str(tmp_path), count=6, shards=1, image_size=(64, 64), num_classes=5, masks=True
    )
    report = memfit.data.check(str(tmp_path))
    assert report.ok and report.records == report.valid_records == 6, report.problems
    assert report.objects >= 6
