"""One record checked against a schema: its features, its boxes and labels, its image."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from memfit.data.check_result import ImageInfo, Problem
from memfit.data.image_header import MAX_PIXELS, image_format, image_size
from memfit.data.schema import BOX_KEYS, Feature
from memfit.sizes import format_size

_LABEL = "image/object/class/label"
_TEXT = "image/object/class/text"


def _values(feature: Any) -> tuple[str | None, list[Any]]:
    kind = feature.WhichOneof("kind")
    if kind == "bytes_list":
        return "bytes", list(feature.bytes_list.value)
    if kind == "int64_list":
        return "int64", list(feature.int64_list.value)
    if kind == "float_list":
        return "float", list(feature.float_list.value)
    return None, []


def check_example(
    tf: Any,
    path: str,
    index: int,
    data: bytes | None,
    features: Sequence[Feature],
    classes: dict[int, str] | None,
    decode: bool,
    max_pixels: int = MAX_PIXELS,
) -> tuple[list[Problem], ImageInfo | None, int | None]:
    """Check one record's bytes against `features`: the problems, the image, the objects.

    Args:
        tf: the TensorFlow module.
        path: the record's file (named in each problem).
        index: the record's position in the file.
        data: the record's bytes, a serialized `tf.train.Example`.
        features: the schema (`memfit.data.schema.get_schema`).
        classes: the label map (`{id: name}`), or None to accept any id from 0 up.
        decode: decode the image (finds undecodable images and wrong sizes).
        max_pixels: a larger image (read from its header) is a `huge_image` problem and is
            not decoded.

    Returns:
        `(problems, image, objects)`: the record's problems, its image's size (None when it
        has none), and its number of objects (None when its boxes are unreadable).
    """
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
            add("size_mismatch", _mismatch((height, width), header, "the image header says"))
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
                add("size_mismatch", _mismatch((height, width), decoded, "the image is"))
            height, width = decoded
            fmt = values.get("image/format", [b""])[0].decode("utf-8", "replace").lower()
            actual = image_format(encoded)
            if fmt and actual and fmt.replace("jpg", "jpeg") != actual:
                add(
                    "format_mismatch",
                    f"image/format says {fmt!r}, the bytes are {actual}",
                    "warning",
                )
    if height is not None and width is not None:
        info = ImageInfo(path, index, int(height), int(width), int(height) * int(width) * 3)
    return problems, info, count


def _mismatch(declared: tuple[int, int], found: tuple[int, int], what: str) -> str:
    return (
        f"image/height x image/width say {declared[0]}x{declared[1]}, {what} "
        f"{found[0]}x{found[1]} (height x width)"
    )


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
