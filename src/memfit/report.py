"""Report: a `memfit.Watch` log as one self-contained HTML page, a terminal summary, or JSON.

The page has no scripts and fetches nothing: the plots are inline SVG drawn here, the styles
inline CSS. Every value that comes from the log (run and model names, messages) is escaped.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from memfit.errors import MemfitError
from memfit.sizes import format_size
from memfit.watch.findings import KINDS
from memfit.watch.log import Run, read_log

MIB = 1024 * 1024
MAX_POINTS = 1500  # per line in a plot; longer series are reduced to min/max per bucket

__all__ = [
    "Run",
    "build_html",
    "build_measure_html",
    "load_log",
    "load_measurements",
    "log_to_dict",
    "write_html",
]


def load_log(path: str | os.PathLike[str]) -> list[Run]:
    """Read a `memfit.Watch` JSON-lines log: one `Run` per fit it watched.

    A `MemfitError` says what is wrong with the file (missing, empty, cut off, no header).

    Args:
        path: the file `Watch(log_path=...)` wrote.

    Example:
        ```python
        runs = load_log("run.jsonl")
        print([run.summary()["peak_bytes"] for run in runs])
        ```
    """
    return read_log(path)


def log_to_dict(runs: Sequence[Run]) -> dict[str, Any]:
    """What `memfit report --json` prints: the whole log, and each fit in `runs`.

    `header` is the first fit's; `summary` covers every fit (steps added up, the highest
    peak); `findings` are all of them, each with its fit's index in `run`.
    """
    summaries = [run.summary() for run in runs]
    peaks = [s["peak_bytes"] for s in summaries if s["peak_bytes"]]
    first = summaries[0]
    summary = {
        **first,
        "fits": len(runs),
        "steps": sum(s["steps"] for s in summaries),
        "epochs": sum(s["epochs"] for s in summaries),
        "finished": all(s["finished"] for s in summaries),
        "peak_bytes": max(peaks) if peaks else None,
        "findings": sum(s["findings"] for s in summaries),
    }
    if len(runs) > 1:
        for key in ("mean_step_seconds", "input_wait_fraction", "estimate_error_fraction"):
            summary[key] = None  # per fit: see runs
    return {
        "log_path": runs[0].path,
        "header": runs[0].header,
        "summary": summary,
        "findings": [{**f, "run": run.index} for run in runs for f in run.findings],
        "runs": [run.to_dict() for run in runs],
    }


def load_measurements(path: str | os.PathLike[str]) -> list[dict[str, Any]] | None:
    """The measurements of a `memfit measure --json` file; None when `path` is not one.

    Such a file is one JSON object (a measurement, or `{"measurements": [...]}`); a watch
    log is JSON lines. With `--explain`, each measurement holds its `explanation`.

    Args:
        path: the file `memfit measure ... --json > FILE` wrote.

    Example:
        ```python
        found = load_measurements("measure.json")
        ```
    """
    try:
        with open(os.fspath(path), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(data, dict) and isinstance(data.get("measurements"), list):
        data = data["measurements"]
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(m, dict) and "peak_bytes" in m for m in items):
        return None
    return items


def build_measure_html(measurements: Sequence[dict[str, Any]], name: str) -> str:
    """A page for `memfit measure --json` output: each batch, and what was alive at its peak.

    Args:
        measurements: what `load_measurements` read.
        name: what was measured (shown as the title).

    Example:
        ```python
        page = build_measure_html(load_measurements("measure.json"), "MobileNetV2")
        ```
    """
    e = _esc
    parts = [
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>",
        f"<title>memfit measure: {e(name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>memfit measure: <span class='name'>{e(name)}</span></h1>",
    ]
    for m in measurements:
        parts.append(f"<h2>Batch {e(m.get('batch_size'))}</h2>")
        parts.append(
            _table(
                [
                    ("peak", "out of memory" if m.get("oom") else _size(m.get("peak_bytes"))),
                    ("resident before the step", _size(m.get("resident_bytes"))),
                    ("device", m.get("device")),
                ]
            )
        )
        if m.get("explanation"):
            parts.append(explanation_html(m["explanation"]))
        else:
            parts.append("<p class='note'>Measured without --explain: no live set.</p>")
    parts.append("<p class='foot'>Written by memfit report from memfit measure --json.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def explanation_html(explanation: dict[str, Any], top: int = 15) -> str:
    """What was alive at a measured peak (`Explanation.to_dict()`), beside the estimate."""
    e = _esc
    estimate = explanation.get("estimate") or {}
    breakdown = estimate.get("breakdown") or {}
    listed = explanation.get("listed_bytes") or 0
    out = [
        "<h3>What was alive at the peak</h3>",
        f"<p class='sub'>{e(_size(listed))} listed, measured peak "
        f"{e(_size(explanation.get('measured_peak_bytes')))}; "
        f"{e(explanation.get('tensors'))} tensors made by the step besides resident state; "
        f"the peak came at {e(explanation.get('peak_op'))}</p>",
        "<table><tr><th>kind</th><th>measured</th><th>estimate</th></tr>",
    ]
    for key, nbytes in (explanation.get("by_kind") or {}).items():
        guess = breakdown.get(key)
        if nbytes or guess:
            out.append(
                f"<tr><td>{e(key[: -len('_bytes')].replace('_', ' '))}</td>"
                f"<td>{e(_size(nbytes))}</td><td>{e(_size(guess))}</td></tr>"
            )
    out.append(
        f"<tr><th>total</th><th>{e(_size(listed))}</th>"
        f"<th>{e(_size(estimate.get('peak_bytes')))}</th></tr></table>"
    )
    guesses = {row["layer"]: row.get("bytes") for row in estimate.get("per_layer") or []}
    out.append("<table><tr><th>layer</th><th>measured</th><th>estimate</th></tr>")
    rows = explanation.get("per_layer") or []
    for row in rows[:top]:
        out.append(
            f"<tr><td>{e(row['layer'])}</td><td>{e(_size(row['bytes']))}</td>"
            f"<td>{e(_size(guesses.get(row['layer'])))}</td></tr>"
        )
    if len(rows) > top:
        rest = sum(r["bytes"] for r in rows[top:])
        out.append(f"<tr><td>({len(rows) - top} more)</td><td>{e(_size(rest))}</td><td></td></tr>")
    out.append("</table>")
    out.append(
        "<table><tr><th>size</th><th>kind</th><th>layer</th><th>shape</th><th>dtype</th>"
        "<th>made by</th></tr>"
    )
    for row in explanation.get("largest") or []:
        shape = "x".join(str(d) for d in row.get("shape") or []) or "-"
        out.append(
            f"<tr><td>{e(_size(row['bytes']))}</td><td>{e(row['kind'])}</td>"
            f"<td>{e(row['layer'])}</td><td>{e(shape)}</td><td>{e(row.get('dtype'))}</td>"
            f"<td>{e(row['op'])}</td></tr>"
        )
    out.append("</table>")
    agreement = explanation.get("top_layers")
    if agreement:
        out.append(
            f"<p>Top layers measured: {e(', '.join(agreement['measured']))}; estimated: "
            f"{e(', '.join(agreement['estimated']))} ({e(agreement['common'])} shared).</p>"
        )
    for note in explanation.get("notes") or []:
        out.append(f"<p class='note'>{e(note)}</p>")
    return "\n".join(out)


# -- HTML -------------------------------------------------------------------------------------
def build_html(runs: Run | Sequence[Run]) -> str:
    """The whole report page as one string (no scripts, no external resources).

    Args:
        runs: the fits of one log (`load_log`), or one `Run`; each fit gets its own
            section (findings, summary, plots, configuration).

    Example:
        ```python
        page = build_html(load_log("run.jsonl"))
        ```
    """
    e = _esc
    runs = [runs] if isinstance(runs, Run) else list(runs)
    if not runs:
        raise MemfitError("the log holds no run to report")
    first = runs[0]
    parts: list[str] = []
    add = parts.append
    add("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>")
    add("<meta name='viewport' content='width=device-width, initial-scale=1'>")
    add(f"<title>memfit report: {e(first.name)}</title>")
    add(f"<style>{_CSS}</style></head><body>")
    add(f"<h1>memfit report: <span class='name'>{e(first.name)}</span></h1>")
    if len(runs) > 1:
        add(f"<p class='sub'>{len(runs)} fits watched by one memfit.Watch, in order.</p>")
        rows = []
        for run in runs:
            s = run.summary()
            rows.append(
                f"<tr><td><a href='#fit-{run.index + 1}'>fit {run.index + 1}</a></td>"
                f"<td>{e(run.name)}</td><td>{s['steps']}</td><td>{e(_size(s['peak_bytes']))}</td>"
                f"<td>{s['findings']}</td><td>{'yes' if s['finished'] else 'no'}</td></tr>"
            )
        add(
            "<table class='fits'><tr><th>fit</th><th>name</th><th>steps</th><th>peak</th>"
            "<th>findings</th><th>finished</th></tr>" + "".join(rows) + "</table>"
        )
    for run in runs:
        _run_html(run, add, several=len(runs) > 1)
    add("<p class='foot'>Written by memfit report from a memfit.Watch log.</p></body></html>")
    return "\n".join(parts)


def _run_html(run: Run, add: Any, several: bool) -> None:
    """One fit's section: findings, summary, memory / time / loss plots, configuration."""
    e = _esc
    summary = run.summary()
    header = run.header
    steps = run.steps
    suffix = f"-{run.index + 1}" if run.index else ""
    x = [float(s["step"]) for s in steps]
    epoch_marks = [(float(ep["step"]), f"epoch {ep['epoch'] + 1}") for ep in run.epochs[:-1]]
    event_marks = [
        (float(f["step"]), f["kind"])
        for f in run.findings
        if f.get("kind") in ("oom", "oom_recovery", "memory_growth", "near_budget", "thrashing")
    ]
    add(f"<section class='fit' id='fit-{run.index + 1}'>")
    if several:
        add(f"<h2 class='fit'>Fit {run.index + 1}: <span class='name'>{e(run.name)}</span></h2>")
    state = "finished" if summary["finished"] else "did not finish (no end line)"
    add(
        f"<p class='sub'>{e(header.get('started') or '')} &middot; {e(header.get('device'))} "
        f"&middot; {summary['steps']} steps, {summary['epochs']} epochs, {e(state)}</p>"
    )

    # Findings first: they are what a reader came for.
    add("<h2>Findings</h2>")
    if not run.findings:
        add("<p class='ok'>No findings: memory, input and loss looked healthy.</p>")
    order = {k: i for i, k in enumerate(KINDS)}
    for f in sorted(run.findings, key=lambda f: (order.get(f.get("kind"), 99), f.get("step", 0))):
        add(_finding_html(f))

    add("<h2>Summary</h2>")
    add(_table(_summary_rows(summary)))

    mem_series = []
    if any(_num(s.get("memory_peak_bytes")) for s in steps):
        mem_series.append(("peak", "#d62728", x, [_mib(s.get("memory_peak_bytes")) for s in steps]))
    if any(_num(s.get("memory_current_bytes")) for s in steps):
        mem_series.append(
            (
                "in use after step",
                "#1f77b4",
                x,
                [_mib(s.get("memory_current_bytes")) for s in steps],
            )
        )
    add("<h2>Memory</h2>")
    if mem_series:
        hlines = []
        if _num(header.get("budget_bytes")):
            hlines.append((header["budget_bytes"] / MIB, "budget", "#000000"))
        if _num(header.get("estimate_peak_bytes")):
            hlines.append((header["estimate_peak_bytes"] / MIB, "estimate", "#9467bd"))
        add(
            _svg_plot(
                "memory" + suffix,
                mem_series,
                "MiB",
                hlines=hlines,
                marks=event_marks,
                epochs=epoch_marks,
            )
        )
    else:
        add(
            "<p class='note'>No memory statistics in this run (on CPU they need memfit's "
            "emulated budget: <code>MEMFIT_MEMORY=4GiB</code> or <code>memfit.emulate</code>)."
            "</p>"
        )

    add("<h2>Step time and input wait</h2>")
    time_series = [("step", "#2ca02c", x, [_ms(s.get("step_seconds")) for s in steps])]
    if any(_num(s.get("input_wait_seconds")) for s in steps):
        time_series.append(
            ("waiting for input", "#ff7f0e", x, [_ms(s.get("input_wait_seconds")) for s in steps])
        )
    add(_svg_plot("time" + suffix, time_series, "ms", epochs=epoch_marks, robust=True))

    losses = [_loss(s.get("loss")) for s in steps]
    if any(v is not None for v in losses):
        add("<h2>Loss</h2>")
        marks = [
            (float(f["step"]), f["kind"])
            for f in run.findings
            if f.get("kind") in ("divergence", "non_finite_loss")
        ]
        add(
            _svg_plot(
                "loss" + suffix,
                [("loss", "#8c564b", x, losses)],
                "loss",
                marks=marks,
                epochs=epoch_marks,
                log_scale=True,
            )
        )

    add("<h2>Run configuration</h2>")
    config_rows = [
        ("name", header.get("name")),
        ("model", header.get("model")),
        ("device", header.get("device")),
        (
            "budget",
            _size(header.get("budget_bytes"))
            + (f" ({header['budget_name']})" if header.get("budget_name") else ""),
        ),
        ("batch size", next((s.get("batch_size") for s in steps if s.get("batch_size")), None)),
    ]
    for key, value in sorted((header.get("config") or {}).items()):
        config_rows.append((key.replace("_", " "), value))
    if run.end and run.end.get("micro_batches"):
        config_rows.append(("micro-batches per input shape (K)", run.end["micro_batches"]))
    config_rows += [
        ("TensorFlow / Keras", f"{header.get('tensorflow')} / {header.get('keras')}"),
        ("input wait measured", header.get("input_wait_measured")),
        ("log", run.path),
    ]
    add(_table(config_rows))
    for explanation in run.explanations:
        add(explanation_html(explanation))
    if _num(header.get("estimate_peak_bytes")):
        add("<h2>Estimate vs measured</h2>")
        peak = summary["peak_bytes"]
        rows = [
            ("estimated peak", _size(header["estimate_peak_bytes"])),
            ("measured peak", _size(peak)),
        ]
        if summary["estimate_error_fraction"] is not None:
            rows.append(("estimate error", f"{100 * summary['estimate_error_fraction']:+.1f}%"))
        add(_table(rows))
    add("</section>")


