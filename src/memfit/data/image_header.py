"""An encoded image's size read from its header (PNG, JPEG, GIF, BMP), without decoding it."""

from __future__ import annotations

# An image over this many pixels is a problem and is not decoded: Pillow's decompression-bomb
# limit (89.5 million pixels; 256 MiB decoded as uint8 RGB). A 20000x20000 PNG of flat colour
# is 389 KB on disk and 1.1 GiB decoded.
MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3


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

    kind = image_format(encoded)
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


def image_format(encoded: bytes) -> str | None:
    """An encoded image's format from its first bytes: jpeg, png, gif, bmp, or None.

    Example:
        >>> image_format(b"GIF89a")
        'gif'
    """
    if encoded[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if encoded[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if encoded[:4] in (b"GIF8",):
        return "gif"
    if encoded[:2] == b"BM":
        return "bmp"
    return None
