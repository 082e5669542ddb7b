"""TensorFlow's out-of-memory: its error recognised, a CPU step stalled before it, and what a
failed step leaves behind.

`is_oom` and `oom_summary` read `ResourceExhaustedError`; `AllocatorStallWatch` notices a step
waiting in the BFC allocator's retry seconds before that error is raised;
`clear_step_resources` frees the per-step resources (grappler's temporary variables) a step
that failed left in TensorFlow's eager context.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from memfit.backend.tf_import import is_imported


def is_oom(exc: BaseException) -> bool:
    """Whether `exc` is TensorFlow's out-of-memory error (`ResourceExhaustedError`)."""
    if not is_imported():
        return False
    tf = sys.modules["tensorflow"]
    return isinstance(exc, tf.errors.ResourceExhaustedError)


def oom_summary(exc: BaseException) -> str:
    """The first informative line of a TensorFlow OOM message (which allocation failed)."""
    text = getattr(exc, "message", None) or str(exc)
    for line in text.splitlines():
        if "OOM when allocating" in line or "Out of memory" in line.lower():
            return line.strip()[:300]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first[:300]


def clear_step_resources() -> bool:
    """Free the per-step resources a failed step left in TensorFlow's eager context.

    Grappler's memory optimizer rewrites a sum of more than two tensors (`AddN`: the gradient of
    a weight or an activation used in several places, as a detector's heads shared over its
    feature levels) into a `TemporaryVariable` accumulator that a `DestroyTemporaryVariable`
    frees at the end. The variable lives in the eager context's per-step resource container,
    so when the step fails in between (an OOM) it stays there, buffer and all: memory leaks
    with every failed try, and the next run of a function with that accumulator fails with
    `AlreadyExistsError ... TemporaryVariable`. TensorFlow empties the container only when
    its count of active steps (`TFE_ContextStartStep` / `TFE_ContextEndStep`, which Python
    does not expose) returns to zero; this starts and ends a step, through the C API, which
    swaps in a fresh container and frees the old one's resources on every local device.

    Call it between steps, after a failed one, while no other thread runs TensorFlow ops (a
    function running meanwhile holds on to the container being replaced). It costs
    microseconds and nothing when there is nothing to free.

    Returns:
        Whether the container was emptied: False when TensorFlow is not initialised (nothing
        ran) or its library does not export the two calls.

    Example:
        ```python
        try:
            step(big_batch)
        except tf.errors.ResourceExhaustedError:
            clear_step_resources()     # before any step runs again
            step(small_batch)
        ```
    """
    if not is_imported():
        return False
    from tensorflow.python.eager import context

    handle = getattr(context.context(), "_handle", None)
    calls = _step_calls()
    if handle is None or calls is None:
        return False
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    pointer = get_pointer(handle, None)
    start, end = calls
    start(pointer)
    end(pointer)
    return True


_STEP_CALLS: list[Any] = []


def _step_calls() -> tuple[Any, Any] | None:
    """TensorFlow's `TFE_ContextStartStep` and `TFE_ContextEndStep`, or None if not found."""
    if not _STEP_CALLS:
        _STEP_CALLS.append(_find_step_calls())
    return _STEP_CALLS[0]


def _find_step_calls() -> tuple[Any, Any] | None:
    tf_dir = os.path.dirname(sys.modules["tensorflow"].__file__ or "")
    names = (
        "libtensorflow_cc.so.2",
        "libtensorflow_cc.2.dylib",
        "libtensorflow_framework.so.2",
        os.path.join("python", "_pywrap_tensorflow_internal.so"),
    )
    for name in names:
        path = os.path.join(tf_dir, name)
        if not os.path.exists(path):
            continue
        try:
            library = ctypes.CDLL(path)  # already loaded by TensorFlow: the same copy
            start, end = library.TFE_ContextStartStep, library.TFE_ContextEndStep
        except (OSError, AttributeError):
            continue
        for call in (start, end):
            call.restype = None
            call.argtypes = [ctypes.c_void_p]
        return start, end
    return None


# TensorFlow's BFC allocator waits this long for memory to be returned before it refuses an
# allocation (`kMaxMillisToWait` in bfc_allocator.cc); the CPU allocator has no switch for it.
ALLOCATOR_RETRY_SECONDS = 10.0


def allocator_stall_detectable(device: str) -> bool:
    """Whether `AllocatorStallWatch` can tell an allocation waiting for memory on `device`.

    Only for a step on the CPU (a GPU step leaves the CPU threads asleep while kernels run)
    on Linux (thread states come from /proc).
    """
    return device.upper().startswith("CPU") and os.path.isdir("/proc/self/task")


class AllocatorStallWatch:
    """Notices a CPU step stalled in TensorFlow's allocator retry, seconds before its OOM.

    When the BFC allocator cannot serve a request it waits up to 10 s for another thread to
    return memory, then raises `ResourceExhaustedError`. If meanwhile no thread of the process
    runs, nothing can return memory and the OOM is certain. This watch samples the process's
    threads (other than its own) every `interval` seconds; when none has been running or in
    disk wait and none has used CPU time for `window` seconds while `pressed()` holds, it
    calls `on_stall` once. Use it only around work that computes on the CPU without pauses
    (a training step), with `allocator_stall_detectable`.

    A process also goes quiet without waiting for memory: tearing down a step's `tf.data`
    iterator and function after 20 steps sat idle for over 1.5 s (MobileNetV2 96 px under
    500 MiB, TF 2.21, with 43 MiB in use), which without `pressed` was answered as an OOM of
    a step that had fitted. Pass `pressed` to count only quiet spells with the allocator near
    its limit.

    Args:
        on_stall: called from the watch's thread when the stall is seen (it may end the
            process).
        window: seconds of a fully idle process that count as a stall.
        interval: seconds between samples.
        pressed: whether memory is short enough now for a quiet spell to be an allocation
            waiting for memory (checked only when the process is quiet); default always.

    Example:
        ```python
        with AllocatorStallWatch(lambda: report_oom_and_exit()):
            step(batch)
        ```
    """

    def __init__(
        self,
        on_stall: Callable[[], None],
        window: float = 1.5,
        interval: float = 0.1,
        pressed: Callable[[], bool] | None = None,
    ) -> None:
        self.on_stall, self.window, self.interval = on_stall, window, interval
        self.pressed = pressed or (lambda: True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memfit-stall-watch", daemon=True)
        self.stalled = False

    def __enter__(self) -> AllocatorStallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        own = str(threading.get_native_id())
        quiet_since: float | None = None
        last_cpu: int | None = None
        while not self._stop.wait(self.interval):
            busy, cpu = _threads_busy(own)
            now = time.monotonic()
            if busy or last_cpu is None or cpu != last_cpu or not self.pressed():
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= self.window:
                self.stalled = True
                self.on_stall()
                return
            last_cpu = cpu


def _threads_busy(exclude: str) -> tuple[bool, int]:
    """Whether any thread of this process but `exclude` runs (or waits on disk), and the
    CPU ticks they used."""
    busy, ticks = False, 0
    for tid in os.listdir("/proc/self/task"):
        if tid == exclude:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as handle:
                stat = handle.read()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        busy = busy or fields[0] in ("R", "D")
        ticks += int(fields[11]) + int(fields[12])
    return busy, ticks
