"""`memfit estimate`: the predicted peak of a training step, its breakdown and what-ifs."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
from rich.table import Table

from memfit.checks import Options, check_batch_size, check_threads
from memfit.cli.options import apply_budget, count_option, workload_command
from memfit.cli.render import err, out, print_json
from memfit.estimation.bounds import ALLOWANCE, BOUND_STEPS, RUN_STEPS, SAMPLES
from memfit.sizes import format_size
from memfit.workload.spec import WorkloadSpec


@click.command()
@click.option("--batch-size", "-b", type=int, required=True, help="Samples in the step.")
@click.option(
    "--precision",
    help="Keras dtype policy to build MODEL under (float32, mixed_float16, mixed_bfloat16).",
)
@click.option("--remat", help="keras.RematScope mode to build MODEL under.")
@click.option(
    "--what-ifs/--no-what-ifs",
    default=True,
    show_default=True,
    help="Also predict other batch sizes, the largest batch for the budget, memfit's "
    "recompute, and (for factories and built-ins, in a second process) mixed precision, "
    "the other optimizer, a smaller input.",
)
@count_option(
    "--samples",
    default=SAMPLES,
    help="Other processes to replay (executor orders, allocator histories) for the high "
    "bound; 0 leaves the bound out.",
)
@count_option(
    "--steps",
    default=RUN_STEPS,
    minimum=1,
    help="Steps of training the high bound covers: the highest step of a run this long "
    "(the likely peak stays the typical step).",
)
@click.option(
    "--threads",
    metavar="INTER,INTRA",
    help="Estimate for a machine whose TensorFlow runs INTER inter-op and INTRA intra-op "
    "threads (default: what it runs here).",
)
@click.option(
    "--check", is_flag=True, help="Also measure the step (in a child process) and show the error."
)
@workload_command()
def estimate(
    workload: WorkloadSpec,
    batch_size: int,
    precision: str | None,
    remat: str | None,
    what_ifs: bool,
    samples: int,
    steps: int,
    threads: str | None,
    check: bool,
    memory: str | None,
    device: str | None,
    as_json: bool,
) -> None:
    """Predict the peak memory of one training step of MODEL without running it.

    Traces the training step (forward, backward, optimizer update) and replays it through a
    model of TensorFlow's allocator: a breakdown (weights, optimizer slots, activations,
    gradients, temporaries, kernel workspace), the top layers, when the peak happens, and
    what-ifs. For a TF Model Garden task (garden:EXPERIMENT), its own train_step is traced
    at the batch size (no what-ifs).
    """
    check_batch_size(batch_size)
    assumed = check_threads(threads) if threads else None
    if precision == "float32":
        precision = None
    budget = apply_budget(memory, device)
    model = str(workload.model)
    # Imported when the command runs: the CLI starts without it.
    from memfit.estimation import estimate as run_estimate

    with err.status("Loading model", spinner="dots") as status:

        def report(text: str) -> None:
            status.update(f"Estimating: {text}")

        target: Any = model
        data = None
        if workload.data or model.endswith((".keras", ".h5")) or not workload.safe_mode:
            # Built here: a dataset's samples, and files (--unsafe ones too).
            target, data = workload.build_model(), workload.load_data()
        # The workload's own fields, and how far the estimate goes.
        named = {k: getattr(workload, k) for k in ("input_shape", "optimizer", "loss", "classes")}
        if workload.is_task:
            # A Model Garden task: its own train_step, traced at this batch; no what-ifs.
            named = {"overrides": workload.overrides, "params": workload.params}
            what_ifs = False
        reach = {
            "what_ifs": what_ifs,
            "steps": steps,
            "options": Options(samples=samples, threads=assumed),
        }
        result = run_estimate(
            target,
            batch_size,
            data=data,
            budget=budget,
            precision=precision,
            remat=remat,
            progress=report,
            **named,
            **reach,
        )
        measured = None
        if check:
            status.update("Measuring the step in a child process")
            # Imported when the command runs: the CLI starts without it.
            from memfit.budget.budget import emulated_budget
            from memfit.measuring.isolate import measure_in_child
            from memfit.measuring.measurer import DEFAULT_REPEATS

            # The step estimated: the same workload, built under the same precision and remat.
            variant = dataclasses.replace(workload, precision=precision, remat=remat)
            budget = budget or emulated_budget()
            measured = measure_in_child(variant, batch_size, repeats=DEFAULT_REPEATS, budget=budget)
    payload = result.to_dict()
    if measured is not None:
        # The check measures a few steps after a warm-up: against the bound of 5 steps.
        high = result.step_high_bytes or result.high_bytes
        payload["check"] = _estimate_check(result.peak_bytes, measured, high)
    if as_json:
        print_json(payload)
        return
    _render_estimate(model, result, payload.get("check"))
    what = ", what-ifs included" if result.what_ifs else ""
    out.print(f"estimated in {result.estimate_seconds:.1f} s{what}")


def _estimate_check(predicted: int, measured: Any, high: int | None = None) -> dict[str, Any]:
    peak = measured.peak_bytes
    valid = bool(peak) and not measured.oom
    return {
        "predicted_bytes": predicted,
        "high_bytes": high,
        "measured_bytes": peak,
        "measured_oom": measured.oom,
        "measured_peaks_bytes": measured.peaks_bytes,
        "error": (predicted - peak) / peak if valid else None,
        "within_high_bound": (peak <= high) if valid and high else None,
    }


def _render_estimate(model: str, result: Any, check: dict[str, Any] | None) -> None:
    moment = result.peak_moment
    out.print(
        f"[bold]{model}[/], batch {result.batch_size}: predicted peak "
        f"[bold]{format_size(result.peak_bytes)}[/] — at the {moment.get('phase')} pass, layer "
        f"{moment.get('layer') or '-'} ({moment.get('op_type')})"
    )
    if result.order_peak_bytes and result.peak_bytes > result.order_peak_bytes:
        out.print(
            "the highest step of the processes replayed: under several inter-op threads each "
            "step's order is a race (the likely order alone peaks at "
            f"{format_size(result.order_peak_bytes)})"
        )
    if result.high_bytes:
        run = (
            f", raised for the highest step of {result.steps} steps"
            if result.step_high_bytes and result.high_bytes > result.step_high_bytes
            else ""
        )
        out.print(
            f"high bound [bold]{format_size(result.high_bytes)}[/] over {result.steps} steps "
            f"(the highest of {len(result.sample_peaks_bytes)} other executor orders and "
            f"allocator histories, plus {ALLOWANCE:.0%}{run}): rent or plan for this"
        )
    table = Table(title="What is live at the peak")
    table.add_column("part")
    table.add_column("size", justify="right")
    table.add_column("share", justify="right")
    for key, value in sorted(result.breakdown.items(), key=lambda kv: -kv[1]):
        if value:
            share = value / result.peak_bytes if result.peak_bytes else 0
            table.add_row(key.replace("_", " "), format_size(value), f"{share:.0%}")
    out.print(table)
    layers = Table(title="Top layers at the peak")
    layers.add_column("layer")
    layers.add_column("size", justify="right")
    layers.add_column("mostly")
    for row in result.per_layer[:8]:
        parts = {k[:-6]: v for k, v in row.items() if k.endswith("_bytes")}
        main = max(parts, key=lambda k: parts[k]) if parts else ""
        layers.add_row(row["layer"], format_size(row["bytes"]), main.replace("_", " "))
    out.print(layers)
    if result.what_ifs:
        whatif = Table(title="What if")
        whatif.add_column("change")
        whatif.add_column("batch", justify="right")
        whatif.add_column("peak", justify="right")
        whatif.add_column("up to", justify="right")
        whatif.add_column("against now", justify="right")
        for row in result.what_ifs:
            if "error" in row or "note" in row:
                # "not applicable: <why>", or why a row is not estimated, whole: the table
                # wraps it.
                why = row.get("error") or row["note"]
                whatif.add_row(row["change"], "", "n/a", "", why.splitlines()[0])
                continue
            saved = row.get("saved_bytes")
            whatif.add_row(
                row["change"],
                str(row.get("batch_size") or "none fits"),
                format_size(row["peak_bytes"]) if row.get("peak_bytes") else "-",
                format_size(row["high_bytes"]) if row.get("high_bytes") else "-",
                _effect(saved),
            )
        out.print(whatif)
    if result.budget is not None:
        verdict = "fits" if result.fits else "does NOT fit"
        if result.high_bytes:
            verdict += " (high bound)"
        out.print(f"{verdict} in {format_size(result.budget.usable_bytes)} ({result.budget.name})")
    if check is not None:
        if check["error"] is None:
            out.print(f"measured: out of memory (reached {format_size(check['measured_bytes'])})")
        else:
            inside = check.get("within_high_bound")
            bound = "" if inside is None else ("; within" if inside else "; ABOVE")
            bound += f" the high bound of {BOUND_STEPS} steps" if inside is not None else ""
            out.print(
                f"measured peak {format_size(check['measured_bytes'])}; predicted "
                f"{format_size(check['predicted_bytes'])}; error {check['error']:+.1%}{bound}"
            )


def _effect(saved: int | None) -> str:
    """A what-if's change in the peak, in words: `saves 1.2 GiB` or `adds 3 MiB`.

    Example:
        >>> _effect(-3 << 20)
        'adds 3.00 MiB'
    """
    if saved is None:
        return ""
    return f"{'saves' if saved >= 0 else 'adds'} {format_size(abs(saved))}"
