"""`memfit demo`: the whole memfit story on a real detector, under an emulated card."""

from __future__ import annotations

import sys

import click

from memfit.cli.options import (
    json_option,
)
from memfit.cli.render import err, print_json


@click.command()
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
    # Imported when the command runs: the CLI starts without it.
    from memfit.demo import run_demo

    result = run_demo(memory=memory, out=out_dir, quick=quick, console=err)
    if as_json:
        print_json(result.to_dict())
    sys.exit(0 if result.ok else 1)
