"""HTML building blocks of the report pages: escaping, numbers and sizes as text, tables, CSS.

Every value that comes from a log or a measurement goes through `escape` before it reaches a
page.

Example:
    ```python
    kv_table([("peak", size_text(3 * 2**30)), ("name", "<b>model</b>")])
    ```
"""

from __future__ import annotations

import html
import math
from typing import Any

from memfit.sizes import format_size


def escape(value: Any) -> str:
    """`value` as text safe in HTML text and in quoted attributes."""
    return html.escape(str(value), quote=True)


def is_number(value: Any) -> bool:
    """Whether `value` is a finite int or float (not a bool, not NaN or infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def size_text(value: Any) -> str:
    """A size in bytes as text (`"1.5 GiB"`), or `"-"` when it is not a number."""
    return format_size(int(value)) if is_number(value) else "-"


def short_number(value: float) -> str:
    """A number in a few characters, for plot ticks and labels (`"0"`, `"12.5"`, `"3e+06"`)."""
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


def kv_table(rows: list[tuple[str, Any]]) -> str:
    """A two-column table of `(label, value)` rows, escaped; None shows as `"-"`."""
    body = "".join(
        f"<tr><th>{escape(k)}</th><td>{escape('-' if v is None else v)}</td></tr>" for k, v in rows
    )
    return f"<table class='kv'>{body}</table>"


# The pages' one style sheet (inline: a page fetches nothing).
CSS = """
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
