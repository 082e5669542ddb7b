"""The `memfit` command line: `memfit <command> [MODEL] [options]`.

The click group `cli` and the entry points `main` and `run` live in `app`; each command lives
in a module of this package (options.py: shared options, render.py: shared output).
"""

from memfit.cli.app import cli, main, run
from memfit.cli.datasets import data, data_audit, data_check
from memfit.cli.demonstration import demo
from memfit.cli.estimation import estimate
from memfit.cli.largest_batch import batch
from memfit.cli.measurement import measure
from memfit.cli.planning import plan
from memfit.cli.preflight import doctor
from memfit.cli.reporting import report
from memfit.workload.models import MODEL_FORMS

__all__ = [
    "cli",
    "main",
    "run",
    "MODEL_FORMS",
    "batch",
    "data",
    "data_audit",
    "data_check",
    "demo",
    "doctor",
    "estimate",
    "measure",
    "plan",
    "report",
]
