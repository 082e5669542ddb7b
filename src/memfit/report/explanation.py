"""What was alive at a measured peak, as HTML, and the page of `memfit measure --json` output.

`memfit measure --explain --json` writes each measurement with its `explanation`
(`memfit.measuring.explain.Explanation.to_dict()`): the live tensors at the peak by kind and by
layer, beside the estimate. A watch log may hold such explanations too (`explain` lines).

Example:
    ```python
    page = build_measure_html(load_measurements("measure.json"), "MobileNetV2")
    ```
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.report.markup import CSS, escape, kv_table, size_text


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
    e = escape
    parts = [
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>",
        f"<title>memfit measure: {e(name)}</title><style>{CSS}</style></head><body>",
        f"<h1>memfit measure: <span class='name'>{e(name)}</span></h1>",
    ]
    for m in measurements:
        parts.append(f"<h2>Batch {e(m.get('batch_size'))}</h2>")
        parts.append(
            kv_table(
                [
                    ("peak", "out of memory" if m.get("oom") else size_text(m.get("peak_bytes"))),
                    ("resident before the step", size_text(m.get("resident_bytes"))),
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
    e = escape
    estimate = explanation.get("estimate") or {}
    breakdown = estimate.get("breakdown") or {}
    listed = explanation.get("listed_bytes") or 0
    out = [
        "<h3>What was alive at the peak</h3>",
        f"<p class='sub'>{e(size_text(listed))} listed, measured peak "
        f"{e(size_text(explanation.get('measured_peak_bytes')))}; "
        f"{e(explanation.get('tensors'))} tensors made by the step besides resident state; "
        f"the peak came at {e(explanation.get('peak_op'))}</p>",
        "<table><tr><th>kind</th><th>measured</th><th>estimate</th></tr>",
    ]
    for key, nbytes in (explanation.get("by_kind") or {}).items():
        guess = breakdown.get(key)
        if nbytes or guess:
            out.append(
                f"<tr><td>{e(key[: -len('_bytes')].replace('_', ' '))}</td>"
                f"<td>{e(size_text(nbytes))}</td><td>{e(size_text(guess))}</td></tr>"
            )
    out.append(
        f"<tr><th>total</th><th>{e(size_text(listed))}</th>"
        f"<th>{e(size_text(estimate.get('peak_bytes')))}</th></tr></table>"
    )
    guesses = {row["layer"]: row.get("bytes") for row in estimate.get("per_layer") or []}
    out.append("<table><tr><th>layer</th><th>measured</th><th>estimate</th></tr>")
    rows = explanation.get("per_layer") or []
    for row in rows[:top]:
        out.append(
            f"<tr><td>{e(row['layer'])}</td><td>{e(size_text(row['bytes']))}</td>"
            f"<td>{e(size_text(guesses.get(row['layer'])))}</td></tr>"
        )
    if len(rows) > top:
        rest = sum(r["bytes"] for r in rows[top:])
        out.append(
            f"<tr><td>({len(rows) - top} more)</td><td>{e(size_text(rest))}</td><td></td></tr>"
        )
    out.append("</table>")
    out.append(
        "<table><tr><th>size</th><th>kind</th><th>layer</th><th>shape</th><th>dtype</th>"
        "<th>made by</th></tr>"
    )
    for row in explanation.get("largest") or []:
        shape = "x".join(str(d) for d in row.get("shape") or []) or "-"
        out.append(
            f"<tr><td>{e(size_text(row['bytes']))}</td><td>{e(row['kind'])}</td>"
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
