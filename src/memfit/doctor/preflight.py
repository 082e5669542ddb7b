"""Doctor: preflight of a machine — devices, free memory, who holds it, late settings."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.backend import tf as tfb
from memfit.budget import devices
from memfit.budget.budget import Budget, emulated_budget, emulated_memory_growth
from memfit.errors import BackendMissingError
from memfit.serialize import json_dict
from memfit.sizes import format_size

OK, WARNING, PROBLEM = "ok", "warning", "problem"

# Another process holding more than this share of a GPU is worth a warning.
_OTHERS_SHARE_WARN = 0.10
# Less free host RAM than this share makes tf.data buffers and checkpoints risky.
_HOST_FREE_WARN = 0.10

_GROWTH_SNIPPET = (
    "gpus = tf.config.list_physical_devices('GPU'); "
    "[tf.config.experimental.set_memory_growth(g, True) for g in gpus]"
)


@dataclass(frozen=True)
class Finding:
    """One thing the doctor checked: its verdict, what it saw, and what to do.

    Attributes:
        level: `"ok"`, `"warning"` or `"problem"`.
        topic: short name of what was checked (`"tensorflow"`, `"GPU:0 memory"`, ...).
        message: what was seen.
        fix: what to do about it (empty when `level` is ok).
    """

    level: str
    topic: str
    message: str
    fix: str = ""


@dataclass
class DoctorReport:
    """Everything `memfit doctor` found: devices, versions, budget and findings.

    `legacy_keras` is Keras 2 as this environment has it: `tf_keras_version` (None when not
    installed), `tf_use_legacy_keras` (TF_USE_LEGACY_KERAS is set: `tf.keras` is tf_keras),
    `model_garden_version` (tf-models-official, which builds tf_keras models).
    """

    devices: list[dict[str, Any]] = field(default_factory=list)
    host_memory: dict[str, int] = field(default_factory=dict)
    versions: dict[str, str | None] = field(default_factory=dict)
    budget: Budget | None = None
    emulated_budget: Budget | None = None
    tensorflow_initialized: bool = False
    legacy_keras: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def problems(self) -> list[Finding]:
        """Findings that will stop training as things stand."""
        return [f for f in self.findings if f.level == PROBLEM]

    @property
    def warnings(self) -> list[Finding]:
        """Findings that may cost memory or speed."""
        return [f for f in self.findings if f.level == WARNING]

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (sizes in bytes)."""
        return json_dict(
            self,
            "ok devices host_memory versions budget emulated_budget emulated_memory_growth "
            "tensorflow_initialized legacy_keras findings problems warnings",
            emulated_memory_growth=emulated_memory_growth() if self.emulated_budget else None,
            problems=len(self.problems),
            warnings=len(self.warnings),
        )


def doctor() -> DoctorReport:
    """Check this machine before training: devices, memory, holders, versions, settings.

    It never initialises TensorFlow's runtime, so it is safe to call at the top of a training
    script before memory growth or limits are set.

    Returns:
        A `DoctorReport`; `report.ok` is False when a problem was found, and each finding
        carries the fix.

    Example:
        ```python
        report = memfit.doctor()
        for finding in report.problems:    # what this machine gets wrong, if anything
            print(finding.message, "->", finding.fix)
        ```
    """
    report = DoctorReport()
    _check_host(report)
    versions = devices.nvml_driver_versions()
    try:
        report.versions = {**tfb.versions(), **versions, "python": sys.version.split()[0]}
        tf_ok = report.versions["tensorflow"] is not None
    except BackendMissingError:
        tf_ok = False
    _check_tensorflow(report, tf_ok)
    _check_legacy_keras(report)
    gpus, nvml_problem = devices.nvml_gpus()
    tf_gpus = tfb.gpu_settings() if tf_ok else []
    report.tensorflow_initialized = tfb.is_initialized()
    report.emulated_budget = emulated_budget()
    _check_gpus(report, gpus, nvml_problem, tf_gpus, tf_ok)
    _check_emulation(report)
    try:
        report.budget = Budget.from_device()
    except Exception as exc:  # noqa: BLE001 - the budget is informative, never fatal here
        report.findings.append(Finding(WARNING, "budget", f"could not read the budget: {exc}"))
    return report


