"""`memfit batch`: the largest batch size of MODEL that fits the budget, by measuring."""

from __future__ import annotations

from typing import Any

import click

from memfit.budget.budget import Budget
from memfit.checks import check_positive_int
from memfit.cli.options import (
    apply_budget,
    checked,
    count_option,
    margin_option,
    replica_budget_specs,
    workload_command,
)
from memfit.cli.render import answer, err, render_summary
from memfit.console.progress import trial_line
from memfit.search import DEFAULT_SOAK_STEPS
from memfit.workload.spec import WorkloadSpec


@click.command()
@click.option("--max-batch", type=int, help="Never try a batch larger than this.")
@margin_option("Share of the step's own bytes (peak less weights and optimizer state) kept free.")
@count_option(
    "--soak-steps",
    default=DEFAULT_SOAK_STEPS,
    help="Steps of model.fit's train function the size found must train, in a fresh "
    "process, before it is the answer (a step's peak rises over the first steps of "
    "training); 0 answers from the search's one-step trials, unconfirmed.",
)
@click.option(
    "--in-process",
    is_flag=True,
    help="Load MODEL in this process too; the trials run on a saved copy in a child "
    "process (a model that cannot be saved is measured in this process).",
)
@workload_command(replicas=True)
def batch(
    workload: WorkloadSpec,
    max_batch: int | None,
    margin: float,
    soak_steps: int,
    in_process: bool,
    replicas: int | None,
    memory: str | None,
    device: str | None,
    as_json: bool,
) -> None:
    """Find the largest batch size of MODEL that fits the budget, by measuring.

    With --data, the trials use the dataset's largest samples, so the answer holds for all of
    them. Without --memory or --device, the budget is this device's free memory. With
    --replicas N (or one budget per replica: --device T4,L4) the answer is the largest
    per-replica batch under the tightest budget less the gradient all-reduce's buffer, and
    the global batch (N x per-replica).
    """
    if max_batch is not None:
        checked(check_positive_int, max_batch, "max_batch", param_hint="'--max-batch'")
    memory, device, replicas = replica_budget_specs(memory, device, replicas)
    # Imported when the command runs: the CLI starts without it.
    from memfit.search import search_workload

    budget = apply_budget(memory, device) or Budget.from_device()

    with err.status("Loading model", spinner="dots") as status:
        # --in-process: MODEL is built here too (the trials run on a saved copy of it).
        model = workload.build_model() if in_process else None
        status.update("Measuring batch 1 and 4")

        def show(trial: Any) -> None:
            err.print(f"  {trial_line(trial)}")
            status.update(f"Searching: {len(trials_seen) + 1} trials so far")
            trials_seen.append(trial)

        trials_seen: list[Any] = []
        result = search_workload(
            workload,
            budget,
            model=model,
            isolated=not in_process,
            max_batch=max_batch,
            margin=margin,
            soak_steps=soak_steps,
            on_trial=show,
            replicas=replicas,
        )
    answer(result, as_json, render_summary, result.fits)
