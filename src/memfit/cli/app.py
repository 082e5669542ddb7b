"""The click group `cli` with every command, and the entry points `main` and `run`."""


from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import warnings
from typing import Any

import click

from memfit.cli.datasets import data
from memfit.cli.demonstration import demo
from memfit.cli.estimation import estimate
from memfit.cli.largest_batch import batch
from memfit.cli.measurement import measure
from memfit.cli.planning import plan
from memfit.cli.preflight import doctor
from memfit.cli.reporting import report
from memfit.errors import MemfitError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="memfit", prog_name="memfit")
def cli() -> None:
    """memfit: make TensorFlow/Keras training fit in memory and stay alive.

    doctor, estimate, measure, batch and plan take --memory SIZE or --device CARD to emulate
    a smaller card (real out-of-memory errors beyond it; demo takes --memory); every command
    takes --json for machine-readable output.
    """


for _command in (doctor, estimate, measure, batch, plan, report, demo, data):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: user errors become one line on stderr and exit status 2."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.showwarning = _show_warning
    from memfit.budget.emulation import environment_error  # what `import memfit` kept, if anything

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


def run() -> None:
    """The console entry point: `main`, then leave the process without tearing TensorFlow down.

    A process that imported TensorFlow spends 1-2 s at exit freeing its graphs and modules
    (an estimate of ResNet50: 1.4 s of 15). Once the command is done and its output flushed,
    that work is for nothing: `run` runs the exit handlers (temporary files, child
    processes) and ends the process. Other threads still running, or no TensorFlow, get the
    ordinary exit. In-process callers (a notebook, tests) use `main`, which returns by
    `SystemExit` as any click program does.
    """
    try:
        main()
    except SystemExit as exc:
        code = exc.code
        if code is None:
            code = 0
        elif not isinstance(code, int):  # sys.exit("text") prints it, status 1
            print(code, file=sys.stderr)
            code = 1
        _leave(code)


def _leave(code: int) -> None:
    """End the process with `code`: at once after the exit handlers where that is safe."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if "tensorflow" not in sys.modules or any(not t.daemon for t in others):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to reach
            stream.flush()
    os._exit(code)


def _show_warning(message: Warning | str, *_args: Any, **_kwargs: Any) -> None:
    # A warning is one line for the user, not a source location and a code excerpt.
    line = " ".join(str(message).split())
    print(f"memfit: warning: {line}", file=sys.stderr)


def _fail(message: str, code: int) -> None:
    line = " ".join(message.split())
    print(f"memfit: error: {line}", file=sys.stderr)
    sys.exit(code)
