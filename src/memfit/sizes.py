"""Memory sizes: parse what people type (`"16GiB"`, `"1.5 GB"`, `512MiB`) and print bytes."""

from __future__ import annotations

import math
import re

from memfit.errors import SizeError

# Binary units are powers of 1024; SI units powers of 1000. A bare letter ("1.5G", "512M")
# means the binary unit, as in `docker --memory`, `java -Xmx` and nvidia-smi's "MiB" columns.
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_EXAMPLES = "for example 16GiB, 1.5 GB, 512MiB or a number of bytes"


def parse_size(value: str | int | float) -> int:
    """Parse a memory size into a positive number of bytes.

    Args:
        value: `"16GiB"`, `"16 GB"`, `"1.5G"`, `"512MiB"`, `"1e9"` or a number of bytes.
            `GiB`/`MiB`/`KiB` and the bare letters `G`/`M`/`K` are powers of 1024;
            `GB`/`MB`/`KB` are powers of 1000. Case does not matter.

    Returns:
        The size in bytes (rounded down to a whole byte).

    Raises:
        SizeError: the value is not a size, or is zero or negative.

    Example:
        >>> parse_size("1.5 GiB")
        1610612736
        >>> parse_size("2GB")
        2000000000
    """
    if isinstance(value, bool):
        raise SizeError(f"{value!r} is not a memory size; give one {_EXAMPLES}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
        text = repr(value)
    else:
        text = str(value)
        match = _SIZE_RE.match(text)
        if match is None:
            if text.strip().startswith("-"):
                raise SizeError(
                    f"memory size {text!r} is negative; give a positive size, {_EXAMPLES}"
                )
            raise SizeError(f"{text!r} is not a memory size; give one {_EXAMPLES}")
        number, unit = float(match.group(1)), match.group(2).lower()
        if unit not in _UNITS:
            raise SizeError(
                f"unknown unit {match.group(2)!r} in memory size {text!r}; use B, KiB, MiB, GiB, "
                f"TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)"
            )
    if not math.isfinite(number):
        raise SizeError(f"{text!r} is not a memory size; give one {_EXAMPLES}")
    size = int(number * _UNITS[unit])
    if number < 0:
        raise SizeError(f"memory size {text!r} is negative; give a positive size, {_EXAMPLES}")
    if size <= 0:
        raise SizeError(f"memory size {text!r} is zero; give a positive size, {_EXAMPLES}")
    return size


def format_size(num_bytes: int | float | None, precision: int = 2) -> str:
    """Format bytes in binary units for people: `1.50 GiB`, `512.00 MiB`, `300 B`.

    Args:
        num_bytes: a number of bytes; `None` gives `"n/a"`.
        precision: digits after the decimal point for KiB and larger.

    Example:
        >>> format_size(1610612736)
        '1.50 GiB'
    """
    if num_bytes is None:
        return "n/a"
    sign = "-" if num_bytes < 0 else ""
    value = float(abs(num_bytes))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.{precision}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
