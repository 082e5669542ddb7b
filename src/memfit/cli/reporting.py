"""`memfit report`: a memfit.Watch log (or `measure --explain --json`) as an HTML page."""

from __future__ import annotations

import os
from typing import Any

import click
from rich.table import Table

from memfit.cli.options import (
    json_option,
)
from memfit.cli.render import out, print_json, render_explanation
from memfit.errors import MemfitError
from memfit.sizes import format_size


@click.command()
@click.argument("run", metavar="RUN.jsonl")
@click.option(
    "--out",
    "out_path",
    metavar="FILE",
    help="Where to write the HTML page (default: RUN with .html instead of .jsonl).",
)
@json_option
def report(run: str, out_path: str | None, as_json: bool) -> None:
    """Turn a memfit.Watch log into one self-contained HTML page and a summary.

    RUN is the JSON-lines file written by memfit.Watch(log_path=...). The page (no scripts,
    nothing fetched) shows memory over the steps with the budget and OOM/recovery marks, step
    time and input wait, the loss, each finding with its cause and fix, and the run's
    configuration; a log of several fits (one Watch reused) gets one section per fit.
    RUN may also be the JSON that `memfit measure --explain --json` printed: the page then
    shows what was alive at each measured peak, beside the estimate.
    """
    from rich.markup import escape

    # Imported when the command runs: the CLI starts without it.
    from memfit.report import load_log, load_measurements, log_to_dict, write_html

    if out_path is None:
        base = run.rsplit(".", 1)[0] if run.endswith((".jsonl", ".json")) else run
        out_path = base + ".html"
    measurements = load_measurements(run)
    if measurements is not None:
        _report_measurements(run, measurements, out_path, as_json)
        return
    runs = load_log(run)
    written = write_html(runs, out_path)
    if as_json:
        print_json({**log_to_dict(runs), "html_path": written})
        return
    for loaded in runs:
        _render_report(loaded, len(runs))
    out.print(f"wrote {escape(written)}")


def _report_measurements(
    path: str, measurements: list[dict[str, Any]], out_path: str, as_json: bool
) -> None:
    """`memfit report` on `memfit measure --json` output: its page and its explanations."""
    from rich.markup import escape

    # Imported when the command runs: the CLI starts without it.
    from memfit.measuring.explain import Explanation
    from memfit.report import build_measure_html

    directory = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(directory):
        raise MemfitError(f"cannot write {out_path}: folder {directory} does not exist")
    with open(out_path, "w", encoding="utf-8") as handle:
        handle.write(build_measure_html(measurements, os.path.basename(path)))
    if as_json:
        print_json({"measurements": measurements, "html_path": out_path})
        return
    for m in measurements:
        if m.get("explanation"):
            render_explanation(m["batch_size"], Explanation.from_dict(m["explanation"]))
        else:
            out.print(f"batch {m.get('batch_size')}: measured without --explain")
    out.print(f"wrote {escape(out_path)}")


def _render_report(run: Any, fits: int) -> None:
    from rich.markup import escape

    summary = run.summary()
    title = f"memfit watch: {escape(run.name)}"
    if fits > 1:
        title = f"fit {run.index + 1} of {fits}, " + title
    table = Table(title=title, title_justify="left")
    table.add_column("steps", justify="right")
    table.add_column("step time", justify="right")
    table.add_column("input wait", justify="right")
    table.add_column("peak", justify="right")
    table.add_column("budget", justify="right")
    table.add_row(
        str(summary["steps"]),
        f"{1000 * summary['mean_step_seconds']:.1f} ms" if summary["mean_step_seconds"] else "-",
        f"{100 * summary['input_wait_fraction']:.0f}%"
        if summary["input_wait_fraction"] is not None
        else "-",
        format_size(summary["peak_bytes"]) if summary["peak_bytes"] else "-",
        format_size(summary["budget_bytes"]) if summary["budget_bytes"] else "-",
    )
    out.print(table)
    if not run.findings:
        out.print("[green]no findings[/]")
    for finding in run.findings:
        style = "bold red" if finding.get("severity") == "problem" else "bold yellow"
        out.print(
            f"[{style}]{escape(str(finding.get('kind')))}[/] at step {finding.get('step')}: "
            f"{escape(str(finding.get('message')))}\n  [bold]cause:[/] "
            f"{escape(str(finding.get('cause')))}\n  [bold]fix:[/] "
            f"{escape(str(finding.get('fix')))}"
        )
