"""Check a detection dataset before training: every bad record, the resolutions, the memory.

`check()` reads TFRecord files (plain or gzip) in parallel, one thread per file, and checks
each record against a schema (the TensorFlow Object Detection API's by default): damaged
records, records that are not `tf.train.Example`s, missing features or features of the wrong
type, images that do not decode or whose size disagrees with `image/height`/`image/width`,
images so large that decoding them would take gigabytes (read from the image's header, never
decoded), files that hold no records, boxes outside [0, 1] or with min > max, images without
objects, class ids missing from the label map. It never stops at the first bad record: each
problem names its file and record index. It also gathers resolution and objects-per-image
histograms and the largest images, and with a MODEL, what the largest image means for memory
(measured in a child process).

This module reads the files and gathers the figures; its parts live beside it:
`example_check` (one record against the schema), `image_header` (an image's size without
decoding it), `memory` (what the largest image means for a step) and `check_result` (what it
reports).
"""

from __future__ import annotations

import os
import statistics
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from memfit.backend import tf as tfb
from memfit.checks import check_batch_size
from memfit.data.check_result import DEFAULT_BATCH_SIZE, CheckResult, ImageInfo, Problem
from memfit.data.example_check import check_example
from memfit.data.image_header import MAX_PIXELS, image_size
from memfit.data.memory import DIRECT_PIXELS, model_memory
from memfit.data.records import expand_paths, read_records
from memfit.data.schema import Feature, get_schema, load_label_map
from memfit.errors import DataError
from memfit.sizes import format_size

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DIRECT_PIXELS",
    "LARGEST",
    "MAX_PIXELS",
    "OUTLIER_FACTOR",
    "CheckResult",
    "ImageInfo",
    "Problem",
    "check",
    "image_size",
    "model_memory",
]

# An image with at least this many times the median pixel count (twice the resolution) is
# reported as an outlier.
OUTLIER_FACTOR = 4.0
LARGEST = 5
_RESOLUTION_BINS = (256, 512, 1024, 2048, 4096)
_OBJECT_BINS = (0, 1, 2, 4, 8, 16, 32, 64, 128)


@dataclass
class _FileResult:
    records: int = 0
    valid: int = 0
    objects: list[int] = field(default_factory=list)
    images: list[ImageInfo] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def check(
    paths: str | Sequence[str],
    schema: str = "od-api",
    label_map: str | dict[int, str] | None = None,
    model: Any = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    workers: int | None = None,
    decode: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
    max_pixels: int = MAX_PIXELS,
) -> CheckResult:
    """Check TFRecord files of detection examples; report every bad record with file and index.

    Args:
        paths: files, folders or globs (`"data/train-*.tfrecord*"`); gzip files are detected.
        schema: the layout records must follow; `"od-api"` (TensorFlow Object Detection API).
        label_map: an OD-API `.pbtxt` label map, a text file of class names, or `{id: name}`;
            class ids outside it are problems.
        model: a MODEL (`.keras` file, `package.module:factory`, `keras.applications.Name`) or
            a Keras model: adds `memory`, what a training step of `batch_size` needs. For a
            model with a fixed input size the step is measured at that size (images are resized
            to it); for a model that takes any size, it is measured at a reference size of the
            largest image's shape (longer side 256) and scaled by pixel count to the largest
            image: activations grow with pixels, weights and optimizer state do not. Each
            measurement runs in a fresh child process (`memfit.measure` isolated).
        batch_size: the batch size memory figures are for.
        workers: files read at once (default: up to 8, one per file).
        decode: decode every image (finds undecodable images and wrong sizes; slower).
        on_progress: called with `(bytes_done, bytes_total)` as files are read.
        max_pixels: an image with more pixels than this, read from its header (PNG, JPEG,
            GIF, BMP), is a `huge_image` problem and is not decoded (default `MAX_PIXELS`,
            89.5 million: 256 MiB decoded as uint8 RGB).

    Returns:
        A `CheckResult`; `result.ok` is False when any record has an error.

    Raises:
        DataError: no file matches, unknown schema, unreadable label map.

    Example:
        ```python
        result = memfit.data.check("data/train-*.tfrecord", label_map="label_map.pbtxt")
        for problem in result.problems:
            print(problem)
        ```
    """
    import time

    started = time.perf_counter()
    check_batch_size(batch_size, error=DataError)
    features = get_schema(schema)
    classes = load_label_map(label_map) if isinstance(label_map, str) else label_map
    files = expand_paths(paths)
    tf = tfb.import_tf()
    total = sum(os.path.getsize(f) for f in files)
    done = [0]
    lock = threading.Lock()

    def advance(count: int) -> None:
        with lock:
            done[0] += count
            if on_progress:
                on_progress(min(done[0], total), total)

    def one(path: str) -> _FileResult:
        return _check_file(tf, path, features, classes, decode, advance, max_pixels)

    with ThreadPoolExecutor(max_workers=workers or min(8, len(files))) as pool:
        results = list(pool.map(one, files))
    if on_progress:
        on_progress(total, total)

    result = CheckResult(files=files, batch_size=batch_size)
    images: list[ImageInfo] = []
    objects: list[int] = []
    for r in results:
        result.records += r.records
        result.valid_records += r.valid
        result.problems.extend(r.problems)
        images.extend(r.images)
        objects.extend(r.objects)
    result.objects = sum(objects)
    result.problems.extend(_outliers(images))
    result.problems.sort(key=lambda p: (files.index(p.file), p.index))
    result.resolution_histogram = _resolution_histogram(images)
    result.resolutions = dict(Counter(f"{i.width}x{i.height}" for i in images).most_common(10))
    result.objects_histogram = _objects_histogram(objects)
    result.largest = sorted(images, key=lambda i: (-i.height * i.width, i.file, i.index))[:LARGEST]
    if model is not None and result.largest:
        result.memory = model_memory(model, result.largest[0], batch_size)
    result.seconds = time.perf_counter() - started
    return result