def write_html(runs: Run | Sequence[Run], out: str | os.PathLike[str]) -> str:
    """Write the report page of `runs` (a log's fits, or one run) to `out`; returns the path."""
    out = os.fspath(out)
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise MemfitError(f"cannot write {out}: folder {directory} does not exist")
    try:
        with open(out, "w", encoding="utf-8") as handle:
            handle.write(build_html(runs))
    except OSError as exc:
        raise MemfitError(f"cannot write {out} ({exc.strerror}); choose another --out") from None
    return out


def _finding_html(f: dict[str, Any]) -> str:
    e = _esc
    severity = "problem" if f.get("severity") == "problem" else "warning"
    evidence = f.get("evidence") or {}
    rows = "".join(
        f"<tr><th>{e(k)}</th><td>{e(_evidence_value(k, v))}</td></tr>" for k, v in evidence.items()
    )
    epoch = f.get("epoch")
    where = f"step {f.get('step')}" + (f", epoch {epoch + 1}" if isinstance(epoch, int) else "")
    return (
        f"<div class='finding {severity}'><div class='kind'>{e(f.get('kind'))} "
        f"<span class='where'>{e(where)}</span></div>"
        f"<p>{e(f.get('message'))}</p>"
        f"<p><b>Cause:</b> {e(f.get('cause'))}</p>"
        f"<p><b>Fix:</b> {e(f.get('fix'))}</p>"
        + (f"<table class='evidence'>{rows}</table>" if rows else "")
        + "</div>"
    )


