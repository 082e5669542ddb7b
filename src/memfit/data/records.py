"""TFRecord files read record by record, tolerant of corruption: every bad record is reported.

A TFRecord file is a sequence of frames: `uint64 length`, `uint32 masked_crc32c(length)`,
`length` bytes of data, `uint32 masked_crc32c(data)` (little-endian). TensorFlow's own reader
stops at the first bad frame; this one reads the framing itself, so it can say which record of
which file is bad and go on: a record whose data checksum fails is reported and skipped (its
length was sound, so the next frame starts right after it); a frame whose length checksum
fails is reported and the reader looks for the next sound frame header further on.

Plain files are memory-mapped (no copy). Gzip files are decompressed into memory first, as
far as the stream is readable: a truncated or damaged gzip stream is reported, and the
records before the damage are still read.
"""

from __future__ import annotations

import glob
import gzip
import mmap
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c

from memfit.errors import DataError

_HEADER = 12  # uint64 length + uint32 masked crc of the length
_FOOTER = 4  # uint32 masked crc of the data
_MASK_DELTA = 0xA282EAD8
_GZIP_MAGIC = b"\x1f\x8b"
# A frame header that claims more than this is treated as corrupt (no sane record is 2 GiB).
MAX_RECORD_BYTES = 2**31


def masked_crc(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC-32C of `data`.

    Example:
        >>> masked_crc(b"")
        2726865112
    """
    crc = google_crc32c.value(bytes(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One TFRecord frame holding `data` (what `tf.io.TFRecordWriter` writes for it).

    Example:
        >>> len(frame(b"abc"))
        19
    """
    length = struct.pack("<Q", len(data))
    return (
        length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))
    )


def write_records(path: str, records: Sequence[bytes], gzip_compress: bool = False) -> str:
    """Write `records` to a TFRecord file (gzip-compressed when asked); returns `path`.

    Example:
        >>> write_records("/tmp/x.tfrecord", [b"a", b"b"])
        '/tmp/x.tfrecord'
    """
    payload = b"".join(frame(r) for r in records)
    if gzip_compress:
        payload = gzip.compress(payload)
    with open(path, "wb") as handle:
        handle.write(payload)
    return path


@dataclass
class Record:
    """One record of a file, or one place where a file is damaged.

    Attributes:
        file: the file's path.
        index: the record's position in the file (0-based), counting damaged frames too.
        offset: byte offset of the frame (in the decompressed stream for gzip files).
        data: the record's bytes; None when the record is damaged.
        error: what is wrong (None for a sound record).
        kind: `"corrupt_record"`, `"truncated_record"` or `"corrupt_gzip"` when damaged.
    """

    file: str
    index: int
    offset: int
    data: bytes | None = None
    error: str | None = None
    kind: str | None = None