def _check_host(report: DoctorReport) -> None:
    host = devices.host_memory()
    report.host_memory = {"total_bytes": host.total_bytes, "available_bytes": host.available_bytes}
    report.devices.append(
        {
            "name": "CPU:0",
            "type": "CPU",
            "description": "host",
            "total_bytes": host.total_bytes,
            "free_bytes": host.available_bytes,
            "used_bytes": host.total_bytes - host.available_bytes,
            "processes": [],
        }
    )
    share = host.available_bytes / host.total_bytes if host.total_bytes else 1.0
    if share < _HOST_FREE_WARN:
        report.findings.append(
            Finding(
                WARNING,
                "host RAM",
                f"only {format_size(host.available_bytes)} of {format_size(host.total_bytes)} "
                f"host RAM is free",
                "close other programs, or shrink tf.data buffers (shuffle, prefetch, cache)",
            )
        )
    else:
        report.findings.append(
            Finding(
                OK,
                "host RAM",
                f"{format_size(host.available_bytes)} free of {format_size(host.total_bytes)}",
            )
        )


def _check_tensorflow(report: DoctorReport, tf_ok: bool) -> None:
    if not tf_ok:
        report.findings.append(
            Finding(PROBLEM, "tensorflow", "TensorFlow is not installed", tfb.INSTALL_HINT)
        )
        return
    v = report.versions
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend != "tensorflow":
        report.findings.append(
            Finding(
                PROBLEM,
                "keras backend",
                f"KERAS_BACKEND is {backend!r}; memfit measures the TensorFlow backend",
                "set KERAS_BACKEND=tensorflow",
            )
        )
    cuda = f", built for CUDA {v['cuda']} / cuDNN {v['cudnn']}" if v.get("cuda") else ", CPU build"
    report.findings.append(
        Finding(OK, "tensorflow", f"TensorFlow {v['tensorflow']}, Keras {v.get('keras')}{cuda}")
    )


# The values TensorFlow itself reads as set (tensorflow/python/util/lazy_loader.py).
_LEGACY_KERAS_ON = ("true", "True", "1")


