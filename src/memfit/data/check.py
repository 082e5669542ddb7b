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
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.backend import tf as tfb
from memfit.checks import check_batch_size
from memfit.data.records import expand_paths, read_records
from memfit.data.schema import BOX_KEYS, Feature, get_schema, load_label_map
from memfit.errors import DataError
from memfit.sizes import format_size

DEFAULT_BATCH_SIZE = 8
# An image with at least this many times the median pixel count (twice the resolution) is
# reported as an outlier.
OUTLIER_FACTOR = 4.0
LARGEST = 5
# A model that takes any size is measured at the largest image's own size up to this many
# pixels (640 x 640); beyond, at a reference size, scaled by pixel count.
DIRECT_PIXELS = 640 * 640
# An image over this many pixels is a problem and is not decoded: Pillow's decompression-bomb
# limit (89.5 million pixels; 256 MiB decoded as uint8 RGB). A 20000x20000 PNG of flat colour
# is 389 KB on disk and 1.1 GiB decoded.
MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3
_RESOLUTION_BINS = (256, 512, 1024, 2048, 4096)
_OBJECT_BINS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
_LABEL = "image/object/class/label"
_TEXT = "image/object/class/text"


@dataclass
class Problem:
    """One thing wrong with one record (or with a file, when `index` is -1).

    Attributes:
        kind: what is wrong, e.g. `"truncated_record"`, `"decode_error"`, `"inverted_box"`.
        file: the file's path.
        index: the record's position in the file (0-based); -1 for the file as a whole.
        message: what is wrong, in words.
        severity: `"error"` (makes `check` fail) or `"warning"` (reported only).
    """

    kind: str
    file: str
    index: int
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.file}" + (f" record {self.index}" if self.index >= 0 else "")
        return f"{where}: {self.message}"


@dataclass
class ImageInfo:
    """Where an image is and how large it is.

    Attributes:
        file: the file's path.
        index: the record's position in the file.
        height: pixels (decoded, or as declared when the image does not decode).
        width: pixels.
        decoded_bytes: the image decoded as uint8 (height × width × 3).
    """

    file: str
    index: int
    height: int
    width: int
    decoded_bytes: int