def _check_file(
    tf: Any,
    path: str,
    features: Sequence[Feature],
    classes: dict[int, str] | None,
    decode: bool,
    advance: Callable[[int], None],
    max_pixels: int = MAX_PIXELS,
) -> _FileResult:
    out = _FileResult()
    try:
        records = read_records(path, on_bytes=advance)
        for record in records:
            if record.index >= 0:
                out.records += 1
            if record.error:
                out.problems.append(
                    Problem(record.kind or "corrupt_record", path, record.index, record.error)
                )
                continue
            problems, info, count = check_example(
                tf, path, record.index, record.data, features, classes, decode, max_pixels
            )
            out.problems.extend(problems)
            if info is not None:
                out.images.append(info)
            if count is not None:
                out.objects.append(count)
            if not any(p.severity == "error" for p in problems):
                out.valid += 1
    except OSError as exc:
        out.problems.append(Problem("unreadable_file", path, -1, f"cannot read the file: {exc}"))
    if out.records == 0 and not out.problems:
        size = os.path.getsize(path)
        out.problems.append(
            Problem(
                "no_records",
                path,
                -1,
                f"the file holds no records ({size} bytes"
                + (", empty" if size == 0 else "")
                + "): training on it sees no data; check how it was written",
            )
        )
    return out


def _outliers(images: list[ImageInfo]) -> list[Problem]:
    if len(images) < 3:
        return []
    median = statistics.median(i.height * i.width for i in images)
    return [
        Problem(
            "resolution_outlier",
            i.file,
            i.index,
            f"image is {i.width}x{i.height} (W x H), {i.height * i.width / median:.0f}x the "
            f"median pixel count; decoded it takes {format_size(i.decoded_bytes)} (uint8), and "
            f"a batch sized for typical images may not fit when it comes",
            "warning",
        )
        for i in images
        if i.height * i.width >= OUTLIER_FACTOR * median
    ]


def _resolution_histogram(images: list[ImageInfo]) -> dict[str, int]:
    names = []
    low = 0
    for high in _RESOLUTION_BINS:
        names.append(f"<={high}" if low == 0 else f"{low + 1}-{high}")
        low = high
    names.append(f">{_RESOLUTION_BINS[-1]}")
    counts = dict.fromkeys(names, 0)
    for image in images:
        side = max(image.height, image.width)
        slot = next((n for n, h in enumerate(_RESOLUTION_BINS) if side <= h), len(names) - 1)
        counts[names[slot]] += 1
    return counts


def _objects_histogram(objects: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in sorted(objects):
        slot = next((n for n, h in enumerate(_OBJECT_BINS) if value <= h), None)
        if slot is None:
            name = f">{_OBJECT_BINS[-1]}"
        else:
            high = _OBJECT_BINS[slot]
            low = _OBJECT_BINS[slot - 1] + 1 if slot > 0 else 0
            name = str(high) if low >= high else f"{low}-{high}"
        counts[name] = counts.get(name, 0) + 1
    return counts
