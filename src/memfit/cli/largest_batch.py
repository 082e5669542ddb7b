"""`memfit batch`: the largest batch size of MODEL that fits the budget, by measuring."""

from __future__ import annotations

import sys
from typing import Any

import click

from memfit.budget import Budget
from memfit.checks import check_positive_int
from memfit.cli.options import (
    apply_budget,
    budget_options,
    checked,
    json_option,
    load_targets,
    margin_option,
    model_options,
    replica_budget_specs,
    replicas_option,
)
from memfit.cli.render import err, out, print_json
from memfit.models import check_model_spec
from memfit.progress import trial_line
from memfit.search import DEFAULT_SOAK_STEPS


@click.command()
@click.argument("model", metavar="MODEL")
@click.option("--max-batch", type=int, help="Never try a batch larger than this.")
@margin_option("Share of the budget kept free at the batch found.")
@click.option(
    "--soak-steps",
    type=click.IntRange(min=0),
    default=DEFAULT_SOAK_STEPS,
    show_default=True,
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
@replicas_option
@model_options
@budget_options
@json_option
def batch(
    model: str,
    max_batch: int | None,
    margin: float,
    soak_steps: int,
    in_process: bool,
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
    """Find the largest batch size of MODEL that fits the budget, by measuring.

    With --data, the trials use the dataset's largest samples, so the answer holds for all of
    them. Without --memory or --device, the budget is this device's free memory. With
    --replicas N (or one budget per replica: --device T4,L4) the answer is the largest
    per-replica batch under the tightest budget less the gradient all-reduce's buffer, and
    the global batch (N x per-replica).
    """
    if max_batch is not None:
        checked(check_positive_int, max_batch, "max_batch", param_hint="'--max-batch'")
    check_model_spec(model)
    memory, device, replicas = replica_budget_specs(memory, device, replicas)
    budget = apply_budget(memory, device) or Budget.from_device()
    from memfit.search import find_batch_size

    with err.status("Loading model", spinner="dots") as status:
        target, data = load_targets(model, data_spec, not in_process, input_shape, classes, unsafe)
        status.update("Measuring batch 1 and 4")

        def show(trial: Any) -> None:
            err.print(f"  {trial_line(trial)}")
            status.update(f"Searching: {len(trials_seen) + 1} trials so far")
            trials_seen.append(trial)

        trials_seen: list[Any] = []
        result = find_batch_size(
            target,
            budget,
            max_batch=max_batch,
            margin=margin,
            data=data,
            input_shape=input_shape,
            optimizer=optimizer,
            loss=loss,
            isolated=not in_process,
            soak_steps=soak_steps,
            on_trial=show,
            classes=classes,
            safe_mode=not unsafe,
            replicas=replicas,
        )
    if as_json:
        print_json(result.to_dict())
    else:
        style = "bold" if result.fits else "bold red"
        out.print(f"[{style}]{result.summary()}[/]")
    sys.exit(0 if result.fits else 1)
