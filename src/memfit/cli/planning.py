"""`memfit plan`: micro-batches, precision and recompute for a target batch, and its table."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.table import Table

from memfit.budget import Budget, resolve_budget
from memfit.cli.options import (
    budget_options,
    json_option,
    margin_option,
    model_options,
    replica_budget_specs,
    replicas_option,
)
from memfit.cli.render import err, out, print_json
from memfit.models import check_model_spec
from memfit.progress import candidate_line
from memfit.replicas import per_replica_batch
from memfit.sizes import format_size


@click.command()
@click.argument("model", metavar="MODEL")
@click.option(
    "--batch-size",
    "-b",
    "batch_size",
    type=click.IntRange(min=1),
    required=True,
    help="The target effective batch (samples per optimizer update).",
)
@margin_option("Share of the budget kept free.")
@click.option(
    "--precision",
    "precisions",
    multiple=True,
    type=click.Choice(["float32", "mixed_float16", "mixed_bfloat16"]),
    help="Precision policies to consider (repeat; default all three for rebuildable models).",
)
@click.option(
    "--remat",
    "remat_modes",
    multiple=True,
    type=click.Choice(["none", "memfit", "larger_than", "activations", "list_of_layers", "full"]),
    help="Recompute to consider (repeat): memfit (memfit's recompute, sqrt segments) or a "
    "keras.RematScope mode; default none, memfit, larger_than, activations.",
)
@click.option(
    "--no-confirm",
    "no_confirm",
    is_flag=True,
    help="Answer without the confirmation run (by default the chosen configuration trains "
    "20 steps of memfit.fit in a fresh process, and one that needs a recovery gives way "
    "to the next).",
)
@replicas_option
@model_options
@budget_options
@json_option
def plan(
    model: str,
    batch_size: int,
    margin: float,
    precisions: tuple[str, ...],
    remat_modes: tuple[str, ...],
    no_confirm: bool,
    replicas: int | None,
    input_shape: Any,
    classes: int | None,
    optimizer: str | None,
    loss: str | None,
    data_spec: str | None,
    unsafe: bool,
    memory: str | None,
    device: str | None,
    as_json: bool,
) -> None:
    """Plan micro-batches, precision and recompute for a target batch of MODEL.

    memfit.estimate predicts each configuration's peak; the finalists run the step
    memfit.fit runs (micro-batched gradients, one update) in fresh child processes under the
    budget, the fastest that fits wins, and it must train 20 steps of memfit.fit in a fresh
    process without a recovery. Precision and recompute are planned for factories and
    built-ins, which memfit can rebuild; for a .keras file only the number of micro-batches.
    With --replicas N (or one budget per replica: --device T4,L4) --batch-size is the global
    batch: the plan is each replica's K and micro-batch, under the tightest budget less the
    gradient all-reduce's buffer.
    """
    check_model_spec(model)
    memory, device, replicas = replica_budget_specs(memory, device, replicas)
    per_replica_batch(batch_size, replicas)  # a global batch the replicas cannot share: say so now
    budget = resolve_budget(memory=memory, device=device) or Budget.from_device()
    from memfit.planning import plan as make_plan

    def show(c: Any) -> None:
        err.print(f"  {candidate_line(c)}")

    with err.status("Planning: estimating, measuring, confirming", spinner="dots"):
        result = make_plan(
            model,
            batch_size,
            budget,
            margin=margin,
            precisions=list(precisions) or None,
            remat_modes=[None if m == "none" else m for m in remat_modes] or None,
            input_shape=input_shape,
            data=data_spec,
            optimizer=optimizer,
            loss=loss,
            on_candidate=show,
            classes=classes,
            safe_mode=not unsafe,
            confirm=not no_confirm,
            replicas=replicas,
        )
    if as_json:
        print_json(result.to_dict())
    else:
        over = f" over {replicas} replicas ({batch_size // replicas} each)" if replicas > 1 else ""
        table = Table(
            title=f"plan for batch {batch_size}{over} in {format_size(result.budget.usable_bytes)}"
        )
        columns = ("precision", "remat", "K", "micro-batch", "predicted", "peak", "s / batch")
        for column in (*columns, "how", ""):
            left = column in ("precision", "remat", "how")
            table.add_column(column, justify="left" if left else "right")
        for c in result.candidates:
            chosen = (
                result.fits
                and c.fits
                and (c.precision, c.remat, c.micro_batches)
                == (result.precision, result.remat, result.micro_batches)
            )
            table.add_row(
                c.precision,
                c.remat or "none",
                str(c.micro_batches),
                str(c.micro_batch_size),
                format_size(c.predicted_peak_bytes) if c.predicted_peak_bytes else "-",
                format_size(c.peak_bytes) if c.measured else "-",
                f"{c.step_seconds:.3f}" if c.step_seconds else "-",
                _plan_stage(c),
                "[bold green]chosen[/]"
                if chosen
                else ("error" if c.error else "OOM" if c.oom else "fits" if c.fits else "over"),
            )
        out.print(table)
        style = "bold" if result.fits else "bold red"
        out.print(f"[{style}]{result.summary()}[/]")
    sys.exit(0 if result.fits else 1)


def _plan_stage(candidate: Any) -> str:
    """How far a plan's candidate got: estimated, measured, confirmed (or failed it)."""
    if candidate.confirmed is not None:
        return "confirmed" if candidate.confirmed else "failed"
    return "measured" if candidate.measured else "estimated" if candidate.estimated_only else "-"
