"""What the machine has: GPUs seen by NVML (memory, processes holding it) and host RAM."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import psutil

from memfit.serialize import json_dict


@dataclass(frozen=True)
class GpuProcess:
    """A process that holds memory on a GPU."""

    pid: int
    name: str
    used_bytes: int | None


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as NVML reports it."""

    index: int
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    compute_capability: tuple[int, int] | None = None
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (sizes in bytes)."""
        return json_dict(self, processes=list(self.processes))


@dataclass(frozen=True)
class HostMemory:
    """Host RAM: total and what new allocations can still get."""

    total_bytes: int
    available_bytes: int


def host_memory() -> HostMemory:
    """Host RAM from psutil."""
    vm = psutil.virtual_memory()
    return HostMemory(total_bytes=int(vm.total), available_bytes=int(vm.available))


def _process_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return "?"


def nvml_gpus() -> tuple[list[GpuInfo], str | None]:
    """All GPUs NVML reports, with the processes holding their memory.

    Returns:
        (gpus, problem): `problem` is None when NVML answered, else why it could not (no
        driver, no NVIDIA GPU, nvidia-ml-py missing); `gpus` is then empty.
    """
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - any NVML failure means "no GPU info here"
        return [], f"NVML unavailable ({exc.__class__.__name__}: {exc})"
    gpus: list[GpuInfo] = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                cc = tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle))
            except Exception:  # noqa: BLE001
                cc = None
            procs: list[GpuProcess] = []
            for getter in (
                pynvml.nvmlDeviceGetComputeRunningProcesses,
                pynvml.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                try:
                    running = getter(handle)
                except Exception:  # noqa: BLE001 - not supported on some drivers/containers
                    continue
                for proc in running:
                    used = getattr(proc, "usedGpuMemory", None)
                    procs.append(
                        GpuProcess(
                            pid=int(proc.pid),
                            name=_process_name(int(proc.pid)),
                            used_bytes=int(used) if isinstance(used, int) else None,
                        )
                    )
            gpus.append(
                GpuInfo(
                    index=index,
                    name=name,
                    total_bytes=int(mem.total),
                    used_bytes=int(mem.used),
                    free_bytes=int(mem.free),
                    compute_capability=cc,  # type: ignore[arg-type]
                    processes=tuple(procs),
                )
            )
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return gpus, None


def nvml_driver_versions() -> dict[str, str | None]:
    """The NVIDIA driver version and the CUDA version it supports, if NVML answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return {"driver": None, "cuda_driver": None}
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return {"driver": driver, "cuda_driver": f"{cuda // 1000}.{(cuda % 1000) // 10}"}
    except Exception:  # noqa: BLE001
        return {"driver": None, "cuda_driver": None}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
