"""The `memfit` command line: `memfit <command> [MODEL] [options]`."""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from memfit.budget import Budget, resolve_budget
from memfit.checks import DEFAULT_MARGIN, check_batch_size, check_margin, check_positive_int
from memfit.errors import MemfitError
from memfit.models import MODEL_FORMS, check_model_spec
from memfit.progress import candidate_line, trial_line
from memfit.search import DEFAULT_SOAK_STEPS
from memfit.sizes import format_size

# Piped output (logs, CI, tests) gets a wide table instead of rich's 80-column default.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True, highlight=False)

_LEVEL_STYLE = {"ok": "green", "warning": "yellow", "problem": "bold red"}


# -- shared options -------------------------------------------------------------------------
def _memory_growth(_ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    # Read by `apply_budget` (and inherited by child processes) from the environment.
    if value:
        from memfit.budget import ENV_MEMORY_GROWTH

        os.environ[ENV_MEMORY_GROWTH] = "1"
    return value


def budget_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--memory` / `--device` / `--memory-growth`: the budget to emulate for this command."""
    command = click.option(
        "--memory-growth",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_memory_growth,
        help="Emulate a GPU with memory growth on (regions that grow as training needs "
        "them) instead of one that takes its whole budget at first use.",
    )(command)
    command = click.option(
        "--device",
        "device",
        metavar="CARD",
        help="Emulate a named card's usable memory (T4, L4, V100-16GB, A100-40GB, ...).",
    )(command)
    command = click.option(
        "--memory",
        "memory",
        metavar="SIZE",
        help="Emulate a device with this much memory (16GiB, 1.5GB, 512MiB, bytes).",
    )(command)
    return command


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--json`: machine-readable output on stdout."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON (sizes in bytes) instead of tables."
    )(command)


def apply_budget(memory: str | None, device: str | None) -> Budget | None:
    """Emulate the budget `--memory` / `--device` name, before TensorFlow initialises."""
    from memfit.budget import emulated_memory_growth
    from memfit.emulate import emulate, ensure_memory_statistics

    growth = emulated_memory_growth()
    budget = resolve_budget(memory=memory, device=device)
    if budget is not None and budget.source in ("user", "card"):
        if memory is not None:
            budget = emulate(memory, memory_growth=growth)
        else:
            budget = emulate(device=device, memory_growth=growth)
    elif growth:
        require_growth_target()
    ensure_memory_statistics()
    return budget


def require_growth_target() -> None:
    """`--memory-growth` needs a GPU, or an emulated card to apply to: say so on a CPU."""
    from memfit.backend import tf as tfb
    from memfit.errors import EmulationError

    if tfb.gpu_count() == 0:
        raise EmulationError(
            "--memory-growth describes how an emulated card's allocator grows, and this "
            "machine has no GPU: add --memory SIZE or --device CARD"
        )
    os.environ[tfb.ENV_GROWTH] = "true"


def _checked(check: Callable[..., Any], value: Any, *args: Any, param_hint: Any = None) -> Any:
    """`check(value, *args)` (a `memfit.checks` check), its error as a bad option (exit 2)."""
    try:
        return check(value, *args)
    except MemfitError as exc:
        raise click.BadParameter(str(exc), param_hint=param_hint) from None


def _batch_sizes(_ctx: click.Context, _param: click.Parameter, value: str) -> list[int]:
    sizes = []
    for part in str(value).split(","):
        part = part.strip()
        number = int(part) if part.lstrip("-").isdigit() else part
        sizes.append(_checked(check_batch_size, number))
    return sizes


