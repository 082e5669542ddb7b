"""Budget: the memory one device gives training."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from memfit.backend import tf as tfb
from memfit.budget import cards, devices
from memfit.errors import MemfitError, UnknownDeviceError
from memfit.serialize import json_dict
from memfit.sizes import format_size, parse_size

_DEVICE_RE = re.compile(r"^(?:/?(?:physical_)?device:)?(CPU|GPU):?(\d*)$", re.IGNORECASE)

# Environment variables memfit sets when it emulates a card, so that child processes (isolated
# measurements, tests) and `memfit doctor` see the same budget.
ENV_EMULATED_BYTES = "MEMFIT_EMULATED_BYTES"
ENV_EMULATED_NAME = "MEMFIT_EMULATED_NAME"
ENV_EMULATED_ON = "MEMFIT_EMULATED_ON"
ENV_MEMORY_GROWTH = "MEMFIT_MEMORY_GROWTH"
_EMULATION_MEANS = {"GPU": "a logical GPU device", "CPU": "the capped BFC CPU allocator"}


@dataclass(frozen=True)
class Budget:
    """The memory one device gives training.

    A budget comes from the real device (`Budget.from_device()`), from a size the user gives
    (`Budget.from_size("16GiB")`), from a named card (`Budget.from_card("T4")`), or from an
    emulation active in this process (`memfit.emulate`). Everything memfit decides, it decides
    against `usable_bytes`.

    Args:
        usable_bytes: bytes training may use on the device.
        name: what the budget is, for people (`"T4"`, `"2.00 GiB"`, `"GPU:0 (NVIDIA L4)"`).
        source: `"user"`, `"card"`, `"device"` or `"emulated"`.
        total_bytes: the device's whole memory when known (a card's or GPU's total, host RAM).
        device: the TensorFlow device it describes (`"GPU:0"`, `"CPU:0"`) when there is one.
        notes: how the numbers were obtained.

    Example:
        >>> Budget.from_size("1.5GiB").usable_bytes
        1610612736
        >>> Budget.from_card("T4").name
        'T4'
    """

    usable_bytes: int
    name: str
    source: str
    total_bytes: int | None = None
    device: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_size(cls, size: str | int | float) -> Budget:
        """A budget of exactly `size` (`"16GiB"`, `"1.5 GB"`, `512MiB`, bytes)."""
        num = parse_size(size)
        return cls(usable_bytes=num, name=format_size(num), source="user", total_bytes=num)

    @classmethod
    def from_card(cls, name: str) -> Budget:
        """The share of a named card (`"T4"`, `"A100-40GB"`, ...) that training gets."""
        card = cards.get_card(name)
        return cls(
            usable_bytes=card.usable_bytes,
            name=card.name,
            source="card",
            total_bytes=card.total_bytes,
            notes=(
                f"{format_size(card.total_bytes)} on the card, "
                f"{format_size(card.reserved_bytes)} kept by the CUDA context and TensorFlow; "
                f"usable share from {card.usable_source}",
            ),
        )

    @classmethod
    def from_device(cls, device: str | None = None) -> Budget:
        """What a real device gives training in this process, now.

        An emulated budget (`memfit.emulate`) wins over the hardware. A GPU's budget is its
        free memory (NVML) less TensorFlow's default reserve; the CPU's is the host RAM still
        available (psutil).

        Args:
            device: `"GPU:0"`, `"CPU:0"`, ...; default: the first GPU, else the CPU.
        """
        emulated = emulated_budget()
        if emulated is not None:
            return emulated
        kind, index = _parse_device(device) if device else (None, 0)
        gpus, problem = devices.nvml_gpus()
        if kind is None:
            kind = "GPU" if gpus else "CPU"
        if kind == "CPU":
            host = devices.host_memory()
            return cls(
                usable_bytes=host.available_bytes,
                name="CPU:0 (host RAM)",
                source="device",
                total_bytes=host.total_bytes,
                device="CPU:0",
                notes=("available host RAM (psutil)",),
            )
        if problem is not None or index >= len(gpus):
            return _gpu_budget_from_tensorflow(index, problem)
        gpu = gpus[index]
        cc = gpu.compute_capability or (8, 0)

        reserve = tfb.min_system_memory(gpu.free_bytes, cc)
        return cls(
            usable_bytes=max(0, gpu.free_bytes - reserve),
            name=f"GPU:{index} ({gpu.name})",
            source="device",
            total_bytes=gpu.total_bytes,
            device=f"GPU:{index}",
            notes=(
                f"NVML: {format_size(gpu.free_bytes)} free of {format_size(gpu.total_bytes)}, "
                f"less TensorFlow's default reserve of {format_size(reserve)}",
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (sizes in bytes)."""
        return json_dict(self, notes=list(self.notes))

    def __str__(self) -> str:
        return f"{format_size(self.usable_bytes)} ({self.name}, {self.source})"


def _parse_device(device: str) -> tuple[str, int]:
    match = _DEVICE_RE.match(device.strip())
    if match is None:
        raise UnknownDeviceError(f"{device!r} is not a device; use CPU:0, GPU:0, GPU:1, ...")
    return match.group(1).upper(), int(match.group(2) or 0)


