"""`memfit plan`: micro-batches, precision and recompute for a target batch, and its table."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from memfit.budget.budget import Budget, resolve_budget
from memfit.cli.options import margin_option, replica_budget_specs, workload_command
from memfit.cli.render import answer, err, out, render_summary
from memfit.console.progress import candidate_line
from memfit.measuring.replicas import per_replica_batch
from memfit.sizes import format_size
from memfit.workload.spec import WorkloadSpec


@click.command()
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
@workload_command(replicas=True)
def plan(
    workload: WorkloadSpec,
    batch_size: int,
    margin: float,
    precisions: tuple[str, ...],
    remat_modes: tuple[str, ...],
    no_confirm: bool,
    replicas: int | None,
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
    A Model Garden task (garden:EXPERIMENT) is planned through its own train_step: K alone
    (each splitting the batch equally), measured, and confirmed by 20 steps of
    GuardedStep.from_task.
    With --replicas N (or one budget per replica: --device T4,L4) --batch-size is the global
    batch: the plan is each replica's K and micro-batch, under the tightest budget less the
    gradient all-reduce's buffer.
    """
    memory, device, replicas = replica_budget_specs(memory, device, replicas)
    per_replica_batch(batch_size, replicas)  # a global batch the replicas cannot share: say so now
    budget = resolve_budget(memory=memory, device=device) or Budget.from_device()
    # Imported when the command runs: the CLI starts without it.
    from memfit.planning import plan_workload

    def show(c: Any) -> None:
        err.print(f"  {candidate_line(c)}")

    with err.status("Planning: estimating, measuring, confirming", spinner="dots"):
        result = plan_workload(
            workload,
            batch_size,
            budget,
            margin=margin,
            precisions=list(precisions) or None,
            remat_modes=[None if m == "none" else m for m in remat_modes] or None,
            on_candidate=show,
            confirm=not no_confirm,
            replicas=replicas,
        )
    answer(result, as_json, _render_plan, result.fits)


def _render_plan(result: Any) -> None:
    """The plan's candidates as a table, and its summary."""
    replicas, batch_size = result.replicas, result.batch_size
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
    render_summary(result)


def _plan_stage(candidate: Any) -> str:
    """How far a plan's candidate got: estimated, measured, confirmed (or failed it)."""
    if candidate.confirmed is not None:
        return "confirmed" if candidate.confirmed else "failed"
    return "measured" if candidate.measured else "estimated" if candidate.estimated_only else "-"
