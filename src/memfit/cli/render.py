"""Shared output: the consoles, JSON on stdout, and the tables of what was alive at a peak.

`out` is stdout (tables, wide when piped), `err` is stderr (progress and status lines).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from memfit.sizes import format_size

# Piped output (logs, CI, tests) gets a wide table instead of rich's 80-column default.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    """`--json`: `data` on stdout, indented, whatever JSON cannot hold as a string."""
    click.echo(json.dumps(data, indent=2, default=str))


def answer(result: Any, as_json: bool, render: Callable[[Any], None], ok: bool) -> NoReturn:
    """Print a command's `result` (`--json`: its `to_dict()`, else `render(result)`), then
    exit with status 0 when `ok`, else 1."""
    if as_json:
        print_json(result.to_dict())
    else:
        render(result)
    sys.exit(0 if ok else 1)


def render_summary(result: Any) -> None:
    """A result's `summary()`, in bold (red when nothing fits)."""
    style = "bold" if result.fits else "bold red"
    out.print(f"[{style}]{result.summary()}[/]")


def render_explanation(batch_size: int, explanation: Any, top: int = 10) -> None:
    """`measure --explain`: the live set at the peak beside the estimate of the same step."""
    from rich.markup import escape

    e = explanation
    estimate = e.estimate or {}
    error = f" ({e.listed_error:+.1%} of the measured peak)" if e.listed_error is not None else ""
    out.print(
        f"\n[bold]Alive at the peak of batch {batch_size}[/]: {format_size(e.listed_bytes)}"
        f"{error}, {e.tensors} tensors made by the step besides what was resident; the peak "
        f"came at {escape(e.peak_op or '-')}"
    )
    predicted = estimate.get("peak_bytes")
    kinds = Table(title="By kind", title_justify="left")
    kinds.add_column("kind")
    kinds.add_column("measured", justify="right")
    kinds.add_column("share", justify="right")
    kinds.add_column("estimate", justify="right")
    breakdown = estimate.get("breakdown") or {}
    for kind, nbytes in e.by_kind.items():
        guess = breakdown.get(f"{kind}_bytes")
        if nbytes or guess:
            share = nbytes / e.listed_bytes if e.listed_bytes else 0
            kinds.add_row(
                kind.replace("_", " "),
                format_size(nbytes),
                f"{share:.0%}",
                format_size(guess) if guess is not None else "-",
            )
    kinds.add_row(
        "[bold]total[/]",
        format_size(e.listed_bytes),
        "",
        format_size(predicted) if predicted else "-",
    )
    out.print(kinds)
    estimated = {row["layer"]: row for row in estimate.get("per_layer") or []}
    layers = Table(title=f"By layer (top {top})", title_justify="left")
    for column in ("layer", "measured", "mostly", "estimate"):
        layers.add_column(column, justify="right" if column in ("measured", "estimate") else "left")
    for row in e.per_layer[:top]:
        parts = {k[:-6]: v for k, v in row.items() if k.endswith("_bytes")}
        main = max(parts, key=lambda k: parts[k]) if parts else ""
        guess = estimated.get(row["layer"], {}).get("bytes")
        layers.add_row(
            escape(row["layer"]),
            format_size(row["bytes"]),
            main.replace("_", " "),
            format_size(guess) if guess is not None else "-",
        )
    rest = e.per_layer[top:]
    if rest:
        layers.add_row(f"({len(rest)} more)", format_size(sum(r["bytes"] for r in rest)), "", "")
    out.print(layers)
    largest = Table(title="Largest tensors alive at the peak", title_justify="left")
    for column in ("size", "kind", "layer", "shape", "dtype", "made by"):
        largest.add_column(column, justify="right" if column == "size" else "left")
    for row in e.largest:
        shape = "x".join(str(d) for d in row["shape"]) if row.get("shape") else "-"
        largest.add_row(
            format_size(row["bytes"]),
            row["kind"].replace("_", " "),
            escape(row["layer"]),
            shape,
            row.get("dtype") or "-",
            escape(_short_op(row["op"])),
        )
    out.print(largest)
    if e.top_layers:
        t = e.top_layers
        out.print(
            f"top {len(t['measured'])} layers: measured {', '.join(t['measured'])}; estimated "
            f"{', '.join(t['estimated'])} ({t['common']} shared)"
        )
    elif estimate.get("error"):
        out.print(f"the estimate of the same step failed: {escape(estimate['error'])}")
    for note in e.notes:
        out.print(f"note: {escape(note)}")


def _short_op(name: str, keep: int = 3) -> str:
    """An op's name without TensorFlow's call wrappers, its last `keep` scopes."""
    parts = [
        p
        for p in name.split("/")
        if not p.startswith(("StatefulPartitionedCall", "PartitionedCall"))
    ]
    return "/".join(parts[-keep:])
