"""Robust statistics the detectors share: medians, spreads, slopes and trends that noise does
not move, and a shape's text.

Noise: thresholds compare a change with the series' own spread, measured robustly as the
median absolute deviation (MAD, scaled by 1.4826 to match a standard deviation for normal
noise), so a noisy but healthy run stays quiet and a clean run's real change is still found.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# MAD * 1.4826 estimates the standard deviation of normal noise.
MAD_SCALE = 1.4826


def median(values: Sequence[float]) -> float:
    """The median of `values` (NaN when empty)."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return math.nan
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def robust_spread(values: Sequence[float]) -> float:
    """The median absolute deviation of `values`, scaled to a standard deviation."""
    if len(values) < 2:
        return 0.0
    centre = median(values)
    return MAD_SCALE * median([abs(v - centre) for v in values])


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The median of pairwise slopes: a line's slope that outliers do not move."""
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs))
        for j in range(i + 1, len(xs))
        if xs[j] != xs[i]
    ]
    return median(slopes) if slopes else 0.0


def mann_kendall(values: Sequence[float]) -> float:
    """Mann-Kendall's z for a monotonic trend in `values` (about N(0, 1) for pure noise)."""
    n = len(values)
    if n < 3:
        return 0.0
    x = np.asarray(values, dtype=float)
    s = float(np.triu(np.sign(x[None, :] - x[:, None]), k=1).sum())
    variance = n * (n - 1) * (2 * n + 5) / 18
    return (s - float(np.sign(s))) / math.sqrt(variance)


def shape_text(shape: Sequence[Any] | None) -> str:
    """`[16, 256, 256, 3]` -> `16x256x256x3`."""
    return "x".join("?" if d is None else str(d) for d in shape) if shape else "?"
