"""`memfit data check` and `memfit data audit`: detection datasets and tf.data pipelines."""

from __future__ import annotations

import os
from typing import Any

import click
from rich.table import Table

from memfit.cli.options import count_option, json_option
from memfit.cli.render import answer, err, out
from memfit.sizes import format_size
from memfit.workload.models import check_model_spec


@click.group()
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
@count_option("--batch-size", "-b", default=8, help="Batch size for the memory figures.", minimum=1)
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

    # Imported when the command runs: the CLI starts without it.
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
    answer(result, as_json, _render_data_check, result.ok)


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
@count_option("--steps", default=50, help="Elements to time after the first (0: lint only).")
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
@click.option(
    "--workers",
    metavar="N,N,...",
    callback=lambda ctx, param, value: _worker_counts(value),
    help="Also time the pipeline read from this many local tf.data service workers "
    "(e.g. 0,1,2,4; 0 is this process) and say how many keep up.",
)
@json_option
def data_audit(
    dataset_fn: str,
    steps: int,
    target_steps_per_second: float | None,
    model: str | None,
    workers: tuple[int, ...],
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
    # Imported when the command runs: the CLI starts without it.
    from memfit.data.audit import audit as run_audit
    from memfit.workload.models import call_factory

    with err.status("Building the dataset", spinner="dots") as status:
        dataset = call_factory(dataset_fn)  # the dataset function's tf.data.Dataset
        status.update(
            f"Auditing: linting, then timing {steps} elements"
            + (f" (and on {', '.join(map(str, workers))} service workers)" if workers else "")
        )
        result = run_audit(
            dataset,
            steps=steps,
            target_steps_per_second=target_steps_per_second,
            model=model,
            workers=workers,
        )
    answer(result, as_json, _render_audit, result.ok)


def _render_audit(result: Any) -> None:
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
    if result.service_rates:
        rates = ", ".join(
            f"{n} {'(this process)' if n == 0 else 'workers'} {r:.1f}/s"
            for n, r in sorted(result.service_rates.items())
        )
        goal = (
            f"the target {result.target_steps_per_second:g}/s"
            if result.target_steps_per_second
            else "within 10% of the fastest"
        )
        enough = (
            f"{result.service_workers} reach {goal} (memfit.fit(..., "
            f"data_service={result.service_workers}))"
            if result.service_workers is not None
            else f"none reaches {goal}"
        )
        out.print(f"tf.data service: {rates}; {enough}")
    if result.service_note:
        out.print(f"tf.data service: {result.service_note}")
    verdict = "no findings" if not result.findings else f"{len(result.findings)} finding(s)"
    out.print(f"[{'green' if result.ok else 'bold red'}]{verdict}[/]")


def _worker_counts(value: str | None) -> tuple[int, ...]:
    """`--workers 0,1,2,4` as a tuple of counts; a bad list is a usage error."""
    if not value:
        return ()
    try:
        counts = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        counts = (-1,)
    if not counts or any(n < 0 or n > 64 for n in counts):
        raise click.BadParameter(
            f"{value!r} is not a list of worker counts (0 to 64), e.g. 0,1,2,4",
            param_hint="'--workers'",
        )
    return counts
