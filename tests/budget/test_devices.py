"""What the machine has: NVML's GPUs and processes, driver versions, host RAM (NVML faked)."""

from __future__ import annotations

import os
import sys
import types
from collections import namedtuple
from typing import Any

import pytest

from memfit.budget import devices
from memfit.budget.devices import GpuInfo, GpuProcess, HostMemory

Memory = namedtuple("Memory", "total used free")
Proc = namedtuple("Proc", "pid usedGpuMemory")
GIB = 2**30


class FakeNvml(types.ModuleType):
    """A `pynvml` with two GPUs: bytes names, one without a compute capability."""

    def __init__(self, init_error: Exception | None = None) -> None:
        super().__init__("pynvml")
        self.init_error = init_error
        self.shutdowns = 0

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetName(self, handle: int) -> Any:  # noqa: N802
        return b"NVIDIA H100 80GB HBM3" if handle == 0 else "Tesla T4"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Memory:  # noqa: N802
        return Memory(80 * GIB, 2 * GIB, 78 * GIB) if handle == 0 else Memory(16 * GIB, 0, 16 * GIB)

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:  # noqa: N802
        if handle == 1:
            raise RuntimeError("not supported")
        return (9, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Proc]:  # noqa: N802
        # This test process (a real name from psutil) and one whose memory NVML cannot tell.
        return [Proc(os.getpid(), 2 * GIB), Proc(2**22 + 7, None)] if handle == 0 else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Proc]:  # noqa: N802
        raise RuntimeError("not supported in containers")

    def nvmlSystemGetDriverVersion(self) -> bytes:  # noqa: N802
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        return 12040


def test_nvml_gpus_reads_every_gpu_and_the_processes_holding_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import psutil

    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpus, problem = devices.nvml_gpus()
    assert problem is None
    assert nvml.shutdowns == 1
    me = psutil.Process(os.getpid()).name()
    assert gpus == [
        GpuInfo(
            index=0,
            name="NVIDIA H100 80GB HBM3",
            total_bytes=80 * GIB,
            used_bytes=2 * GIB,
            free_bytes=78 * GIB,
            compute_capability=(9, 0),
            processes=(
                GpuProcess(pid=os.getpid(), name=me, used_bytes=2 * GIB),
                GpuProcess(pid=2**22 + 7, name="?", used_bytes=None),  # no such process
            ),
        ),
        GpuInfo(
            index=1,
            name="Tesla T4",
            total_bytes=16 * GIB,
            used_bytes=0,
            free_bytes=16 * GIB,
            compute_capability=None,
            processes=(),
        ),
    ]


def test_nvml_gpus_says_why_it_has_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert devices.nvml_gpus() == ([], "nvidia-ml-py is not installed")
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(OSError("libnvidia-ml.so.1 missing")))
    assert devices.nvml_gpus() == ([], "NVML unavailable (OSError: libnvidia-ml.so.1 missing)")


def test_driver_versions_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert devices.nvml_driver_versions() == {"driver": "550.54.15", "cuda_driver": "12.4"}
    assert nvml.shutdowns == 1
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(RuntimeError("no driver")))
    assert devices.nvml_driver_versions() == {"driver": None, "cuda_driver": None}


def test_gpu_info_to_dict_lists_its_processes_as_dicts() -> None:
    info = GpuInfo(
        index=3,
        name="G",
        total_bytes=10,
        used_bytes=4,
        free_bytes=6,
        compute_capability=(8, 6),
        processes=(GpuProcess(pid=1, name="python", used_bytes=4),),
    )
    assert info.to_dict() == {
        "index": 3,
        "name": "G",
        "total_bytes": 10,
        "used_bytes": 4,
        "free_bytes": 6,
        "compute_capability": (8, 6),
        "processes": [{"pid": 1, "name": "python", "used_bytes": 4}],
    }


def test_host_memory_is_psutil_total_and_available(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    fake = types.SimpleNamespace(total=64 * GIB, available=12.0 * GIB, used=50 * GIB)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: fake)
    memory = devices.host_memory()
    assert memory == HostMemory(total_bytes=64 * GIB, available_bytes=12 * GIB)
    assert isinstance(memory.available_bytes, int)


def test_host_memory_on_this_machine_is_plausible() -> None:
    memory = devices.host_memory()
    assert 0 < memory.available_bytes <= memory.total_bytes