@dataclass
class CheckResult:
    """What `check()` found.

    Attributes:
        files: the files read.
        records: records read (sound or not).
        valid_records: records without an error.
        objects: objects (boxes) in all records.
        problems: every problem, in file and record order.
        resolution_histogram: images per longer-side bin (`"<=256"`, `"257-512"`, ...).
        resolutions: the most common `"WxH"` resolutions and their counts.
        objects_histogram: images per objects-per-image bin (`"0"`, `"1"`, `"2"`, `"3-4"`, ...).
        largest: the largest images, largest first.
        batch_size: the batch size the memory figures are for.
        memory: what the largest image means for memory (see `check`); None without a model.
        seconds: how long the check took.
    """

    files: list[str]
    records: int = 0
    valid_records: int = 0
    objects: int = 0
    problems: list[Problem] = field(default_factory=list)
    resolution_histogram: dict[str, int] = field(default_factory=dict)
    resolutions: dict[str, int] = field(default_factory=dict)
    objects_histogram: dict[str, int] = field(default_factory=dict)
    largest: list[ImageInfo] = field(default_factory=list)
    batch_size: int = DEFAULT_BATCH_SIZE
    memory: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def errors(self) -> list[Problem]:
        """Problems of severity `"error"`."""
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        """Problems of severity `"warning"`."""
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        """Whether no record has an error (warnings allowed)."""
        return not self.errors

    def counts(self) -> dict[str, int]:
        """Problems per kind."""
        return dict(Counter(p.kind for p in self.problems))

    def largest_batch_bytes(self) -> int | None:
        """A batch of `batch_size` copies of the largest image, decoded as float32."""
        if not self.largest:
            return None
        return self.largest[0].decoded_bytes * 4 * self.batch_size

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (snake_case keys, sizes in `*_bytes`, times in `*_seconds`)."""
        return {
            "ok": self.ok,
            "files": self.files,
            "records": self.records,
            "valid_records": self.valid_records,
            "invalid_records": self.records - self.valid_records,
            "objects": self.objects,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "problem_counts": self.counts(),
            "problems": [asdict(p) for p in self.problems],
            "resolution_histogram": self.resolution_histogram,
            "resolutions": self.resolutions,
            "objects_histogram": self.objects_histogram,
            "largest": [asdict(i) for i in self.largest],
            "batch_size": self.batch_size,
            "largest_batch_float32_bytes": self.largest_batch_bytes(),
            "memory": self.memory,
            "check_seconds": round(self.seconds, 3),
        }

    def summary(self) -> str:
        """One line: records, problems, verdict."""
        verdict = "no problems" if self.ok else f"{len(self.errors)} problem(s)"
        return (
            f"{self.records} records in {len(self.files)} file(s), {self.valid_records} valid, "
            f"{self.objects} objects: {verdict}, {len(self.warnings)} warning(s)"
        )


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
            measurement runs in a fresh child process (`memfit.measure(..., isolated=True)`).
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
            problems, info, count = _check_example(
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


def _values(feature: Any) -> tuple[str | None, list[Any]]:
    kind = feature.WhichOneof("kind")
    if kind == "bytes_list":
        return "bytes", list(feature.bytes_list.value)
    if kind == "int64_list":
        return "int64", list(feature.int64_list.value)
    if kind == "float_list":
        return "float", list(feature.float_list.value)
    return None, []


def _check_example(
    tf: Any,
    path: str,
    index: int,
    data: bytes | None,
    features: Sequence[Feature],
    classes: dict[int, str] | None,
    decode: bool,
    max_pixels: int = MAX_PIXELS,
) -> tuple[list[Problem], ImageInfo | None, int | None]:
    from google.protobuf.message import DecodeError

    problems: list[Problem] = []

    def add(kind: str, message: str, severity: str = "error") -> None:
        problems.append(Problem(kind, path, index, message, severity))

    try:
        example = tf.train.Example.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        add("not_an_example", f"not a tf.train.Example ({str(exc)[:120] or 'parse error'})")
        return problems, None, None
    present = example.features.feature
    values: dict[str, list[Any]] = {}
    for spec in features:
        if spec.name not in present:
            if spec.required:
                add("missing_feature", f"feature {spec.name!r} is missing")
            continue
        kind, items = _values(present[spec.name])
        if kind is None and not spec.required:
            continue
        if kind != spec.kind and not (kind is None and spec.per == "object"):
            add("wrong_type", f"feature {spec.name!r} is {kind or 'empty'}, expected {spec.kind}")
            continue
        if spec.per == "image" and len(items) != 1:
            add("wrong_count", f"feature {spec.name!r} has {len(items)} values, expected 1")
            continue
        values[spec.name] = items

    # -- objects ----------------------------------------------------------------------------
    count: int | None = None
    columns = [values[k] for k in BOX_KEYS if k in values]
    labels = values.get(_LABEL)
    if len(columns) == 4 and labels is not None:
        lengths = {len(c) for c in columns} | {len(labels)}
        text = values.get(_TEXT)
        if text:
            lengths.add(len(text))
        if len(lengths) != 1:
            add(
                "length_mismatch",
                "box coordinates, labels (and texts) have different lengths "
                f"({', '.join(f'{k.rsplit(chr(47), 1)[-1]}={len(values[k])}' for k in (*BOX_KEYS, _LABEL, _TEXT) if k in values)})",  # noqa: E501
            )
        else:
            count = len(labels)
            _check_boxes(columns, labels, classes, add)
            if count == 0:
                add("no_objects", "image has no objects", "warning")

    # -- image ------------------------------------------------------------------------------
    info: ImageInfo | None = None
    height = values.get("image/height", [None])[0]
    width = values.get("image/width", [None])[0]
    if height is not None and width is not None and (height < 1 or width < 1):
        add("bad_size", f"image/height and image/width are {height}x{width}")
        height = width = None
    encoded = values.get("image/encoded", [None])[0]
    header = image_size(encoded) if encoded is not None else None
    if header is not None and header[0] * header[1] > max_pixels:
        # Decoding it would take the RAM the header announces: report it from the header.
        rows, cols = header
        add(
            "huge_image",
            f"image/encoded is {cols}x{rows} (W x H, {rows * cols / 1e6:.0f} million pixels) "
            f"in {format_size(len(encoded))}: decoded it takes {format_size(rows * cols * 3)} "
            f"(uint8 RGB), more than the {max_pixels / 1e6:.1f}-million-pixel limit, so it "
            f"was not decoded; resize it (or raise max_pixels / --max-pixels if it is meant)",
        )
        if height is not None and (height, width) != header:
            add(
                "size_mismatch",
                f"image/height x image/width say {height}x{width}, the image header says "
                f"{rows}x{cols} (height x width)",
            )
        height, width = header
        encoded = None  # not decoded
    if encoded is not None and decode:
        try:
            shape = tf.io.decode_image(encoded, expand_animations=False).shape
            decoded = (int(shape[0]), int(shape[1]))
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError, ValueError) as exc:
            message = str(getattr(exc, "message", exc)).splitlines()[0][:120]
            add("decode_error", f"image/encoded does not decode as an image ({message})")
            decoded = None
        if decoded is not None:
            if height is not None and (height, width) != decoded:
                add(
                    "size_mismatch",
                    f"image/height x image/width say {height}x{width}, the image is "
                    f"{decoded[0]}x{decoded[1]} (height x width)",
                )
            height, width = decoded
            fmt = values.get("image/format", [b""])[0].decode("utf-8", "replace").lower()
            actual = _sniff(encoded)
            if fmt and actual and fmt.replace("jpg", "jpeg") != actual:
                add(
                    "format_mismatch",
                    f"image/format says {fmt!r}, the bytes are {actual}",
                    "warning",
                )
    if height is not None and width is not None:
        info = ImageInfo(path, index, int(height), int(width), int(height) * int(width) * 3)
    return problems, info, count


def image_size(encoded: bytes) -> tuple[int, int] | None:
    """An encoded image's `(height, width)` read from its header, without decoding it.

    Reads PNG (IHDR), JPEG (the first SOF marker), GIF and BMP headers; other formats, and
    headers cut short, give None.

    Args:
        encoded: the image file's bytes (e.g. a record's `image/encoded`).

    Example:
        >>> image_size(open("photo.jpg", "rb").read())
        (3000, 4000)
    """
    import struct

    kind = _sniff(encoded)
    try:
        if kind == "png" and encoded[12:16] == b"IHDR":
            width, height = struct.unpack(">II", encoded[16:24])
            return height, width
        if kind == "gif":
            width, height = struct.unpack("<HH", encoded[6:10])
            return height, width
        if kind == "bmp":
            if struct.unpack("<I", encoded[14:18])[0] == 12:  # BITMAPCOREHEADER
                width, height = struct.unpack("<HH", encoded[18:22])
            else:
                width, height = struct.unpack("<ii", encoded[18:26])
            return abs(height), abs(width)
        if kind == "jpeg":
            return _jpeg_size(encoded)
    except struct.error:
        return None
    return None


# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): they carry the size.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(encoded: bytes) -> tuple[int, int] | None:
    import struct

    at = 2
    while at + 4 <= len(encoded):
        if encoded[at] != 0xFF:
            return None
        marker = encoded[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker == 0xDA:  # start of scan: no frame header before the image data
            return None
        if marker in (0x01, *range(0xD0, 0xDA)):  # no length: TEM, RSTn, SOI, EOI
            at += 2
            continue
        (length,) = struct.unpack(">H", encoded[at + 2 : at + 4])
        if marker in _SOF:
            height, width = struct.unpack(">HH", encoded[at + 5 : at + 9])
            return height, width
        at += 2 + length
    return None


def _sniff(encoded: bytes) -> str | None:
    if encoded[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if encoded[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if encoded[:4] in (b"GIF8",):
        return "gif"
    if encoded[:2] == b"BM":
        return "bmp"
    return None


def _check_boxes(
    columns: list[list[float]],
    labels: list[int],
    classes: dict[int, str] | None,
    add: Callable[..., None],
) -> None:
    outside: list[str] = []
    inverted: list[str] = []
    for number, (ymin, xmin, ymax, xmax) in enumerate(zip(*columns, strict=True)):
        coords = (ymin, xmin, ymax, xmax)
        if any(not math.isfinite(v) or v < 0.0 or v > 1.0 for v in coords):
            outside.append(
                f"object {number}: (ymin, xmin, ymax, xmax) = "
                f"({', '.join(f'{v:.4g}' for v in coords)})"
            )
        if ymin > ymax or xmin > xmax:
            side = "ymin > ymax" if ymin > ymax else "xmin > xmax"
            inverted.append(
                f"object {number}: {side} ({ymin:.4g}, {xmin:.4g}, {ymax:.4g}, {xmax:.4g})"
            )
    if outside:
        add("box_out_of_range", f"{len(outside)} box(es) outside [0, 1]: {'; '.join(outside[:3])}")
    if inverted:
        add("inverted_box", f"{len(inverted)} box(es) with min > max: {'; '.join(inverted[:3])}")
    bad = sorted({label for label in labels if label < 0 or (classes and label not in classes)})
    if bad:
        where = "the label map" if classes else "valid ids (0 and up)"
        add("unknown_class", f"class id(s) {', '.join(map(str, bad[:10]))} not in {where}")


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


# -- memory -----------------------------------------------------------------------------------
def model_memory(model: Any, largest: ImageInfo, batch_size: int) -> dict[str, Any]:
    """What the largest image means for one training step of `model` at `batch_size`.

    A model with a fixed input size is measured at that size (the pipeline resizes every image
    to it, so the largest image adds only its decoded size in host memory). A model that takes
    any size is measured at the largest image's own size when it has at most `DIRECT_PIXELS`
    pixels; a larger one at a reference shape, the largest image's shape with its longer side
    scaled to 256 (rounded to multiples of 32, or 128 for keras-hub detectors), and the step's
    own bytes (peak minus resident) are scaled by the pixel ratio to the largest image: a
    proportional estimate, since activations grow with pixels and weights do not.
    """
    from memfit._runner import run_in_child
    from memfit.isolate import measurement_from_child, save_for_child

    with tempfile.TemporaryDirectory(prefix="memfit-data-") as tmp:
        spec = model if isinstance(model, str) else save_for_child(model, tmp)
        result = run_in_child(
            "memfit.data.check:_measure_child",
            {
                "spec": spec,
                "batch_size": batch_size,
                "height": largest.height,
                "width": largest.width,
            },
        )
    mode = result.pop("mode")
    measured = measurement_from_child(result, batch_size, None)
    height, width = measured.input_shapes[0][:2] if measured.input_shapes else (None, None)
    memory: dict[str, Any] = {
        "model": model if isinstance(model, str) else getattr(model, "name", "model"),
        "mode": mode,
        "batch_size": batch_size,
        "measured_height": height,
        "measured_width": width,
        "measured_peak_bytes": measured.peak_bytes,
        "resident_bytes": measured.resident_bytes,
        "oom": measured.oom,
        "largest_height": largest.height,
        "largest_width": largest.width,
        "largest_batch_float32_bytes": largest.decoded_bytes * 4 * batch_size,
        "device": measured.device,
    }
    if mode == "scaled" and measured.peak_bytes is not None and height and width:
        ratio = largest.height * largest.width / (height * width)
        step = measured.peak_bytes - measured.resident_bytes
        memory["pixel_ratio"] = ratio
        memory["peak_bytes"] = int(measured.resident_bytes + step * ratio)
    else:
        memory["peak_bytes"] = measured.peak_bytes
    memory["message"] = _memory_message(memory)
    return memory


def _memory_message(m: dict[str, Any]) -> str:
    largest = f"{m['largest_width']}x{m['largest_height']}"
    batch = format_size(m["largest_batch_float32_bytes"])
    if m["mode"] == "fixed":
        return (
            f"the largest image, {largest} (W x H), makes a decoded float32 batch of "
            f"{m['batch_size']} take {batch} before resizing; a training step at the model's "
            f"input size {m['measured_width']}x{m['measured_height']}, batch {m['batch_size']}, "
            f"peaks at {format_size(m['peak_bytes'])} on {m['device']} (measured)"
            + (" — out of memory" if m["oom"] else "")
        )
    if m["mode"] == "measured":
        return (
            f"the largest image, {largest} (W x H), makes a training step of batch "
            f"{m['batch_size']} at that size peak at {format_size(m['peak_bytes'])} on "
            f"{m['device']} (measured; the model takes any size)"
            + (" — out of memory" if m["oom"] else "")
            + f", and {batch} for the decoded float32 batch alone"
        )
    return (
        f"the largest image, {largest} (W x H), makes a batch of {m['batch_size']} need "
        f"≈ {format_size(m['peak_bytes'])} for a training step at that size (the model takes "
        f"any size; measured at {m['measured_width']}x{m['measured_height']} on {m['device']} "
        f"and scaled by pixel count, x{m.get('pixel_ratio', 1):.1f}), and {batch} for the "
        f"decoded float32 batch alone"
    )


def _round(value: float, step: int) -> int:
    return max(step, int(round(value / step)) * step)


def _measure_child(spec: str, batch_size: int, height: int, width: int) -> dict[str, Any]:
    """Child side of `model_memory`: load MODEL, measure one step, say how (fixed or scaled)."""
    from memfit.budget import emulated_budget
    from memfit.measure import measure_workload
    from memfit.models import load_model
    from memfit.workload import Workload

    model = load_model(spec)
    shape = None
    if getattr(model, "inputs", None):
        shape = tuple(model.inputs[0].shape[1:])
    detector = hasattr(model, "bounding_box_format")
    if shape and len(shape) == 3 and shape[0] and shape[1]:
        mode, h, w = "fixed", int(shape[0]), int(shape[1])
    elif height * width <= DIRECT_PIXELS:
        # Small enough to measure as it is: no scaling, no estimate.
        mode, h, w = "measured", height, width
    else:
        step = 128 if detector else 32
        scale = 256 / max(height, width)
        mode, h, w = "scaled", _round(height * scale, step), _round(width * scale, step)
    channels = int(shape[2]) if shape and len(shape) == 3 and shape[2] else 3
    data = None
    if detector:
        from memfit.zoo import detection_samples

        data = detection_samples(
            max(batch_size, 2), (h, w), num_classes=int(getattr(model, "num_classes", 20))
        )
    workload = Workload(model, input_shape=(h, w, channels), data=data)
    measured = measure_workload(
        workload, batch_size, repeats=2, device=tfb.default_device(), budget=emulated_budget()
    ).to_dict()
    measured["mode"] = mode
    return measured
