"""Report: a `memfit.Watch` log as one self-contained HTML page, a terminal summary, or JSON.

The page has no scripts and fetches nothing: the plots are inline SVG drawn here, the styles
inline CSS. Every value that comes from the log (run and model names, messages) is escaped.

The package:

- `loading`: reading a watch log (`load_log`, `log_to_dict`) or `memfit measure --json`
  output (`load_measurements`);
- `page`: the page of a watch log (`build_html`, `write_html`);
- `explanation`: what was alive at a measured peak, and the page of measurements
  (`build_measure_html`);
- `svg`: the line plots, as inline SVG;
- `markup`: escaping, numbers as text, tables, the CSS.

Example:
    ```python
    from memfit.report import load_log, write_html

    write_html(load_log("run.jsonl"), "run.html")
    ```
"""

from __future__ import annotations

from memfit.report.explanation import build_measure_html, explanation_html
from memfit.report.loading import load_log, load_measurements, log_to_dict
from memfit.report.page import MIB, build_html, write_html
from memfit.report.svg import MAX_POINTS
from memfit.watch.log import Run

__all__ = [
    "MAX_POINTS",
    "MIB",
    "Run",
    "build_html",
    "build_measure_html",
    "explanation_html",
    "load_log",
    "load_measurements",
    "log_to_dict",
    "write_html",
]