def _input_shape(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    shapes = []
    for group in value.split(";"):
        dims = [d.strip() for d in group.replace("x", ",").split(",") if d.strip()]
        if not dims or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise click.BadParameter(f"{value!r} is not a shape; give e.g. 224,224,3")
        shapes.append(tuple(int(d) for d in dims))
    return shapes[0] if len(shapes) == 1 else shapes


def _targets(
    model: str,
    data_spec: str | None,
    isolated: bool,
    input_shape: Any,
    classes: int | None,
    unsafe: bool,
) -> tuple[Any, Any]:
    """MODEL and --data as the work needs them: specs for child processes, objects in-process."""
    if isolated:
        return model, data_spec
    from memfit._child import load_dataset
    from memfit.models import load_model

    target = load_model(model, input_shape=input_shape, classes=classes, safe_mode=not unsafe)
    return target, load_dataset(data_spec) if data_spec else None


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


# -- the group ------------------------------------------------------------------------------
@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="memfit", prog_name="memfit")
def cli() -> None:
    """memfit: make TensorFlow/Keras training fit in memory and stay alive.

    doctor, estimate, measure, batch and plan take --memory SIZE or --device CARD to emulate
    a smaller card (real out-of-memory errors beyond it; demo takes --memory); every command
    takes --json for machine-readable output.
    """


# -- doctor ---------------------------------------------------------------------------------
@cli.command()
@budget_options
@json_option
def doctor(memory: str | None, device: str | None, as_json: bool) -> None:
    """Preflight this machine: devices, free memory, who holds it, settings made too late.

    Exits with status 1 when a problem is found.
    """
    apply_budget(memory, device)
    from memfit.doctor import doctor as run_doctor

    report = run_doctor()
    if as_json:
        _print_json(report.to_dict())
    else:
        _render_doctor(report)
    sys.exit(0 if report.ok else 1)


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
    out.print(
        f"TensorFlow {v.get('tensorflow')}  Keras {v.get('keras')}  CUDA {v.get('cuda') or '-'}  "
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


# -- measure --------------------------------------------------------------------------------
def model_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Options that say how to build MODEL and its training step."""
    options = [
        click.option(
            "--input-shape",
            callback=_input_shape,
            metavar="H,W,C",
            help="Shape of one sample (without batch), for built-ins or undefined inputs.",
        ),
        click.option("--classes", type=click.IntRange(min=1), help="Classes of a built-in model."),
        click.option(
            "--optimizer", help="Optimizer to compile with (default: the model's, else adam)."
        ),
        click.option(
            "--loss", help="Loss to compile with (default: the model's, else from its output)."
        ),
        click.option(
            "--data",
            "data_spec",
            metavar="MODULE:FN",
            help="package.module:dataset_fn returning a tf.data.Dataset of (x, y) samples.",
        ),
        click.option(
            "--unsafe",
            is_flag=True,
            help="Load .keras files that run Python code (Lambda layers); trusted files only.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@cli.command()
@click.argument("model", metavar="MODEL")
@click.option(
    "--batch-size",
    "-b",
    default="32",
    callback=_batch_sizes,
    show_default=True,
    help="Batch size, or several separated by commas (1,4,16).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Measured steps after the warm-up step.",
)
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
@model_options
@budget_options
@json_option
def measure(
    model: str,
    batch_size: list[int],
    repeats: int,
    in_process: bool,
    recompute: str | None,
    explain: bool,
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
    """Measure the peak memory of one real training step of MODEL.

    MODEL is a .keras file, package.module:factory, or a built-in such as
    keras.applications.MobileNetV2. A batch that does not fit is reported as out of memory.
    With --explain, the peak is broken down into the tensors alive at that moment.
    """
    check_model_spec(model)
    isolated = not in_process
    budget = apply_budget(memory, device)
    from memfit.measure import measure as run_measure
    from memfit.recompute import policy_from_text

    results = []
    with err.status("Loading model", spinner="dots") as status:
        target, data = _targets(model, data_spec, isolated, input_shape, classes, unsafe)
        for size in sorted(batch_size):
            status.update(f"Measuring batch {size}")
            kwargs: dict[str, Any] = {
                "input_shape": input_shape,
                "optimizer": optimizer,
                "loss": loss,
                "repeats": repeats,
                "budget": budget,
                "data": data,
                **({"recompute": policy_from_text(recompute)} if recompute else {}),
                "explain": explain,
            }
            if isolated:
                from memfit.isolate import measure_in_child

                result = measure_in_child(
                    target, size, classes=classes, safe_mode=not unsafe, **kwargs
                )
            else:

                def report(text: str, _status: Any = status) -> None:
                    _status.update(f"Measuring {text}")

                result = run_measure(target, size, on_progress=report, **kwargs)
            results.append(result)
            if not as_json:
                err.print(f"  {result}")
    if as_json:
        payload = [r.to_dict() for r in results]
        _print_json(payload[0] if len(payload) == 1 else {"measurements": payload})
        return
    _render_measurements(model, results)
    for result in results:
        if result.explanation is not None:
            _render_explanation(result.batch_size, result.explanation)


def _render_explanation(batch_size: int, explanation: Any, top: int = 10) -> None:
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


# -- batch ----------------------------------------------------------------------------------
def _margin(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    return _checked(check_margin, value)


@cli.command()
@click.argument("model", metavar="MODEL")
@click.option("--max-batch", type=int, help="Never try a batch larger than this.")
@click.option(
    "--margin",
    type=float,
    default=DEFAULT_MARGIN,
    show_default=True,
    callback=_margin,
    help="Share of the budget kept free at the batch found.",
)
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
@model_options
@budget_options
@json_option
def batch(
    model: str,
    max_batch: int | None,
    margin: float,
    soak_steps: int,
    in_process: bool,
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
    them. Without --memory or --device, the budget is this device's free memory.
    """
    if max_batch is not None:
        _checked(check_positive_int, max_batch, "max_batch", param_hint="'--max-batch'")
    check_model_spec(model)
    budget = apply_budget(memory, device) or Budget.from_device()
    from memfit.search import find_batch_size

    with err.status("Loading model", spinner="dots") as status:
        target, data = _targets(model, data_spec, not in_process, input_shape, classes, unsafe)
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
        )
    if as_json:
        _print_json(result.to_dict())
    else:
        style = "bold" if result.fits else "bold red"
        out.print(f"[{style}]{result.summary()}[/]")
    sys.exit(0 if result.fits else 1)