def expand_paths(paths: str | Sequence[str]) -> list[str]:
    """Files named by paths, globs (`data/*.tfrecord*`) and folders (every file inside).

    Raises:
        DataError: a path or glob matches no file.

    Example:
        >>> expand_paths(["train-*.tfrecord"])  # doctest: +SKIP
        ['train-00000.tfrecord', 'train-00001.tfrecord']
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [os.fspath(paths)]
    files: list[str] = []
    for path in paths:
        path = os.fspath(path)
        if os.path.isdir(path):
            found = sorted(
                os.path.join(root, name)
                for root, _dirs, names in os.walk(path)
                for name in names
                if not name.startswith(".")
            )
        elif any(c in path for c in "*?["):
            found = sorted(p for p in glob.glob(path) if os.path.isfile(p))
        else:
            found = [path] if os.path.isfile(path) else []
        if not found:
            raise DataError(
                f"{path!r} matches no file; give TFRecord files, a folder or a glob such as "
                f"'data/train-*.tfrecord'"
            )
        files.extend(found)
    return list(dict.fromkeys(files))


def is_gzip(path: str) -> bool:
    """Whether a file is gzip-compressed (by its magic bytes, whatever its name)."""
    with open(path, "rb") as handle:
        return handle.read(2) == _GZIP_MAGIC


def _gunzip(path: str) -> tuple[bytes, str | None]:
    """Decompress as much of a gzip file as is readable; the error that stopped it, if any."""
    chunks: list[bytes] = []
    decompressor = zlib.decompressobj(wbits=31)
    inside = False  # within a gzip member that has not ended yet
    with open(path, "rb") as raw:
        data = raw.read(1 << 20)
        while data:
            try:
                chunks.append(decompressor.decompress(data))
            except zlib.error as exc:
                return b"".join(chunks), f"gzip stream damaged ({exc})"
            inside = True
            if decompressor.eof:  # this member ended; another may follow
                data = decompressor.unused_data or raw.read(1 << 20)
                decompressor = zlib.decompressobj(wbits=31)
                inside = False
                continue
            data = raw.read(1 << 20)
    if inside:
        return b"".join(chunks), "gzip stream truncated: the file ends before the stream does"
    return b"".join(chunks), None


def read_records(
    path: str,
    compression: str | None = "auto",
    on_bytes: Callable[[int], None] | None = None,
) -> Iterator[Record]:
    """Yield every record of one TFRecord file, and a `Record` with an error for each damage.

    Args:
        path: the file.
        compression: `"auto"` (gzip when the file starts with gzip's magic bytes), `"gzip"`,
            or None / `""` for plain files.
        on_bytes: called with the number of (file) bytes consumed, for progress displays.

    Example:
        >>> bad = [r for r in read_records("train.tfrecord") if r.error]  # doctest: +SKIP
    """
    gz = is_gzip(path) if compression == "auto" else compression == "gzip"
    size = os.path.getsize(path)
    if gz:
        buffer: Any
        buffer, gzip_error = _gunzip(path)
        scale = size / max(len(buffer), 1)
    else:
        gzip_error = None
        scale = 1.0
        if size == 0:
            return
        with open(path, "rb") as handle:
            buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield from _frames(path, buffer, lambda n: on_bytes(int(n * scale)) if on_bytes else None)
        if gzip_error:
            yield Record(path, -1, len(buffer), error=gzip_error, kind="corrupt_gzip")
    finally:
        if isinstance(buffer, mmap.mmap):
            buffer.close()


def _frames(path: str, buf: Any, progress: Callable[[int], None]) -> Iterator[Record]:
    view = memoryview(buf)
    end = len(buf)
    pos = 0
    index = 0
    try:
        while pos < end:
            start = pos
            if end - pos < _HEADER:
                yield Record(
                    path,
                    index,
                    pos,
                    error=f"file ends inside a record header ({end - pos} of 12 bytes)",
                    kind="truncated_record",
                )
                progress(end - start)
                return
            (length,) = struct.unpack_from("<Q", buf, pos)
            (length_crc,) = struct.unpack_from("<I", buf, pos + 8)
            if length_crc != masked_crc(view[pos : pos + 8]) or length > MAX_RECORD_BYTES:
                following = _resync(buf, view, pos + 1)
                yield Record(
                    path,
                    index,
                    pos,
                    error=f"corrupt record header at byte {pos} (length checksum fails); "
                    + (
                        f"skipped {following - pos} bytes to the next sound record"
                        if following < end
                        else "no sound record follows"
                    ),
                    kind="corrupt_record",
                )
                progress(following - start)
                pos = following
                index += 1
                continue
            data_end = pos + _HEADER + length
            if data_end + _FOOTER > end:
                yield Record(
                    path,
                    index,
                    pos,
                    error=f"file ends inside record data ({end - pos - _HEADER} of "
                    f"{length + _FOOTER} bytes present): the file is truncated",
                    kind="truncated_record",
                )
                progress(end - start)
                return
            (data_crc,) = struct.unpack_from("<I", buf, data_end)
            data = bytes(view[pos + _HEADER : data_end])
            if data_crc != masked_crc(data):
                yield Record(
                    path,
                    index,
                    pos,
                    error=f"record data checksum fails ({length} bytes at byte {pos})",
                    kind="corrupt_record",
                )
            else:
                yield Record(path, index, pos, data=data)
            pos = data_end + _FOOTER
            index += 1
            progress(pos - start)
    finally:
        view.release()


def _resync(buf: Any, view: memoryview, pos: int) -> int:
    """Offset of the next sound frame header at or after `pos` (or the end of the buffer)."""
    end = len(buf)
    while pos + _HEADER <= end:
        (length,) = struct.unpack_from("<Q", buf, pos)
        if length <= end - pos - _HEADER - _FOOTER:
            (length_crc,) = struct.unpack_from("<I", buf, pos + 8)
            if length_crc == masked_crc(view[pos : pos + 8]):
                return pos
        pos += 1
    return end
