"""`memfit measure`: the peak of real training steps, and its table."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from memfit.cli.options import apply_budget, batch_sizes, count_option, workload_command
from memfit.cli.render import err, out, print_json, render_explanation
from memfit.sizes import format_size
from memfit.workload.spec import WorkloadSpec


@click.command()
@click.option(
    "--batch-size",
    "-b",
    default="32",
    callback=batch_sizes,
    show_default=True,
    help="Batch size, or several separated by commas (1,4,16).",
)
@count_option("--repeats", default=3, help="Measured steps after the warm-up step.", minimum=1)
@click.option(
    "--recompute",
    "recompute",
    metavar="POLICY",
    help="Measure with memfit's recompute (gradient checkpointing): sqrt, all, a segment "
    "count, a size kept for backward (64MiB) or layer names to cut after (a,b).",
)
@click.option(
    "--in-process",
    is_flag=True,
    help="Measure all batch sizes in this process (faster; by default each runs in a "
    "fresh child process, so one batch's OOM cannot disturb the next).",
)
@click.option(
    "--explain",
    is_flag=True,
    help="Also list what was alive at the peak (by layer and kind, the largest tensors), "
    "from TensorFlow's memory profile of the measured steps, beside memfit estimate's breakdown "
    "of the same step. Needs a budget on a CPU (--memory/--device).",
)
@workload_command()
def measure(
    workload: WorkloadSpec,
    batch_size: list[int],
    repeats: int,
    in_process: bool,
    recompute: str | None,
    explain: bool,
    memory: str | None,
    device: str | None,
    as_json: bool,
) -> None:
    """Measure the peak memory of one real training step of MODEL.

    MODEL is a .keras file, package.module:factory, a built-in such as
    keras.applications.MobileNetV2, or a TF Model Garden task (garden:EXPERIMENT with --set,
    or garden:package.module:callable), whose own train_step is measured. A batch that does
    not fit is reported as out of memory.
    With --explain, the peak is broken down into the tensors alive at that moment.
    """
    budget = apply_budget(memory, device)
    # Imported when the command runs: the CLI starts without it.
    from memfit.measuring.isolate import measure_in_child
    from memfit.measuring.measurer import measure_built
    from memfit.recomputation.remat import policy_from_text

    policy = policy_from_text(recompute) if recompute else None
    options = {"repeats": repeats, "budget": budget, "recompute": policy, "explain": explain}
    results = []
    with err.status("Loading model", spinner="dots") as status:
        # --in-process: MODEL and its samples are built here once, for every batch size.
        local = workload.workload() if in_process else None
        for size in sorted(batch_size):
            status.update(f"Measuring batch {size}")
            if local is None:
                result = measure_in_child(workload, size, **options)
            else:

                def report(text: str, _status: Any = status) -> None:
                    _status.update(f"Measuring {text}")

                result = measure_built(local, size, on_progress=report, **options)
            results.append(result)
            if not as_json:
                err.print(f"  {result}")
    if as_json:
        payload = [r.to_dict() for r in results]
        print_json(payload[0] if len(payload) == 1 else {"measurements": payload})
        return
    _render_measurements(str(workload.model), results)
    for result in results:
        if result.explanation is not None:
            render_explanation(result.batch_size, result.explanation)


def _render_measurements(model: str, results: list[Any]) -> None:
    budget = results[0].budget
    title = f"{model}: one training step on {results[0].device}" + (
        f", budget {format_size(budget.usable_bytes)} ({budget.name})" if budget else ""
    )
    table = Table(title=title, title_justify="left")
    for column in ("batch", "peak", "spread", "resident", "step time", "headroom", "result"):
        table.add_column(column, justify="left" if column == "result" else "right", no_wrap=True)
    for r in results:
        if r.oom:
            table.add_row(
                str(r.batch_size),
                f">{format_size(r.peak_bytes)}",
                "-",
                format_size(r.resident_bytes),
                "-",
                "-",
                "[bold red]out of memory[/]",
            )
        else:
            table.add_row(
                str(r.batch_size),
                format_size(r.peak_bytes),
                f"± {format_size(r.peak_spread_bytes)}",
                format_size(r.resident_bytes),
                f"{r.step_seconds:.3f} s",
                format_size(r.headroom_bytes),
                "[green]fits[/]",
            )
    out.print(table)
    out.print(
        "peak: highest allocator bytes in use over the measured steps (weights, optimizer "
        "slots, batch, activations, gradients, temporaries); spread: highest minus lowest peak."
    )