# -- plan -----------------------------------------------------------------------------------
@cli.command()
@click.argument("model", metavar="MODEL")
@click.option(
    "--batch-size",
    "-b",
    "batch_size",
    type=click.IntRange(min=1),
    required=True,
    help="The target effective batch (samples per optimizer update).",
)
@click.option(
    "--margin",
    type=float,
    default=DEFAULT_MARGIN,
    show_default=True,
    callback=_margin,
    help="Share of the budget kept free.",
)
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
    """
    check_model_spec(model)
    budget = resolve_budget(memory=memory, device=device) or Budget.from_device()
    from memfit.plan import plan as make_plan

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
        )
    if as_json:
        _print_json(result.to_dict())
    else:
        table = Table(title=f"plan for batch {batch_size} in {format_size(budget.usable_bytes)}")
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


# -- data -----------------------------------------------------------------------------------
@cli.group()
def data() -> None:
    """Check detection datasets and audit tf.data input pipelines."""


@data.command("check")
@click.argument("paths", nargs=-1, required=True, metavar="PATH_OR_GLOB...")
@click.option(
    "--schema",
    default="od-api",
    show_default=True,
    type=click.Choice(["od-api"]),
    help="Record layout to check against (TensorFlow Object Detection API).",
)
@click.option("--label-map", metavar="FILE", help="OD-API label map (.pbtxt) or class names.")
@click.option(
    "--model",
    metavar="MODEL",
    help="Measure what the largest image means for a training step of MODEL.",
)
@click.option(
    "--batch-size",
    "-b",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Batch size for the memory figures.",
)
@click.option("--no-decode", is_flag=True, help="Do not decode images (faster, checks less).")
@click.option(
    "--max-pixels",
    type=click.IntRange(min=1),
    default=None,
    help="Images with more pixels (read from their header) are problems and are not decoded "
    "(default 89478485, Pillow's limit: 256 MiB decoded as uint8 RGB).",
)
@json_option
def data_check(
    paths: tuple[str, ...],
    schema: str,
    label_map: str | None,
    model: str | None,
    batch_size: int,
    no_decode: bool,
    max_pixels: int | None,
    as_json: bool,
) -> None:
    """Check TFRecord files (plain or gzip) record by record: every problem with file and index.

    Exits with status 1 when a record has a problem, 0 when all are sound.
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from memfit.data.check import MAX_PIXELS
    from memfit.data.check import check as run_check

    if model is not None:
        check_model_spec(model)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=as_json or not err.is_terminal,
    ) as progress:
        task = progress.add_task("Reading records", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        result = run_check(
            list(paths),
            schema=schema,
            label_map=label_map,
            model=model,
            batch_size=batch_size,
            decode=not no_decode,
            on_progress=advance,
            max_pixels=max_pixels or MAX_PIXELS,
        )
    if as_json:
        _print_json(result.to_dict())
    else:
        _render_data_check(result)
    sys.exit(0 if result.ok else 1)


def _render_data_check(result: Any) -> None:
    if result.problems:
        table = Table(title="Problems", title_justify="left")
        for column in ("severity", "kind", "file", "record", "what"):
            table.add_column(column, justify="right" if column == "record" else "left")
        for p in result.problems[:200]:
            style = "bold red" if p.severity == "error" else "yellow"
            table.add_row(
                f"[{style}]{p.severity}[/]",
                p.kind,
                os.path.basename(p.file),
                str(p.index) if p.index >= 0 else "-",
                p.message,
            )
        out.print(table)
        if len(result.problems) > 200:
            out.print(f"... and {len(result.problems) - 200} more (--json lists all)")
    hist = Table(title="Images by longer side", title_justify="left")
    hist.add_column("pixels")
    hist.add_column("images", justify="right")
    for name, count in result.resolution_histogram.items():
        hist.add_row(name, str(count))
    out.print(hist)
    objects = ", ".join(f"{k}: {v}" for k, v in result.objects_histogram.items())
    out.print(f"Objects per image: {objects or '-'}")
    if result.largest:
        big = result.largest[0]
        out.print(
            f"Largest image: {big.width}x{big.height} (W x H), {os.path.basename(big.file)} "
            f"record {big.index}; a float32 batch of {result.batch_size} of it takes "
            f"{format_size(result.largest_batch_bytes())}"
        )
    if result.memory:
        out.print(f"Memory: {result.memory['message']}")
    style = "green" if result.ok else "bold red"
    out.print(f"[{style}]{result.summary()}[/]")


@data.command("audit")
@click.argument("dataset_fn", metavar="MODULE:DATASET_FN")
@click.option(
    "--steps",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="Elements to time after the first (0: lint only).",
)
@click.option(
    "--target-steps-per-second",
    type=click.FloatRange(min=0, min_open=True),
    help="Training steps per second the pipeline must keep up with.",
)
@click.option(
    "--model",
    metavar="MODEL",
    help="When a map enlarges images, measure this model's training step at the produced "
    "and the stored image size (a .keras file, package.module:factory or a built-in).",
)
@json_option
def data_audit(
    dataset_fn: str,
    steps: int,
    target_steps_per_second: float | None,
    model: str | None,
    as_json: bool,
) -> None:
    """Audit the tf.data pipeline a package.module:dataset_fn returns: findings and throughput.

    Also lists the image shapes the pipeline produces next to the sizes of the images stored
    in the TFRecords it reads, and flags a map that enlarges them. Exits with status 1 when a
    finding is a warning (or the target rate is missed).
    """
    module, _, attr = dataset_fn.partition(":")
    if not module or not attr or not all(p.isidentifier() for p in module.split(".")):
        raise click.BadParameter(
            f"{dataset_fn!r} is not of the form package.module:dataset_fn",
            param_hint="'MODULE:DATASET_FN'",
        )
    from memfit._child import load_dataset
    from memfit.data.audit import audit as run_audit

    with err.status("Building the dataset", spinner="dots") as status:
        dataset = load_dataset(dataset_fn)
        status.update(f"Auditing: linting, then timing {steps} elements")
        result = run_audit(
            dataset, steps=steps, target_steps_per_second=target_steps_per_second, model=model
        )
    if as_json:
        _print_json(result.to_dict())
    else:
        out.print(f"Pipeline: {' -> '.join(result.ops)}")
        for f in result.findings:
            style = "yellow" if f.severity == "warning" else "cyan"
            out.print(f"[{style}]{f.severity:>7}[/]  {f.kind}: {f.message}")
            out.print(f"         fix: {f.fix}")
        if result.elements_per_second is not None:
            batches = f", batch {result.batch_size}" if result.batch_size else ""
            out.print(
                f"Throughput: {result.elements_per_second:.1f} elements/s, "
                f"{result.samples_per_second:.1f} samples/s{batches} over {result.steps} "
                f"elements; first element after {result.first_element_seconds:.2f} s"
            )
        if result.element_shapes:
            shapes = ", ".join("x".join(map(str, s)) for s in result.element_shapes[:4])
            stored = ", ".join(f"{k} ({v})" for k, v in list(result.stored_sizes.items())[:4])
            out.print(f"Images: the pipeline yields {shapes}; stored: {stored or 'not read'}")
        verdict = "no findings" if not result.findings else f"{len(result.findings)} finding(s)"
        out.print(f"[{'green' if result.ok else 'bold red'}]{verdict}[/]")
    sys.exit(0 if result.ok else 1)


# -- report ---------------------------------------------------------------------------------
@cli.command()
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
        _print_json({**log_to_dict(runs), "html_path": written})
        return
    for loaded in runs:
        _render_report(loaded, len(runs))
    out.print(f"wrote {escape(written)}")


def _report_measurements(
    path: str, measurements: list[dict[str, Any]], out_path: str, as_json: bool
) -> None:
    """`memfit report` on `memfit measure --json` output: its page and its explanations."""
    from rich.markup import escape

    from memfit.explain import Explanation
    from memfit.report import build_measure_html

    directory = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(directory):
        raise MemfitError(f"cannot write {out_path}: folder {directory} does not exist")
    with open(out_path, "w", encoding="utf-8") as handle:
        handle.write(build_measure_html(measurements, os.path.basename(path)))
    if as_json:
        _print_json({"measurements": measurements, "html_path": out_path})
        return
    for m in measurements:
        if m.get("explanation"):
            _render_explanation(m["batch_size"], Explanation.from_dict(m["explanation"]))
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


# -- estimate -------------------------------------------------------------------------------
@cli.command()
@click.argument("model", metavar="MODEL")
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
    help="Also predict other batch sizes, the largest batch for the budget, and (for "
    "factories and built-ins) mixed precision, remat, the other optimizer, smaller inputs.",
)
@click.option(
    "--check", is_flag=True, help="Also measure the step (in a child process) and show the error."
)
@model_options
@budget_options
@json_option
def estimate(
    model: str,
    batch_size: int,
    precision: str | None,
    remat: str | None,
    what_ifs: bool,
    check: bool,
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
    """Predict the peak memory of one training step of MODEL without running it.

    Traces the training step (forward, backward, optimizer update) and replays it through a
    model of TensorFlow's allocator: a breakdown (weights, optimizer slots, activations,
    gradients, temporaries, kernel workspace), the top layers, when the peak happens, and
    what-ifs.
    """
    check_model_spec(model)
    check_batch_size(batch_size)
    if precision == "float32":
        precision = None
    budget = apply_budget(memory, device)
    from memfit.estimate import estimate as run_estimate

    with err.status("Loading model", spinner="dots") as status:

        def report(text: str) -> None:
            status.update(f"Estimating: {text}")

        target: Any = model
        data = None
        if data_spec or model.endswith((".keras", ".h5")) or unsafe:
            target, data = _targets(model, data_spec, False, input_shape, classes, unsafe)
        result = run_estimate(
            target,
            batch_size,
            input_shape=input_shape,
            optimizer=optimizer,
            loss=loss,
            data=data,
            budget=budget,
            precision=precision,
            remat=remat,
            classes=classes,
            what_ifs=what_ifs,
            on_progress=report,
        )
        measured = None
        if check:
            status.update("Measuring the step in a child process")
            from memfit.measure import measure as run_measure

            measured = run_measure(
                model,
                batch_size,
                isolated=True,
                input_shape=input_shape,
                optimizer=optimizer,
                loss=loss,
                data=data_spec,
                budget=budget,
            )
    payload = result.to_dict()
    if measured is not None:
        payload["check"] = _estimate_check(result.peak_bytes, measured)
    if as_json:
        _print_json(payload)
        return
    _render_estimate(model, result, payload.get("check"))


def _estimate_check(predicted: int, measured: Any) -> dict[str, Any]:
    peak = measured.peak_bytes
    return {
        "predicted_bytes": predicted,
        "measured_bytes": peak,
        "measured_oom": measured.oom,
        "measured_peaks_bytes": measured.peaks_bytes,
        "error": None if not peak or measured.oom else (predicted - peak) / peak,
    }


def _render_estimate(model: str, result: Any, check: dict[str, Any] | None) -> None:
    moment = result.peak_moment
    out.print(
        f"[bold]{model}[/], batch {result.batch_size}: predicted peak "
        f"[bold]{format_size(result.peak_bytes)}[/] — at the {moment.get('phase')} pass, layer "
        f"{moment.get('layer') or '-'} ({moment.get('op_type')})"
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
        whatif.add_column("saves", justify="right")
        for row in result.what_ifs:
            if "error" in row:
                # "not applicable: <why>", whole: the table wraps it (issue 20).
                whatif.add_row(row["change"], "", "n/a", row["error"].splitlines()[0])
                continue
            saved = row.get("saved_bytes")
            whatif.add_row(
                row["change"],
                str(row.get("batch_size") or "none fits"),
                format_size(row["peak_bytes"]) if row.get("peak_bytes") else "-",
                "" if saved is None else format_size(saved),
            )
        out.print(whatif)
    if result.budget is not None:
        verdict = "fits" if result.fits else "does NOT fit"
        out.print(f"{verdict} in {format_size(result.budget.usable_bytes)} ({result.budget.name})")
    if check is not None:
        if check["error"] is None:
            out.print(f"measured: out of memory (reached {format_size(check['measured_bytes'])})")
        else:
            out.print(
                f"measured peak {format_size(check['measured_bytes'])}; predicted "
                f"{format_size(check['predicted_bytes'])}; error {check['error']:+.1%}"
            )


# -- demo -----------------------------------------------------------------------------------
@cli.command()
@click.option(
    "--memory",
    metavar="SIZE",
    default=None,
    help="The emulated card (default 900MiB).",
)
@click.option(
    "--out",
    "out_dir",
    metavar="DIR",
    default="memfit-demo",
    show_default=True,
    help="Where the dataset, the training log and the HTML report go.",
)
@click.option("--quick", is_flag=True, help="A shortened demo: less data, no batch search or plan.")
@json_option
def demo(memory: str | None, out_dir: str, quick: bool, as_json: bool) -> None:
    """The whole memfit story on a real detector, under an emulated card.

    A keras-hub RetinaNet trains on generated detection data whose last shard holds images
    at twice the resolution: doctor, data check, estimate vs measure, batch, plan, plain
    model.fit dying, memfit.fit recovering, and the HTML report. Every step checks what it
    claims; the exit status is 1 when one did not show it. About 10 minutes on 2 CPU cores.
    """
    from memfit.demo import run_demo

    result = run_demo(memory=memory, out=out_dir, quick=quick, console=err)
    if as_json:
        _print_json(result.to_dict())
    sys.exit(0 if result.ok else 1)


# -- entry point ----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    """Run the CLI: user errors become one line on stderr and exit status 2."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.showwarning = _show_warning
    from memfit.emulate import environment_error  # what `import memfit` kept, if anything

    error = environment_error()
    if error is not None:  # a bad MEMFIT_MEMORY / MEMFIT_DEVICE
        _fail(str(error), 2)
    try:
        cli.main(args=argv, prog_name="memfit", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx and exc.ctx.parent else ""
        _fail(f"{exc.format_message()}{hint}", 2)
    except click.Abort:
        _fail("interrupted", 130)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except MemfitError as exc:
        _fail(str(exc), 2)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(0)


def _show_warning(message: Warning | str, *_args: Any, **_kwargs: Any) -> None:
    # A warning is one line for the user, not a source location and a code excerpt.
    line = " ".join(str(message).split())
    print(f"memfit: warning: {line}", file=sys.stderr)


def _fail(message: str, code: int) -> None:
    line = " ".join(message.split())
    print(f"memfit: error: {line}", file=sys.stderr)
    sys.exit(code)


__all__ = ["cli", "main", "MODEL_FORMS"]