def distribution_version(*names: str) -> str | None:
    """The installed version of a distribution (the first of `names` found), or None.

    Reads package metadata only: nothing is imported, so TensorFlow is not initialised.

    Args:
        names: distribution names to try, in order (`"tf_keras"`, `"tf-keras"`).

    Example:
        >>> distribution_version("no-such-distribution") is None
        True
    """
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _check_legacy_keras(report: DoctorReport) -> None:
    """tf_keras (Keras 2), TF_USE_LEGACY_KERAS and the Model Garden: what memfit does with
    them. Versions come from package metadata: tf_keras is never imported here."""
    version = distribution_version("tf_keras", "tf-keras")
    garden = distribution_version("tf-models-official", "tf_models_official")
    raw = os.environ.get("TF_USE_LEGACY_KERAS")
    legacy = raw in _LEGACY_KERAS_ON
    report.legacy_keras = {
        "tf_keras_version": version,
        "tf_use_legacy_keras": legacy,
        "model_garden_version": garden,
    }
    report.versions["tf_keras"] = version
    report.versions["tf_models_official"] = garden
    if legacy and version is None:
        report.findings.append(
            Finding(
                PROBLEM,
                "tf_keras",
                f"TF_USE_LEGACY_KERAS={raw} makes tf.keras the legacy Keras 2 (tf_keras), but "
                f"tf_keras is not installed: tf.keras fails to import",
                "pip install tf_keras (the version of your TensorFlow), or unset "
                "TF_USE_LEGACY_KERAS to use Keras 3",
            )
        )
    elif legacy:
        report.findings.append(
            Finding(
                WARNING,
                "tf_keras",
                f"TF_USE_LEGACY_KERAS={raw}: tf.keras is tf_keras {version} (Keras 2), not Keras "
                f"3; a model built with tf.keras is a Keras 2 model: memfit.Watch and "
                f"memfit.GuardedStep take it, memfit measure, batch, plan and memfit.fit "
                f"need Keras 3 models",
                "for those, build the model with import keras (Keras 3); keep "
                "TF_USE_LEGACY_KERAS for code that needs Keras 2 (the Model Garden)",
            )
        )
    elif version is not None:
        report.findings.append(
            Finding(
                OK,
                "tf_keras",
                f"tf_keras {version} (Keras 2) is installed; TF_USE_LEGACY_KERAS is not set, so "
                f"tf.keras is Keras 3. memfit.Watch works in tf_keras' model.fit",
            )
        )
    if garden is not None and version is None:
        report.findings.append(
            Finding(
                PROBLEM,
                "model garden",
                f"tf-models-official {garden} is installed but tf_keras is not: the Model "
                f"Garden builds its models with tf_keras",
                "pip install tf_keras (the version of your TensorFlow)",
            )
        )
    elif garden is not None:
        report.findings.append(
            Finding(
                OK,
                "model garden",
                f"tf-models-official {garden} (the TF Model Garden): its tasks build tf_keras "
                f"models and train them through the task's own train_step, so memfit's Keras 3 "
                f"tools (measure, batch, plan, memfit.fit) do not apply to them; guard the "
                f"task's step with memfit.GuardedStep and watch it with memfit.Watch",
            )
        )


def _check_gpus(
    report: DoctorReport,
    gpus: list[devices.GpuInfo],
    nvml_problem: str | None,
    tf_gpus: list[dict[str, Any]],
    tf_ok: bool,
) -> None:
    my_pid = os.getpid()
    for gpu in gpus:
        others = [p for p in gpu.processes if p.pid != my_pid]
        report.devices.append(
            {
                "name": f"GPU:{gpu.index}",
                "type": "GPU",
                "description": gpu.name,
                "total_bytes": gpu.total_bytes,
                "free_bytes": gpu.free_bytes,
                "used_bytes": gpu.used_bytes,
                "compute_capability": list(gpu.compute_capability)
                if gpu.compute_capability
                else None,
                "processes": [asdict(p) for p in gpu.processes],
            }
        )
        held = sum(p.used_bytes or 0 for p in others)
        if others and (held > _OTHERS_SHARE_WARN * gpu.total_bytes or held == 0):
            listing = ", ".join(
                f"{p.name} (pid {p.pid}, {format_size(p.used_bytes)})" for p in others
            )
            report.findings.append(
                Finding(
                    WARNING,
                    f"GPU:{gpu.index} memory",
                    f"other processes hold {format_size(held)} of {gpu.name}'s "
                    f"{format_size(gpu.total_bytes)}: {listing}",
                    "stop them (kill PID) or pick another GPU with CUDA_VISIBLE_DEVICES; "
                    "TensorFlow only gets what is free when it starts",
                )
            )
        else:
            report.findings.append(
                Finding(
                    OK,
                    f"GPU:{gpu.index} memory",
                    f"{gpu.name}: {format_size(gpu.free_bytes)} free of "
                    f"{format_size(gpu.total_bytes)}",
                )
            )
    if gpus and tf_ok and not tf_gpus:
        report.findings.append(
            Finding(
                PROBLEM,
                "GPU visibility",
                f"the driver reports {len(gpus)} GPU(s) but TensorFlow sees none: training "
                f"would run on the CPU",
                'install the CUDA build: pip install "memfit[gpu]" (tensorflow[and-cuda]); '
                "check CUDA_VISIBLE_DEVICES",
            )
        )
    if not gpus and tf_gpus:
        report.findings.append(
            Finding(
                WARNING,
                "NVML",
                f"TensorFlow sees {len(tf_gpus)} GPU(s) but NVML could not report memory "
                f"({nvml_problem}); free memory and other processes are unknown",
                "pip install nvidia-ml-py, and check that the NVIDIA driver is loaded",
            )
        )
    if not gpus and not tf_gpus:
        report.findings.append(
            Finding(
                OK,
                "devices",
                "no GPU: training runs on the CPU"
                + (
                    f" ({nvml_problem})" if nvml_problem and "not installed" in nvml_problem else ""
                ),
            )
        )
    _check_gpu_settings(report, tf_gpus)


