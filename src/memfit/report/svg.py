"""Line plots as inline SVG for the report: series, reference lines, event and epoch marks.

No scripts and no plotting library: the page stays self-contained. A series longer than
`MAX_POINTS` is reduced to each bucket's minimum and maximum, so spikes stay visible.

Example:
    ```python
    svg_plot("memory", [("peak", "#d62728", [0.0, 1.0], [512.0, 520.0])], "MiB")
    ```
"""

from __future__ import annotations

import math

from memfit.report.markup import escape, short_number

MAX_POINTS = 1500  # per line in a plot; longer series are reduced to min/max per bucket


def svg_plot(
    ident: str,
    series: list[tuple[str, str, list[float], list[float | None]]],
    unit: str,
    *,
    hlines: list[tuple[float, str, str]] | None = None,
    marks: list[tuple[float, str]] | None = None,
    epochs: list[tuple[float, str]] | None = None,
    log_scale: bool = False,
    robust: bool = False,
) -> str:
    """A line plot as inline SVG: lines, horizontal reference lines, vertical event marks."""
    width, height = 960, 280
    left, right, top, bottom = 70, 150, 14, 36
    pw, ph = width - left - right, height - top - bottom
    hlines = hlines or []
    points = [
        (xv, yv)
        for _, _, xs, ys in series
        for xv, yv in zip(xs, ys, strict=False)
        if yv is not None
    ]
    if not points:
        return f"<p class='note'>No {escape(ident)} data.</p>"
    xs_all = [p[0] for p in points]
    data_max = max(p[1] for p in points)
    if robust and len(points) > 20:  # a first step that traced would flatten the rest
        data_max = sorted(p[1] for p in points)[int(0.98 * (len(points) - 1))] * 1.25
    off_scale = [h for h in hlines if h[0] > 2 * data_max]
    hlines = [h for h in hlines if h not in off_scale]
    ys_all = [min(p[1], data_max) for p in points] + [h[0] for h in hlines]
    positive = [v for v in ys_all if v > 0]
    use_log = bool(
        log_scale
        and positive
        and len(positive) == len(ys_all)
        and max(positive) / min(positive) > 100
    )

    def ty(v: float) -> float:
        return math.log10(v) if use_log else v

    x0, x1 = min(xs_all), max(xs_all)
    if x1 <= x0:
        x1 = x0 + 1
    y_values = [ty(v) for v in ys_all]
    y0, y1 = (min(y_values), max(y_values)) if use_log else (min(0.0, min(y_values)), max(y_values))
    if y1 <= y0:
        y1 = y0 + 1
    y1 += 0.05 * (y1 - y0)

    def px(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw

    def py(v: float, clamp: bool = True) -> float:
        # Data points above a robust maximum are drawn at it; reference lines never are.
        v = min(v, data_max) if clamp and v > 0 else v
        return top + ph - (ty(v) - y0) / (y1 - y0) * ph

    out = [
        f"<svg id='plot-{escape(ident)}' class='plot' xmlns='http://www.w3.org/2000/svg' "
        f"viewBox='0 0 {width} {height}' width='{width}' height='{height}' role='img' "
        f"aria-label='{escape(ident)} plot'>",
        f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' fill='#fafafa' stroke='#ccc'/>",
    ]
    for i in range(5):  # y ticks
        frac = i / 4
        yv = y0 + frac * (y1 - y0)
        ypix = top + ph - frac * ph
        label = short_number(10**yv if use_log else yv)
        out.append(
            f"<line x1='{left}' x2='{left + pw}' y1='{ypix:.1f}' y2='{ypix:.1f}' stroke='#e5e5e5'/>"
        )
        out.append(
            f"<text x='{left - 6}' y='{ypix + 4:.1f}' text-anchor='end'>{escape(label)}</text>"
        )
    # x ticks: whole steps, each once (a short run gets one tick a step)
    span = int(math.ceil(x1 - x0))
    every = max(1, math.ceil(span / 5))
    for xv in range(int(math.ceil(x0)), int(math.floor(x1)) + 1, every):
        out.append(f"<text x='{px(xv):.1f}' y='{top + ph + 16}' text-anchor='middle'>{xv}</text>")
    out.append(f"<text x='{left + pw / 2}' y='{height - 4}' text-anchor='middle'>step</text>")
    out.append(
        f"<text x='14' y='{top + ph / 2}' transform='rotate(-90 14 {top + ph / 2})' "
        f"text-anchor='middle'>{escape(unit)}{' (log)' if use_log else ''}</text>"
    )
    for xv, label in epochs or []:
        out.append(
            f"<line class='epoch' x1='{px(xv):.1f}' x2='{px(xv):.1f}' y1='{top}' "
            f"y2='{top + ph}' stroke='#bbb' stroke-dasharray='3 3'>"
            f"<title>{escape(label)}</title></line>"
        )
    for value, label, color in hlines:
        ypix = py(value, clamp=False)
        out.append(
            f"<line class='hline' x1='{left}' x2='{left + pw}' y1='{ypix:.1f}' "
            f"y2='{ypix:.1f}' stroke='{color}' stroke-dasharray='6 4'/>"
        )
        out.append(
            f"<text x='{left + pw + 4}' y='{ypix + 4:.1f}' fill='{color}'>"
            f"{escape(label)} {escape(short_number(value))}</text>"
        )
    for i, (value, label, color) in enumerate(off_scale):
        out.append(
            f"<text x='{left + pw + 4}' y='{top + ph - 4 - 14 * i}' fill='{color}'>"
            f"{escape(label)} {escape(short_number(value))} (above)</text>"
        )
    for xv, label in marks or []:
        out.append(
            f"<line class='mark' x1='{px(xv):.1f}' x2='{px(xv):.1f}' y1='{top}' "
            f"y2='{top + ph}' stroke='#d62728' stroke-width='2'>"
            f"<title>{escape(label)} at step {int(xv)}</title></line>"
        )
        # Mid-height: clear of budget labels (top) and the legend (bottom).
        out.append(
            f"<text x='{px(xv) + 3:.1f}' y='{top + ph / 2:.1f}' fill='#d62728'>"
            f"{escape(label)}</text>"
        )
    # The legend sits at the bottom of the right margin, clear of the reference lines'
    # labels, which are mostly budgets near the top.
    legend_y = top + ph - 16 * len(series) - 40
    for label, color, xs, ys in series:
        pts = reduce_points([(xv, yv) for xv, yv in zip(xs, ys, strict=False) if yv is not None])
        if not pts:
            continue
        coords = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in pts)
        out.append(
            f"<polyline class='series' fill='none' stroke='{color}' stroke-width='1.5' "
            f"points='{coords}'><title>{escape(label)}</title></polyline>"
        )
        out.append(
            f"<rect x='{left + pw + 6}' y='{legend_y + 40}' width='12' height='3' "
            f"fill='{color}'/><text x='{left + pw + 22}' y='{legend_y + 45}'>"
            f"{escape(label)}</text>"
        )
        legend_y += 16
    out.append("</svg>")
    return "".join(out)


def reduce_points(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """At most MAX_POINTS points: each bucket keeps its minimum and maximum, in order."""
    if len(points) <= MAX_POINTS:
        return points
    size = math.ceil(len(points) / (MAX_POINTS // 2))
    out = []
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        lo = min(bucket, key=lambda p: p[1])
        hi = max(bucket, key=lambda p: p[1])
        out.extend(sorted({lo, hi}))
    return out
