"""The report page of a `memfit.Watch` log: per fit its findings, summary, plots, configuration.

Findings come first (they are what a reader came for), then the summary, the memory, step
time and loss plots (`memfit.report.svg`), the run's configuration, what was alive at any
measured peak, and the estimate against the measured peak.

Example:
    ```python
    write_html(load_log("run.jsonl"), "run.html")
    ```
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from memfit.errors import MemfitError
from memfit.report.explanation import explanation_html
from memfit.report.markup import CSS, escape, is_number, kv_table, size_text
from memfit.report.svg import svg_plot
from memfit.sizes import format_size
from memfit.watch.findings import KINDS
from memfit.watch.log import Run

MIB = 1024 * 1024


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
    e = escape
    runs = [runs] if isinstance(runs, Run) else list(runs)
    if not runs:
        raise MemfitError("the log holds no run to report")
    first = runs[0]
    parts: list[str] = []
    add = parts.append
    add("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>")
    add("<meta name='viewport' content='width=device-width, initial-scale=1'>")
    add(f"<title>memfit report: {e(first.name)}</title>")
    add(f"<style>{CSS}</style></head><body>")
    add(f"<h1>memfit report: <span class='name'>{e(first.name)}</span></h1>")
    if len(runs) > 1:
        add(f"<p class='sub'>{len(runs)} fits watched by one memfit.Watch, in order.</p>")
        rows = []
        for run in runs:
            s = run.summary()
            rows.append(
                f"<tr><td><a href='#fit-{run.index + 1}'>fit {run.index + 1}</a></td>"
                f"<td>{e(run.name)}</td><td>{s['steps']}</td><td>{e(size_text(s['peak_bytes']))}</td>"
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
    e = escape
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
    add(kv_table(_summary_rows(summary)))

    mem_series = []
    if any(is_number(s.get("memory_peak_bytes")) for s in steps):
        mem_series.append(("peak", "#d62728", x, [_mib(s.get("memory_peak_bytes")) for s in steps]))
    if any(is_number(s.get("memory_current_bytes")) for s in steps):
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
        if is_number(header.get("budget_bytes")):
            hlines.append((header["budget_bytes"] / MIB, "budget", "#000000"))
        if is_number(header.get("estimate_peak_bytes")):
            hlines.append((header["estimate_peak_bytes"] / MIB, "estimate", "#9467bd"))
        add(
            svg_plot(
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
    if any(is_number(s.get("input_wait_seconds")) for s in steps):
        time_series.append(
            ("waiting for input", "#ff7f0e", x, [_ms(s.get("input_wait_seconds")) for s in steps])
        )
    add(svg_plot("time" + suffix, time_series, "ms", epochs=epoch_marks, robust=True))

    losses = [_loss(s.get("loss")) for s in steps]
    if any(v is not None for v in losses):
        add("<h2>Loss</h2>")
        marks = [
            (float(f["step"]), f["kind"])
            for f in run.findings
            if f.get("kind") in ("divergence", "non_finite_loss")
        ]
        add(
            svg_plot(
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
            size_text(header.get("budget_bytes"))
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
    add(kv_table(config_rows))
    for explanation in run.explanations:
        add(explanation_html(explanation))
    if is_number(header.get("estimate_peak_bytes")):
        add("<h2>Estimate vs measured</h2>")
        peak = summary["peak_bytes"]
        rows = [
            ("estimated peak", size_text(header["estimate_peak_bytes"])),
            ("measured peak", size_text(peak)),
        ]
        if summary["estimate_error_fraction"] is not None:
            rows.append(("estimate error", f"{100 * summary['estimate_error_fraction']:+.1f}%"))
        add(kv_table(rows))
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
    e = escape
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
    rows.append(("peak memory", size_text(summary["peak_bytes"])))
    rows.append(("budget", size_text(summary["budget_bytes"])))
    if summary["peak_bytes"] and summary["budget_bytes"]:
        rows.append(
            ("peak / budget", f"{100 * summary['peak_bytes'] / summary['budget_bytes']:.1f}%")
        )
    if is_number(summary.get("watch_overhead_fraction")):
        rows.append(
            (
                "memfit.Watch's own time",
                f"{100 * summary['watch_overhead_fraction']:.2f}% of step time",
            )
        )
    rows.append(("findings", summary["findings"]))
    return rows


def _mib(value: Any) -> float | None:
    return value / MIB if is_number(value) else None


def _ms(value: Any) -> float | None:
    return 1000 * value if is_number(value) else None


def _loss(value: Any) -> float | None:
    return float(value) if is_number(value) else None


def _evidence_value(key: str, value: Any) -> str:
    if key.endswith("_bytes") and is_number(value):
        return f"{format_size(int(value))} ({int(value)} bytes)"
    if key.endswith("_fraction") and is_number(value):
        return f"{100 * value:.1f}%"
    if key.endswith("_seconds") and is_number(value):
        return f"{1000 * value:.2f} ms" if value < 1 else f"{value:.2f} s"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
