"""`memfit doctor`: preflight this machine and render what it found."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from memfit.cli.options import (
    apply_budget,
    budget_options,
    json_option,
)
from memfit.cli.render import answer, out
from memfit.sizes import format_size

_LEVEL_STYLE = {"ok": "green", "warning": "yellow", "problem": "bold red"}


@click.command()
@budget_options
@json_option
def doctor(memory: str | None, device: str | None, as_json: bool) -> None:
    """Preflight this machine: devices, free memory, who holds it, settings made too late.

    Exits with status 1 when a problem is found.
    """
    apply_budget(memory, device)
    # Imported when the command runs: the CLI starts without it.
    from memfit.doctor.preflight import doctor as run_doctor

    report = run_doctor()
    answer(report, as_json, _render_doctor, report.ok)


def _render_doctor(report: Any) -> None:
    table = Table(title="Devices", title_justify="left")
    for column in ("device", "what", "total", "free", "held by others"):
        table.add_column(column, justify="right" if column in ("total", "free") else "left")
    for dev in report.devices:
        holders = ", ".join(
            f"{p['name']} ({p['pid']}, {format_size(p['used_bytes'])})" for p in dev["processes"]
        )
        table.add_row(
            dev["name"],
            str(dev["description"]),
            format_size(dev["total_bytes"]),
            format_size(dev["free_bytes"]),
            holders or "-",
        )
    out.print(table)
    v = report.versions
    legacy = f"  tf_keras {v['tf_keras']}" if v.get("tf_keras") else ""
    out.print(
        f"TensorFlow {v.get('tensorflow')}  Keras {v.get('keras')}{legacy}  "
        f"CUDA {v.get('cuda') or '-'}  "
        f"cuDNN {v.get('cudnn') or '-'}  driver {v.get('driver') or '-'}  Python {v.get('python')}"
    )
    if report.budget is not None:
        out.print(f"Budget for training: [bold]{report.budget}[/bold]")
    out.print()
    for finding in report.findings:
        style = _LEVEL_STYLE[finding.level]
        out.print(f"[{style}]{finding.level:>7}[/{style}]  {finding.topic}: {finding.message}")
        if finding.fix:
            out.print(f"         fix: {finding.fix}")
    summary = f"{len(report.problems)} problem(s), {len(report.warnings)} warning(s)"
    out.print(f"\n[{'bold red' if report.problems else 'green'}]{summary}[/]")