def _summary_rows(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [("steps", summary["steps"])]
    if summary["mean_step_seconds"]:
        rows.append(("mean step time", f"{1000 * summary['mean_step_seconds']:.1f} ms"))
    if summary["input_wait_fraction"] is not None:
        rows.append(
            ("waiting for input", f"{100 * summary['input_wait_fraction']:.1f}% of step time")
        )
    rows.append(("peak memory", _size(summary["peak_bytes"])))
    rows.append(("budget", _size(summary["budget_bytes"])))
    if summary["peak_bytes"] and summary["budget_bytes"]:
        rows.append(
            ("peak / budget", f"{100 * summary['peak_bytes'] / summary['budget_bytes']:.1f}%")
        )
    if _num(summary.get("watch_overhead_fraction")):
        rows.append(
            (
                "memfit.Watch's own time",
                f"{100 * summary['watch_overhead_fraction']:.2f}% of step time",
            )
        )
    rows.append(("findings", summary["findings"]))
    return rows


def _table(rows: list[tuple[str, Any]]) -> str:
    body = "".join(
        f"<tr><th>{_esc(k)}</th><td>{_esc('-' if v is None else v)}</td></tr>" for k, v in rows
    )
    return f"<table class='kv'>{body}</table>"


def _svg_plot(
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
        return f"<p class='note'>No {_esc(ident)} data.</p>"
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
        f"<svg id='plot-{_esc(ident)}' class='plot' xmlns='http://www.w3.org/2000/svg' "
        f"viewBox='0 0 {width} {height}' width='{width}' height='{height}' role='img' "
        f"aria-label='{_esc(ident)} plot'>",
        f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' fill='#fafafa' stroke='#ccc'/>",
    ]
    for i in range(5):  # y ticks
        frac = i / 4
        yv = y0 + frac * (y1 - y0)
        ypix = top + ph - frac * ph
        label = _fmt(10**yv if use_log else yv)
        out.append(
            f"<line x1='{left}' x2='{left + pw}' y1='{ypix:.1f}' y2='{ypix:.1f}' stroke='#e5e5e5'/>"
        )
        out.append(
            f"<text x='{left - 6}' y='{ypix + 4:.1f}' text-anchor='end'>{_esc(label)}</text>"
        )
    # x ticks: whole steps, each once (a short run gets one tick a step)
    span = int(math.ceil(x1 - x0))
    every = max(1, math.ceil(span / 5))
    for xv in range(int(math.ceil(x0)), int(math.floor(x1)) + 1, every):
        out.append(f"<text x='{px(xv):.1f}' y='{top + ph + 16}' text-anchor='middle'>{xv}</text>")
    out.append(f"<text x='{left + pw / 2}' y='{height - 4}' text-anchor='middle'>step</text>")
    out.append(
        f"<text x='14' y='{top + ph / 2}' transform='rotate(-90 14 {top + ph / 2})' "
        f"text-anchor='middle'>{_esc(unit)}{' (log)' if use_log else ''}</text>"
    )
    for xv, label in epochs or []:
        out.append(
            f"<line class='epoch' x1='{px(xv):.1f}' x2='{px(xv):.1f}' y1='{top}' "
            f"y2='{top + ph}' stroke='#bbb' stroke-dasharray='3 3'>"
            f"<title>{_esc(label)}</title></line>"
        )
    for value, label, color in hlines:
        ypix = py(value, clamp=False)
        out.append(
            f"<line class='hline' x1='{left}' x2='{left + pw}' y1='{ypix:.1f}' "
            f"y2='{ypix:.1f}' stroke='{color}' stroke-dasharray='6 4'/>"
        )
        out.append(
            f"<text x='{left + pw + 4}' y='{ypix + 4:.1f}' fill='{color}'>"
            f"{_esc(label)} {_esc(_fmt(value))}</text>"
        )
    for i, (value, label, color) in enumerate(off_scale):
        out.append(
            f"<text x='{left + pw + 4}' y='{top + ph - 4 - 14 * i}' fill='{color}'>"
            f"{_esc(label)} {_esc(_fmt(value))} (above)</text>"
        )
    for xv, label in marks or []:
        out.append(
            f"<line class='mark' x1='{px(xv):.1f}' x2='{px(xv):.1f}' y1='{top}' "
            f"y2='{top + ph}' stroke='#d62728' stroke-width='2'>"
            f"<title>{_esc(label)} at step {int(xv)}</title></line>"
        )
        # Mid-height: clear of budget labels (top) and the legend (bottom).
        out.append(
            f"<text x='{px(xv) + 3:.1f}' y='{top + ph / 2:.1f}' fill='#d62728'>{_esc(label)}</text>"
        )
    # The legend sits at the bottom of the right margin, clear of the reference lines'
    # labels, which are mostly budgets near the top.
    legend_y = top + ph - 16 * len(series) - 40
    for label, color, xs, ys in series:
        pts = _reduce([(xv, yv) for xv, yv in zip(xs, ys, strict=False) if yv is not None])
        if not pts:
            continue
        coords = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in pts)
        out.append(
            f"<polyline class='series' fill='none' stroke='{color}' stroke-width='1.5' "
            f"points='{coords}'><title>{_esc(label)}</title></polyline>"
        )
        out.append(
            f"<rect x='{left + pw + 6}' y='{legend_y + 40}' width='12' height='3' "
            f"fill='{color}'/><text x='{left + pw + 22}' y='{legend_y + 45}'>"
            f"{_esc(label)}</text>"
        )
        legend_y += 16
    out.append("</svg>")
    return "".join(out)


