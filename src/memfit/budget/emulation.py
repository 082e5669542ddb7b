"""Emulate a smaller card: make training in this process see only a given amount of memory."""

from __future__ import annotations

import os
import warnings

from memfit.backend import tf as tfb
from memfit.budget.budget import (
    ENV_EMULATED_BYTES,
    ENV_EMULATED_NAME,
    ENV_EMULATED_ON,
    ENV_MEMORY_GROWTH,
    Budget,
    emulated_budget,
    emulated_memory_growth,
    resolve_budget,
)
from memfit.budget.devices import host_memory
from memfit.errors import BackendMissingError, EmulationError, MemfitError
from memfit.sizes import format_size

ENV_MEMORY = "MEMFIT_MEMORY"
ENV_DEVICE = "MEMFIT_DEVICE"
MIB = 1024 * 1024
# What `emulate` applied in this process: (limit, memory_growth). The environment alone does not
# say, since a child process inherits its parent's (and must still set up its own allocator).
_applied: tuple[int, bool] | None = None


def emulate(
    memory: str | int | float | None = None,
    *,
    device: str | None = None,
    memory_growth: bool = False,
) -> Budget:
    """Make training in this process see only `memory` bytes (or a named card's share).

    Allocations beyond the budget raise a real `tf.errors.ResourceExhaustedError`, exactly as
    on a card of that size. On a GPU machine every GPU gets one logical device with
    `memory_limit`; on a CPU-only machine TensorFlow's BFC CPU allocator is capped
    (`TF_CPU_ALLOCATOR_USE_BFC`, `TF_CPU_BFC_MEM_LIMIT_IN_MB`) and oneDNN is turned off, since
    with it a refused allocation can crash the process instead of raising.

    The emulated card behaves like a GPU whose memory growth is off (TensorFlow's default):
    its allocator holds the whole budget as one region from the start, so what fits does not
    depend on what ran before. `memory_growth=True` emulates a GPU after
    `tf.config.experimental.set_memory_growth(gpu, True)` instead: the allocator takes
    regions of doubling size as training needs them, and they never merge.

    Call it first thing, before any model or tensor exists: TensorFlow fixes its allocators
    when it initialises. The same is done without code by setting `MEMFIT_MEMORY=2GiB` or
    `MEMFIT_DEVICE=T4` in the environment (applied on `import memfit`), and by `--memory` /
    `--device` on every CLI command.

    Args:
        memory: the budget as a size (`"2GiB"`, `"1.5 GB"`, bytes).
        device: a named card instead (`"T4"`, `"A100-40GB"`); its usable share is emulated.
        memory_growth: emulate a GPU with memory growth on (regions that grow) instead of
            one with its whole budget taken at first use.

    Returns:
        The emulated Budget (rounded down to whole MiB, the unit TensorFlow takes).

    Raises:
        EmulationError: TensorFlow already initialised its devices with other limits.
        SizeError, UnknownDeviceError: the size or card is not understood.

    Example:
        ```python
        import memfit
        memfit.emulate("1GiB")          # or memfit.emulate(device="T4")
        model = build_model()           # training now raises OOM beyond 1 GiB
        ```
    """
    global _applied
    if (memory is None) == (device is None):
        raise MemfitError("memfit.emulate() needs either a memory size or device=CARD_NAME")
    wanted = resolve_budget(memory=memory, device=device)
    assert wanted is not None
    limit = (wanted.usable_bytes // MIB) * MIB
    if limit <= 0:
        raise EmulationError(f"an emulated budget must be at least 1 MiB, got {wanted.name}")

    current = emulated_budget()
    if _applied == (limit, memory_growth) and current is not None:
        return current
    if tfb.is_initialized():
        call = (
            f"memfit.emulate({memory!r})"
            if device is None
            else f"memfit.emulate(device={device!r})"
        )
        env = f"{ENV_MEMORY}={memory}" if device is None else f"{ENV_DEVICE}={device}"
        raise EmulationError(
            f"cannot emulate {wanted.name}: TensorFlow has already initialised its devices in "
            f"this process, and their memory limits are fixed from then on. Call {call} first "
            f"thing, before building any model or tensor, or set {env} in the environment"
        )

    # oneDNN is read when TensorFlow is imported: turn it off before the GPU check imports it.
    onednn_was_on = tfb.is_imported() and tfb.onednn_enabled()
    if not tfb.is_imported():
        os.environ[tfb.ENV_ONEDNN] = "0"
    on = "CPU"
    try:
        if tfb.gpu_count() > 0:
            on = "GPU"
    except BackendMissingError:
        pass
    if on == "GPU":
        if memory_growth:
            # TensorFlow's GPU allocator reads this when it creates the (logical) device;
            # set_memory_growth itself is refused beside a logical-device configuration.
            os.environ[tfb.ENV_GROWTH] = "true"
        try:
            tfb.set_gpu_memory_limit(limit)
        except RuntimeError as exc:
            raise EmulationError(
                f"cannot emulate {wanted.name} on the GPU: {exc}. Call memfit.emulate() before "
                f"building any model or tensor"
            ) from None
    else:
        tfb.set_cpu_allocator_limit(limit)
        # Where the host cannot hold the card's one region, the allocator grows (and says so).
        memory_growth = not _cpu_region(wanted.name, limit, memory_growth)
        if onednn_was_on:
            warnings.warn(
                "TensorFlow was imported before memfit.emulate(), with oneDNN on; a step over "
                "the budget may crash the process (SIGSEGV) instead of raising an OOM. Set "
                "TF_ENABLE_ONEDNN_OPTS=0 before importing TensorFlow, or call memfit.emulate() "
                "before importing it.",
                RuntimeWarning,
                stacklevel=2,
            )
    os.environ[ENV_EMULATED_BYTES] = str(limit)
    os.environ[ENV_EMULATED_NAME] = wanted.name
    os.environ[ENV_EMULATED_ON] = on
    os.environ[ENV_MEMORY_GROWTH] = "1" if memory_growth else "0"
    _applied = (limit, memory_growth)
    budget = emulated_budget()
    assert budget is not None
    return budget


def _cpu_region(name: str, limit: int, memory_growth: bool) -> bool:
    """Reserve the CPU allocator's one region, where the host can hold it (see `emulate`).

    Returns whether the budget is one region (False: the allocator grows in regions).
    """

    host = host_memory().total_bytes
    if limit <= host:
        return not memory_growth and tfb.reserve_cpu_region(limit) > 0
    warnings.warn(
        f"emulating {name} ({format_size(limit)}) on a machine with {format_size(host)} of "
        f"RAM: training here runs out of host memory first, and the allocator grows in "
        f"regions (one region the size of the card cannot be reserved). Emulate a budget "
        f"under {format_size(host)}, or measure on the card itself",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


def emulate_from_environment() -> Budget | None:
    """Apply `MEMFIT_MEMORY` or `MEMFIT_DEVICE` from the environment, if one is set.

    `MEMFIT_MEMORY_GROWTH=1` beside either emulates a GPU with memory growth on.
    """
    memory = os.environ.get(ENV_MEMORY) or None
    device = os.environ.get(ENV_DEVICE) or None
    growth = emulated_memory_growth()
    if memory is None and device is None:
        return None
    if memory is not None and device is not None:
        raise MemfitError(f"set either {ENV_MEMORY} or {ENV_DEVICE}, not both")
    name, value = (ENV_MEMORY, memory) if memory is not None else (ENV_DEVICE, device)
    try:
        if memory is not None:
            return emulate(memory, memory_growth=growth)
        return emulate(device=device, memory_growth=growth)
    except MemfitError as exc:
        raise type(exc)(f"{name}={value}: {exc}") from None


# A bad MEMFIT_MEMORY / MEMFIT_DEVICE under the `memfit` command, kept by `import memfit` for
# `cli.main`, which prints it as one `memfit: error:` line (exit 2). The import never exits.
_deferred_error: MemfitError | None = None


def defer_environment_error(error: MemfitError) -> None:
    """Keep `emulate_from_environment`'s error for the `memfit` command to report."""
    global _deferred_error
    _deferred_error = error


def environment_error() -> MemfitError | None:
    """The error `defer_environment_error` kept (a bad MEMFIT_MEMORY / MEMFIT_DEVICE), if any."""
    return _deferred_error


def ensure_memory_statistics() -> None:
    """Make sure this process can measure memory, capping nothing that is not already capped.

    GPUs always keep allocator statistics. The CPU keeps them only under the BFC allocator, so
    on a CPU-only machine with no emulation this switches the BFC allocator on with the host's
    available RAM as its limit. It must run before TensorFlow initialises; afterwards it does
    nothing (and measuring then says why it cannot).
    """
    if tfb.is_initialized() or tfb.cpu_allocator_limit() is not None:
        return
    try:
        if tfb.gpu_count() > 0:
            return
    except BackendMissingError:
        return

    tfb.set_cpu_allocator_limit(host_memory().available_bytes)
