"""memfit: make TensorFlow/Keras training fit in memory and stay alive.

Public API (everything else is private):
- `Budget`, `emulate`: the memory a device gives training, and emulating a smaller card.
- `measure`, `Measurement`: what one training step really costs; `Explanation`: what was
  alive at its peak (`measure(..., explain=True)`).
- `estimate`, `Estimate`: a step's peak predicted without running it, with a breakdown.
- `find_batch_size`, `BatchSearchResult`: the largest batch that fits a budget.
- `doctor`: preflight of this machine.
- `load_model`, `Workload`: MODEL arguments and what a training step is made of.
- `parse_size`, `format_size`, `CARDS`: sizes and named cards.
- `Options`: the knobs of the analyses that few runs change (`options=` of each).
- `Watch`, `WatchFinding`: a Keras callback that watches training (memory growth, retracing,
  input-bound, divergence, OOM) and says why and what to do; `memfit report` shows its log.
- `recompute`, `Recompute`, `RecomputeReport`: gradient checkpointing that saves memory on
  TensorFlow (segments of the layer graph under `tf.recompute_grad`).
- `fit(..., backup_dir=...)`: preemption-safe training (`memfit.training.backup`: the checkpoint,
  SIGTERM, the resume; `BackupError`).
- `MemfitError` and its subclasses: every error a user can fix; `MemfitWarning`: what a
  user should know that does not stop the work (an uncompiled model compiled by memfit).
- `data`: dataset checks (`memfit.data.check`), tf.data pipeline audit (`memfit.data.audit`),
  a detection input pipeline (`memfit.data.detection_pipeline`); `DataError`.

Setting `MEMFIT_MEMORY=2GiB` or `MEMFIT_DEVICE=T4` in the environment emulates that budget as
soon as memfit is imported (before TensorFlow initialises).
"""

from __future__ import annotations

from memfit import data  # subpackage; imports TensorFlow only when used
from memfit.budget.budget import Budget
from memfit.budget.cards import CARDS, Card, get_card
from memfit.budget.emulation import defer_environment_error, emulate, emulate_from_environment
from memfit.checks import Options
from memfit.doctor.preflight import DoctorReport, Finding, doctor
from memfit.errors import (
    BackendMissingError,
    BackupError,
    DataError,
    DistributedError,
    EmulationError,
    MeasurementError,
    MemfitError,
    MemfitWarning,
    ModelLoadError,
    RecomputeError,
    SizeError,
    UnknownDeviceError,
    WorkloadError,
)
from memfit.estimation import Estimate, estimate
from memfit.measuring.explain import Explanation
from memfit.measuring.measurer import Measurement, measure, measure_many
from memfit.planning import Candidate, Plan, plan
from memfit.recomputation.remat import Recompute, RecomputeReport, recompute
from memfit.search import BatchSearchResult, Trial, find_batch_size
from memfit.sizes import format_size, parse_size
from memfit.training.fitting import fit
from memfit.training.guarded_step import GuardedStep
from memfit.training.recovery import FitSummary, Recovery
from memfit.watch import WatchFinding, watch_class
from memfit.workload.models import load_model
from memfit.workload.workload import Workload

__version__ = "0.1.0"

__all__ = [
    "CARDS",
    "BackendMissingError",
    "BackupError",
    "BatchSearchResult",
    "Budget",
    "Candidate",
    "Card",
    "DataError",
    "DistributedError",
    "DoctorReport",
    "EmulationError",
    "Estimate",
    "Explanation",
    "Finding",
    "FitSummary",
    "GuardedStep",
    "MeasurementError",
    "Measurement",
    "MemfitError",
    "MemfitWarning",
    "ModelLoadError",
    "Options",
    "Plan",
    "Recompute",
    "RecomputeError",
    "RecomputeReport",
    "Recovery",
    "SizeError",
    "Trial",
    "UnknownDeviceError",
    "Watch",  # noqa: F822 - built on first use by __getattr__ below
    "WatchFinding",
    "Workload",
    "WorkloadError",
    "data",
    "doctor",
    "emulate",
    "estimate",
    "find_batch_size",
    "fit",
    "format_size",
    "get_card",
    "load_model",
    "measure",
    "measure_many",
    "parse_size",
    "plan",
    "recompute",
]


def __getattr__(name: str) -> object:
    # `Watch` subclasses keras.callbacks.Callback: built on first use, so that `import memfit`
    # does not import Keras (emulation must come before TensorFlow initialises).
    if name == "Watch":
        return watch_class()
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")


def _invoked_as_cli() -> bool:
    """Whether this process is the `memfit` command (console script or `python -m memfit`)."""
    import os
    import sys

    script = os.path.basename(sys.argv[0] if sys.argv else "")
    if script in ("memfit", "memfit.exe", "memfit-script.py"):
        return True
    argv = list(getattr(sys, "orig_argv", ()))[1:]
    while argv:
        arg = argv.pop(0)
        if arg in ("-W", "-X"):  # the interpreter's options that take a value
            argv = argv[1:]
        elif arg.startswith("-m"):
            module = arg[2:] or (argv[0] if argv else "")
            return module in ("memfit", "memfit.__main__")
        elif arg.startswith("-c") or arg == "-" or not arg.startswith("-"):
            return False  # python -c CODE, python SCRIPT: not the command
    return False


def _emulate_from_environment() -> None:
    # Under the `memfit` command a bad MEMFIT_MEMORY / MEMFIT_DEVICE is kept for `cli.main`,
    # which prints it as one `memfit: error:` line (exit 2). `import memfit` itself never exits.
    try:
        emulate_from_environment()
    except MemfitError as error:
        if not _invoked_as_cli():
            raise

        defer_environment_error(error)


_emulate_from_environment()