def _reduce(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
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


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1000px;color:#222;padding:0 12px}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.15em;margin-top:28px;
border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;margin-top:0}.ok{color:#2a7d2a}.note{color:#666}.foot{color:#999;
font-size:.85em;margin-top:32px}
table{border-collapse:collapse;font-size:.92em}th{text-align:left;font-weight:600;
padding:3px 14px 3px 0;color:#444;vertical-align:top}td{padding:3px 0}
.finding{border-left:5px solid #e0a800;background:#fffbea;padding:8px 14px;margin:10px 0}
.finding.problem{border-color:#c62828;background:#fdecea}
.finding .kind{font-weight:700;font-family:monospace;font-size:1.05em}
.finding .where{font-weight:400;color:#666;margin-left:8px;font-family:system-ui,sans-serif}
.finding p{margin:6px 0}.evidence{font-family:monospace;font-size:.85em}
svg.plot{max-width:100%;height:auto;font-size:11px;font-family:system-ui,sans-serif}
code{background:#f2f2f2;padding:1px 4px}
"""


# -- helpers ----------------------------------------------------------------------------------
def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _mib(value: Any) -> float | None:
    return value / MIB if _num(value) else None


def _ms(value: Any) -> float | None:
    return 1000 * value if _num(value) else None


def _loss(value: Any) -> float | None:
    return float(value) if _num(value) else None


def _size(value: Any) -> str:
    return format_size(int(value)) if _num(value) else "-"


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.2g}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _evidence_value(key: str, value: Any) -> str:
    if key.endswith("_bytes") and _num(value):
        return f"{format_size(int(value))} ({int(value)} bytes)"
    if key.endswith("_fraction") and _num(value):
        return f"{100 * value:.1f}%"
    if key.endswith("_seconds") and _num(value):
        return f"{1000 * value:.2f} ms" if value < 1 else f"{value:.2f} s"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