def _gpu_budget_from_tensorflow(index: int, problem: str | None) -> Budget:
    """GPU budget when NVML is missing: the limit TensorFlow's device reports (initialises it)."""

    tf = tfb.import_tf()
    gpus = tf.config.list_physical_devices("GPU")
    if index >= len(gpus):
        raise MemfitError(
            f"GPU:{index} is not visible: TensorFlow sees {len(gpus)} GPU(s)"
            + (f" and {problem}" if problem else "")
            + "; run `memfit doctor` to see why"
        )
    from tensorflow.python.client import device_lib

    limits = [d.memory_limit for d in device_lib.list_local_devices() if d.device_type == "GPU"]
    return Budget(
        usable_bytes=int(limits[index]),
        name=f"GPU:{index}",
        source="device",
        device=f"GPU:{index}",
        notes=(f"TensorFlow's device memory limit ({problem})",),
    )


def emulated_memory_growth() -> bool:
    """Whether the emulation of this process (or the one a child inherits) emulates a GPU
    with memory growth on (`MEMFIT_MEMORY_GROWTH=1`): regions that grow, never merged."""
    return os.environ.get(ENV_MEMORY_GROWTH, "0").strip().lower() in ("1", "true", "yes")


def emulated_budget() -> Budget | None:
    """The budget `memfit.emulate` applied in this process (or its parent), if any."""
    raw = os.environ.get(ENV_EMULATED_BYTES)
    if not raw or not raw.isdigit():
        return None
    name = os.environ.get(ENV_EMULATED_NAME) or format_size(int(raw))
    on = os.environ.get(ENV_EMULATED_ON, "CPU")
    return Budget(
        usable_bytes=int(raw),
        name=name,
        source="emulated",
        device=f"{on}:0",
        notes=(
            f"emulated with {_EMULATION_MEANS.get(on, _EMULATION_MEANS['CPU'])}",
            "memory growth on: the allocator grows in regions"
            if emulated_memory_growth()
            else "memory growth off: the whole budget is one region from the start",
        ),
    )


def resolve_budget(
    memory: str | int | float | None = None, device: str | None = None
) -> Budget | None:
    """The budget named by `--memory` / `--device`, or None when neither is given.

    `device` is a card name (`"T4"`) or a device of this machine (`"GPU:0"`, `"CPU"`).
    """
    if memory is not None and device is not None:
        raise MemfitError("give either --memory or --device, not both")
    if memory is not None:
        return Budget.from_size(memory)
    if device is not None:
        if _DEVICE_RE.match(device.strip()):
            return Budget.from_device(device)
        return Budget.from_card(device)
    return None


def split_budget_list(value: str) -> list[str]:
    """The parts of a comma-separated `--memory` / `--device` value, one per replica.

    Example:
        >>> split_budget_list("T4, L4")
        ['T4', 'L4']

    Raises:
        MemfitError: a part is empty (`"T4,,L4"`, a trailing comma).
    """
    parts = [part.strip() for part in str(value).split(",")]
    if not all(parts):
        raise MemfitError(
            f"{value!r} has an empty entry: give one budget per replica, separated by commas "
            f"(e.g. T4,L4 or 15GiB,22GiB)"
        )
    return parts


def resolve_budgets(memory: str | None = None, device: str | None = None) -> list[Budget]:
    """One budget per replica from comma-separated `--memory` / `--device` values.

    `--memory 15GiB,22GiB` or `--device T4,L4` name one budget per replica (a single value is
    one budget); an empty list when neither is given.

    Example:
        >>> [b.name for b in resolve_budgets(device="T4,L4")]
        ['T4', 'L4']
    """
    if memory is not None and device is not None:
        raise MemfitError("give either --memory or --device, not both")
    if memory is not None:
        return [Budget.from_size(part) for part in split_budget_list(memory)]
    if device is not None:
        return [resolve_budget(device=part) for part in split_budget_list(device)]
    return []


def tightest_index(budgets: list[Budget]) -> int:
    """Index of the budget with the fewest usable bytes (the first of equals): the replica
    whose budget decides for all of them.

    Raises:
        MemfitError: no budget given.
    """
    if not budgets:
        raise MemfitError("no budget given: name one per replica")
    return min(range(len(budgets)), key=lambda i: budgets[i].usable_bytes)


def as_budget(value: Budget | str | int | float | None) -> Budget | None:
    """Turn what a user passes as `budget=` into a Budget: a Budget, a size, or a card name."""
    if value is None or isinstance(value, Budget):
        return value
    if isinstance(value, str) and value.strip() and value.strip()[0].isalpha():
        return resolve_budget(device=value)
    return Budget.from_size(value)


def as_budgets(value: Any) -> list[Budget]:
    """Turn what a user passes as `budget=` into one budget per replica given.

    A list or tuple holds one budget per replica (each a `Budget`, size or card name); a
    string with commas (`"T4,L4"`, `"15GiB,22GiB"`) too; any other value is one budget
    (`as_budget`); None is none.

    Example:
        >>> [b.name for b in as_budgets(["T4", "16GiB"])]
        ['T4', '16.00 GiB']
    """
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [b for b in (as_budget(v) for v in value) if b is not None]
    if isinstance(value, str) and "," in value:
        return [b for b in map(as_budget, split_budget_list(value)) if b is not None]
    resolved = as_budget(value)
    return [resolved] if resolved is not None else []
