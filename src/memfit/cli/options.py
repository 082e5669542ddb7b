"""Shared click options, built from the library's own defaults, and what their values become.

`--memory` / `--device` / `--memory-growth` (the budget to emulate), `--json`, the options that
say how to build MODEL (`--input-shape`, `--classes`, `--optimizer`, `--loss`, `--data`,
`--unsafe`, given as one `workload` argument), `--margin` and `--replicas`; `apply_budget` and
`replica_budget_specs` turn their values into a budget and a replica count.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import click

from memfit.budget.budget import (
    Budget,
    resolve_budget,
    resolve_budgets,
    split_budget_list,
    tightest_index,
)
from memfit.checks import DEFAULT_MARGIN, check_batch_size, check_margin
from memfit.errors import MemfitError
from memfit.workload.spec import WorkloadSpec


def _memory_growth(_ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    # Read by `apply_budget` (and inherited by child processes) from the environment.
    if value:
        # Imported when the command runs: the CLI starts without it.
        from memfit.budget.budget import ENV_MEMORY_GROWTH

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
    # Imported when the command runs: the CLI starts without it.
    from memfit.budget.budget import emulated_memory_growth
    from memfit.budget.emulation import emulate, ensure_memory_statistics

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
    # Imported when the command runs: the CLI starts without it.
    from memfit.backend import tf as tfb
    from memfit.errors import EmulationError

    if tfb.gpu_count() == 0:
        raise EmulationError(
            "--memory-growth describes how an emulated card's allocator grows, and this "
            "machine has no GPU: add --memory SIZE or --device CARD"
        )
    os.environ[tfb.ENV_GROWTH] = "true"


def checked(check: Callable[..., Any], value: Any, *args: Any, param_hint: Any = None) -> Any:
    """`check(value, *args)` (a `memfit.checks` check), its error as a bad option (exit 2)."""
    try:
        return check(value, *args)
    except MemfitError as exc:
        raise click.BadParameter(str(exc), param_hint=param_hint) from None


def batch_sizes(_ctx: click.Context, _param: click.Parameter, value: str) -> list[int]:
    """`--batch-size 1,4,16`: the sizes, each checked by `memfit.checks.check_batch_size`."""
    sizes = []
    for part in str(value).split(","):
        part = part.strip()
        number = int(part) if part.lstrip("-").isdigit() else part
        sizes.append(checked(check_batch_size, number))
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


def workload_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """MODEL and the options that say how to build it and its training step (`--input-shape`,
    `--classes`, `--optimizer`, `--loss`, `--data`, `--unsafe`; `--set`, `--params` for a
    Model Garden task), given to the command as one
    `workload` argument: a `memfit.workload.spec.WorkloadSpec`, checked once."""

    @functools.wraps(command)
    def with_workload(
        *args: Any,
        model: str,
        input_shape: Any,
        classes: int | None,
        optimizer: str | None,
        loss: str | None,
        data_spec: str | None,
        unsafe: bool,
        overrides: tuple[str, ...],
        params: tuple[str, ...],
        **kwargs: Any,
    ) -> Any:
        workload = WorkloadSpec(
            model,
            input_shape=input_shape,
            data=data_spec,
            optimizer=optimizer,
            loss=loss,
            classes=classes,
            safe_mode=not unsafe,
            overrides=overrides,
            params=params,
        )
        if workload.is_task:
            # Imported when the command runs: the CLI starts without it.
            from memfit.backend.tf_garden import require_garden

            require_garden(model)  # one line here, before any child process starts
        return command(*args, workload=workload, **kwargs)

    options = [
        click.argument("model", metavar="MODEL"),
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
            help=(
                "package.module:dataset_fn returning a tf.data.Dataset of (x, y) samples. "
                "One that repeats for ever (or of unknown length) is read up to its first "
                "1000 samples."
            ),
        ),
        click.option(
            "--unsafe",
            is_flag=True,
            help="Load .keras files that run Python code (Lambda layers); trusted files only.",
        ),
        click.option(
            "--set",
            "overrides",
            multiple=True,
            metavar="KEY=VALUE",
            help="For a Model Garden task (MODEL garden:EXPERIMENT): override one value of its "
            "experiment config, e.g. task.model.input_size=[128,128,3]. Repeatable.",
        ),
        click.option(
            "--params",
            "params",
            multiple=True,
            metavar="YAML",
            help="For a Model Garden task: a YAML/JSON file (or text) of config overrides, as "
            "the Model Garden's --params_override takes; applied before --set. Repeatable.",
        ),
    ]
    for option in reversed(options):
        with_workload = option(with_workload)
    return with_workload


def count_option(
    *names: str, default: int, help: str, minimum: int = 0
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An option that counts (steps, repeats, samples): a whole number from `minimum`, with
    its default shown in `--help`."""
    return click.option(
        *names, type=click.IntRange(min=minimum), default=default, show_default=True, help=help
    )


def workload_command(
    *, replicas: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of a command that analyses MODEL: `--replicas` (with `replicas`), MODEL
    and its options as one `workload` argument, the budget, and `--json`."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        # Applied innermost first: `--help` lists them in this order, from the top.
        command = workload_options(budget_options(json_option(command)))
        return replicas_option(command) if replicas else command

    return decorate


def _margin(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    return checked(check_margin, value)


def margin_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--margin`: the share of the budget kept free (default `memfit.checks.DEFAULT_MARGIN`)."""
    return click.option(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        show_default=True,
        callback=_margin,
        help=help_text,
    )


def replicas_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--replicas N`: data-parallel replicas sharing the batch (`memfit.measuring.replicas`)."""
    return click.option(
        "--replicas",
        type=int,
        metavar="N",
        help="Data-parallel replicas (tf.distribute) sharing the global batch; default 1, or "
        "one per budget when --memory / --device list several (15GiB,22GiB or T4,L4): the "
        "tightest decides.",
    )(command)


def replica_budget_specs(
    memory: str | None, device: str | None, replicas: int | None
) -> tuple[str | None, str | None, int]:
    """`--memory` / `--device` reduced to the tightest replica's, and the replica count.

    A comma-separated value names one budget per replica (`--device T4,L4`); the replica
    count is `--replicas`, else the number of budgets, else 1, and they must agree.

    Returns:
        `(memory, device, replicas)`: the tightest budget as `--memory` / `--device` would
        name it alone, and the count.

    Raises:
        MemfitError: an empty entry, an unknown card or size, or counts that disagree.
    """
    # Imported when the command runs: the CLI starts without it.
    from memfit.measuring.replicas import replica_count

    raw = memory if memory is not None else device
    if raw is None or "," not in raw:
        return memory, device, replica_count(replicas)
    budgets = resolve_budgets(memory=memory, device=device)
    count = replica_count(replicas, None, len(budgets))
    tightest = split_budget_list(raw)[tightest_index(budgets)]
    return (tightest, None, count) if memory is not None else (None, tightest, count)
