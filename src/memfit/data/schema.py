"""The TensorFlow Object Detection API's TFRecord layout, and checking one example against it.

The OD-API writes one `tf.train.Example` per image (see its `create_*_tf_record.py` scripts
and `data_decoders/tf_example_decoder.py`):

| feature | type | per | required |
|---|---|---|---|
| `image/encoded` | bytes (JPEG/PNG) | image | yes |
| `image/height`, `image/width` | int64 | image | yes |
| `image/format` | bytes (`jpeg`, `png`) | image | no |
| `image/filename`, `image/source_id`, `image/key/sha256` | bytes | image | no |
| `image/object/bbox/xmin`, `ymin`, `xmax`, `ymax` | float, normalised to [0, 1] | object | yes |
| `image/object/class/label` | int64 (label map id, 1-based) | object | yes |
| `image/object/class/text` | bytes | object | no |
| `image/object/difficult`, `is_crowd`, `truncated` | int64 | object | no |
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from memfit.errors import DataError

BOX_KEYS = (
    "image/object/bbox/ymin",
    "image/object/bbox/xmin",
    "image/object/bbox/ymax",
    "image/object/bbox/xmax",
)


@dataclass(frozen=True)
class Feature:
    """One feature of a schema.

    Attributes:
        name: the feature key.
        kind: `"bytes"`, `"int64"` or `"float"` (the `tf.train.Feature` oneof).
        per: `"image"` (exactly one value) or `"object"` (one value per object).
        required: whether a record without it is a problem.
    """

    name: str
    kind: str
    per: str
    required: bool


OD_API = (
    Feature("image/encoded", "bytes", "image", True),
    Feature("image/height", "int64", "image", True),
    Feature("image/width", "int64", "image", True),
    Feature("image/format", "bytes", "image", False),
    Feature("image/filename", "bytes", "image", False),
    Feature("image/source_id", "bytes", "image", False),
    Feature("image/key/sha256", "bytes", "image", False),
    *(Feature(key, "float", "object", True) for key in BOX_KEYS),
    Feature("image/object/class/label", "int64", "object", True),
    Feature("image/object/class/text", "bytes", "object", False),
    Feature("image/object/difficult", "int64", "object", False),
    Feature("image/object/is_crowd", "int64", "object", False),
    Feature("image/object/truncated", "int64", "object", False),
)

SCHEMAS: dict[str, tuple[Feature, ...]] = {"od-api": OD_API}


def get_schema(name: str) -> tuple[Feature, ...]:
    """The features of a named schema (`"od-api"`).

    Raises:
        DataError: the name is unknown.

    Example:
        >>> [f.name for f in get_schema("od-api")][:2]
        ['image/encoded', 'image/height']
    """
    try:
        return SCHEMAS[name]
    except KeyError:
        raise DataError(
            f"unknown schema {name!r}; memfit knows {', '.join(sorted(SCHEMAS))}"
        ) from None


_ITEM = re.compile(r"item\s*\{(.*?)\}", re.S)
_ID = re.compile(r"\bid\s*:\s*(-?\d+)")
_NAME = re.compile(r"\b(?:display_name|name)\s*:\s*[\"']([^\"']*)[\"']")


def load_label_map(path: str) -> dict[int, str]:
    """Class ids and names from an OD-API label map (`.pbtxt`) or a text file of names.

    A `.pbtxt` holds `item { id: 1 name: 'cat' }` entries; any other file is read as one
    class name per line, ids counting from 1 (the OD-API's convention; 0 is background).

    Raises:
        DataError: the file is missing or holds no class.

    Example:
        >>> load_label_map("label_map.pbtxt")  # doctest: +SKIP
        {1: 'cat', 2: 'dog'}
    """
    if not os.path.isfile(path):
        raise DataError(f"label map {path!r} does not exist")
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    classes: dict[int, str] = {}
    items = _ITEM.findall(text)
    if items:
        for item in items:
            found = _ID.search(item)
            if found:
                name = _NAME.search(item)
                classes[int(found.group(1))] = name.group(1) if name else str(found.group(1))
    elif "item" not in text:
        names = [line.strip() for line in text.splitlines() if line.strip()]
        classes = {index + 1: name for index, name in enumerate(names)}
    if not classes:
        raise DataError(
            f"label map {path!r} holds no class; give an OD-API .pbtxt "
            f"(item {{ id: 1 name: 'cat' }}) or a text file with one class name per line"
        )
    return classes