def _check_gpu_settings(report: DoctorReport, tf_gpus: list[dict[str, Any]]) -> None:
    forced = os.environ.get(tfb.ENV_GROWTH, "").lower() == "true"
    initialized = report.tensorflow_initialized
    for gpu in tf_gpus:
        name = gpu["name"].replace("/physical_device:", "")
        growth = gpu["memory_growth"] or forced
        limits = gpu["memory_limits_bytes"]
        if limits:
            report.findings.append(
                Finding(
                    OK,
                    f"{name} settings",
                    f"memory limit {format_size(limits[0])} set"
                    + (" (TensorFlow initialised after it)" if initialized else ""),
                )
            )
        elif growth:
            report.findings.append(
                Finding(
                    OK, f"{name} settings", "memory growth on: TensorFlow takes memory as needed"
                )
            )
        elif initialized:
            report.findings.append(
                Finding(
                    WARNING,
                    f"{name} settings",
                    "TensorFlow has initialised this GPU with neither memory growth nor a limit: "
                    "it reserved nearly all free memory, and both settings are now fixed",
                    f"set them before the first TensorFlow op or model: {_GROWTH_SNIPPET}; or "
                    f"export {tfb.ENV_GROWTH}=true",
                )
            )
        else:
            report.findings.append(
                Finding(
                    WARNING,
                    f"{name} settings",
                    "neither memory growth nor a memory limit is set: TensorFlow will reserve "
                    "nearly all free GPU memory at start, leaving none to other processes",
                    f"before the first op: {_GROWTH_SNIPPET}; or export {tfb.ENV_GROWTH}=true",
                )
            )


def _check_emulation(report: DoctorReport) -> None:
    emulated = report.emulated_budget
    if emulated is None:
        return
    applied = tfb.cpu_allocator_limit() is not None or emulated.device == "GPU:0"
    mode = (
        "memory growth on: regions that grow as training needs them"
        if emulated_memory_growth()
        else "memory growth off: the whole budget is one region from the start"
    )
    message = (
        f"emulating {emulated.name}: training sees {format_size(emulated.usable_bytes)} ({mode})"
    )
    if emulated.device == "CPU:0" and tfb.onednn_enabled():
        report.findings.append(
            Finding(
                PROBLEM,
                "emulation",
                message + ", but oneDNN is on: an OOM may crash the process instead of raising",
                "set TF_ENABLE_ONEDNN_OPTS=0 before importing TensorFlow",
            )
        )
    elif not applied:
        report.findings.append(
            Finding(
                PROBLEM,
                "emulation",
                message + ", but the allocator limit is not set in this process",
                "call memfit.emulate() before building any model or tensor",
            )
        )
    elif emulated.device == "CPU:0" and emulated.usable_bytes > report.host_memory.get(
        "total_bytes", emulated.usable_bytes
    ):
        host = format_size(report.host_memory["total_bytes"])
        report.findings.append(
            Finding(
                WARNING,
                "emulation",
                message + f", more than this machine's {host} of RAM: training here runs out "
                f"of host memory before it reaches the budget",
                f"emulate a budget under {host}, or measure on the card itself",
            )
        )
    else:
        report.findings.append(Finding(OK, "emulation", message))
