"""Run a function in a fresh Python child process: start, feed, time out and read it.

The runner knows child processes, not measurements: it starts `memfit.process` on a JSON
job (the function to call, named by its module and name, and its arguments), feeds a serving child
its calls, stops a child that runs past its timeout or hangs
after TensorFlow logged an out-of-memory error, and reads the child's stderr (OOM lines,
the allocator's `MaxInUse`, the resident mark, `MemfitWarning`s to relay). What a result
means is for its caller (`memfit.measuring.isolate` turns one into a `Measurement`). Not public.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memfit.errors import MeasurementError, MemfitError, MemfitWarning
from memfit.sizes import parse_size

if TYPE_CHECKING:
    from memfit.budget.budget import Budget

# How the child learns its job: a JSON file with the function to call and its arguments.
_CHILD_MODULE = "memfit.process"
OOM_GRACE_SECONDS = 30.0
RESIDENT_MARK = "memfit-child: resident_bytes="
_MAX_IN_USE = re.compile(r"MaxInUse:\s*([0-9.]+\s*[KMGT]?i?B)")
# What TensorFlow logs when an allocation is refused: the BFC allocator's own line comes first
# (and is the only one when the step then hangs), the kernel's OP_REQUIRES line after it.
_OOM_MARKS = ("ran out of memory trying to allocate", "OOM when allocating")


def is_oom_line(line: str) -> bool:
    """Whether a line of TensorFlow's log says an allocation failed for good.

    TensorFlow also logs "ran out of memory trying to allocate ..." for a request whose
    caller can do without it ("The caller indicates that this is not a failure": a kernel's
    optional scratch); the step goes on, so that line is no OOM.

    Example:
        ```python
        is_oom_line("OOM when allocating tensor with shape[16,12276,20]")  # True
        ```
    """
    return any(mark in line for mark in _OOM_MARKS) and "not a failure" not in line


@dataclass
class _ChildRun:
    """What the parent read from a child's stderr, and how the child ended."""

    returncode: int
    stderr: str
    hung_after_oom: bool = False
    max_in_use: int | None = None
    resident: int | None = None
    oom_line: str | None = None

    def hung_result(self) -> dict[str, Any]:
        """The result a child that hung after an OOM stands for, from what its log said."""
        return {
            "hung_after_oom": True,
            "max_in_use_bytes": self.max_in_use,
            "resident_bytes": self.resident,
            "oom_message": self.oom_line,
        }


def relay_warning(line: str) -> None:
    """Warn here what a child process warned the user about (a `MemfitWarning` line).

    Args:
        line: one line of the child's stderr; only `path:N: MemfitWarning: message` counts.

    Example:
        ```python
        relay_warning("x.py:9: MemfitWarning: model 'm' is not compiled: ...")
        ```
    """
    import warnings

    _, mark, message = line.partition(": MemfitWarning: ")
    if mark and message.strip():
        warnings.warn(message.strip(), MemfitWarning, stacklevel=2)


def _read_line(line: str, state: _ChildRun, lines: list[str], ooms: list[float]) -> None:
    """Take one line of a child's stderr: keep the last 200, note OOMs, peaks and warnings."""
    lines.append(line)
    del lines[:-200]
    if is_oom_line(line):
        ooms.append(time.monotonic())
        if state.oom_line is None:
            start = line.find("] ") + 2 if "] " in line else 0
            state.oom_line = line[start:].strip()[:300]
    match = _MAX_IN_USE.search(line)
    if match:
        state.max_in_use = max(state.max_in_use or 0, parse_size(match.group(1)))
    if line.startswith(RESIDENT_MARK):
        state.resident = int(line[len(RESIDENT_MARK) :].strip())
    relay_warning(line)


def _run_watched(
    command: list[str], env: dict[str, str], timeout: float | None, oom_grace: float
) -> _ChildRun:
    """Run the child, reading its log; stop it if it hangs after an OOM or runs past timeout."""
    proc = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    state = _ChildRun(returncode=0, stderr="")
    lines: list[str] = []
    last_oom: list[float] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            _read_line(line, state, lines, last_oom)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.monotonic()
    while proc.poll() is None:
        time.sleep(0.2)
        now = time.monotonic()
        if last_oom and now - last_oom[0] > oom_grace:
            proc.kill()
            state.hung_after_oom = True
            break
        if timeout is not None and now - started > timeout:
            proc.kill()
            proc.wait()
            raise MeasurementError(f"the child process did not finish within {timeout:.0f} s")
    proc.wait()
    reader.join(timeout=5)
    state.returncode = proc.returncode
    state.stderr = "".join(lines)
    return state


def entry_name(function: Callable[..., Any] | str) -> str:
    """How a child process finds `function`: `"package.module:name"`.

    The function must be importable by that name in a fresh process: defined at the top
    level of a module other than `__main__`. A `"package.module:name"` string is taken as it
    is: for a module only the child can import (a job module on the child's `PYTHONPATH`);
    memfit's own children are always named by the function itself, so that a reader can
    follow the call.

    Example:
        >>> import os.path
        >>> entry_name(os.path.join)
        'posixpath:join'
    """
    if isinstance(function, str):
        if ":" not in function:
            raise TypeError(f"a child's function is a callable or 'module:name', not {function!r}")
        return function
    module = getattr(function, "__module__", None)
    name = getattr(function, "__qualname__", "")
    if not callable(function) or not module or module == "__main__" or "." in name or "<" in name:
        raise TypeError(
            f"a child process runs a function defined at the top level of an importable "
            f"module, not {function!r}"
        )
    return f"{module}:{name}"


def run_in_child(
    function: Callable[..., Any] | str,
    kwargs: dict[str, Any],
    *,
    budget: Budget | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    oom_grace: float = OOM_GRACE_SECONDS,
) -> Any:
    """Call `function(**kwargs)` in a fresh Python process and return its result.

    The child starts with no TensorFlow state, so an emulated `budget` (applied through
    `MEMFIT_MEMORY` before TensorFlow initialises) and any allocator damage stay inside it.
    Arguments and result travel as JSON. A `MemfitError` raised in the child is raised again
    here with the same message.

    Args:
        function: the function to call in the child (a module's top-level function; the
            child imports it by its module and name), or its `"package.module:name"`.
        kwargs: JSON-serialisable keyword arguments.
        budget: emulate this budget in the child.
        env: extra environment variables for the child.
        timeout: seconds before the child is killed.
        oom_grace: seconds a child may go on after TensorFlow logged its first OOM before it
            is stopped. TensorFlow's BFC allocator retries every refused allocation for up to
            10 s (`AllocatorRetry`), so a step whose OOM strikes while the optimizer copies
            and updates hundreds of variables can take many minutes to fail. The result is
            then `{"hung_after_oom": True, ...}` with what the child's log said.
    """
    child_env = _child_env(budget, env)
    with tempfile.TemporaryDirectory(prefix="memfit-child-") as tmp:
        job = os.path.join(tmp, "job.json")
        out = os.path.join(tmp, "result.json")
        with open(job, "w") as handle:
            json.dump(
                {"function": entry_name(function), "kwargs": kwargs, "result": out}, handle
            )
        proc = _run_watched(
            [sys.executable, "-m", _CHILD_MODULE, job], child_env, timeout, oom_grace
        )
        if proc.hung_after_oom:
            return proc.hung_result()
        if not os.path.exists(out):
            raise MeasurementError(_describe_death(proc))
        with open(out) as handle:
            payload = json.load(handle)
    return _unwrap(payload)


def _child_env(budget: Budget | None, env: dict[str, str] | None) -> dict[str, str]:
    """This process's environment for a child: `budget` as `MEMFIT_MEMORY`, then `env`."""
    child_env = dict(os.environ)
    for key in ("MEMFIT_MEMORY", "MEMFIT_DEVICE"):
        child_env.pop(key, None)
    if budget is not None:
        # A fresh process decides the allocator itself: drop limits inherited from this one.
        for key in (
            "MEMFIT_EMULATED_BYTES",
            "MEMFIT_EMULATED_NAME",
            "MEMFIT_EMULATED_ON",
            "TF_CPU_BFC_MEM_LIMIT_IN_MB",
        ):
            child_env.pop(key, None)
        child_env["MEMFIT_MEMORY"] = str(budget.usable_bytes)
    # The parent watches TensorFlow's allocator log (OOM lines, MaxInUse) on the child's stderr.
    child_env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    child_env.update(env or {})
    return child_env


def _unwrap(payload: dict[str, Any]) -> Any:
    """The child's result, or its error raised here (a MemfitError keeps its message)."""
    if payload.get("error"):
        error = payload["error"]
        raise (
            MemfitError(error["message"])
            if error.get("memfit")
            else MeasurementError(f"the child process failed: {error['type']}: {error['message']}")
        )
    return payload["result"]


class ChildWorker:
    """A child process that prepares once, then answers calls until it is closed.

    `function(**kwargs)` runs once in a fresh child (under `budget`) and returns a handler;
    each `call(**kw)` runs `handler(**kw)` there and returns its JSON result. The stderr
    watchdog of `run_in_child` applies per call: a call still running `oom_grace` seconds
    after TensorFlow logged an OOM stops the child and returns `{"hung_after_oom": True, ...}`.
    Close the worker after a call that ran out of memory to give the next a fresh allocator.

    Args:
        function: the function returning the handler (a module's top-level function), or
            its `"package.module:name"`.
        kwargs: JSON-serialisable arguments for it.
        budget: emulate this budget in the child.
        env: extra environment variables for the child.
        oom_grace: as in `run_in_child`.
    """

    def __init__(
        self,
        function: Callable[..., Any] | str,
        kwargs: dict[str, Any],
        *,
        budget: Budget | None = None,
        env: dict[str, str] | None = None,
        oom_grace: float = OOM_GRACE_SECONDS,
    ) -> None:
        self.function, self.kwargs = function, kwargs
        self.budget, self.env, self.oom_grace = budget, env, oom_grace
        self._tmp = tempfile.TemporaryDirectory(prefix="memfit-worker-")
        self._proc: subprocess.Popen[str] | None = None
        self._state = _ChildRun(returncode=0, stderr="")
        self._lines: list[str] = []
        self._ooms: list[float] = []
        self._calls = 0
        self._ready: str | None = None
        self.starts = 0

    @property
    def resident(self) -> int | None:
        """Resident bytes the child reported after preparing."""
        return self._state.resident

    def start(self) -> None:
        """Start the child now, without waiting for it to be ready (it prepares meanwhile)."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self._ready = os.path.join(self._tmp.name, f"ready-{self.starts}.json")
        job = os.path.join(self._tmp.name, "job.json")
        with open(job, "w") as handle:
            json.dump(
                {
                    "function": entry_name(self.function),
                    "kwargs": self.kwargs,
                    "result": self._ready,
                    "serve": True,
                },
                handle,
            )
        self._state = _ChildRun(returncode=0, stderr="")
        self._lines, self._ooms = [], []
        self._proc = subprocess.Popen(
            [sys.executable, "-m", _CHILD_MODULE, job],
            env=_child_env(self.budget, self.env),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        self.starts += 1
        threading.Thread(target=self._read, args=(self._proc,), daemon=True).start()

    def wait_ready(self) -> None:
        """Start the child if needed and wait until it has prepared (its error raised here)."""
        self._ensure_ready()

    def _ensure_ready(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self.start()
        if self._ready is not None:
            ready, self._ready = self._ready, None
            _unwrap(self._wait(ready, oom_since=None))

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            _read_line(line, self._state, self._lines, self._ooms)

    def _wait(self, path: str, oom_since: int | None) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None
        while not os.path.exists(path):
            if proc.poll() is not None:
                time.sleep(0.2)  # let the reader take the last lines
                self._state.returncode = proc.returncode
                self._state.stderr = "".join(self._lines)
                self._proc = None
                raise MeasurementError(_describe_death(self._state))
            if (
                oom_since is not None
                and len(self._ooms) > oom_since
                and time.monotonic() - self._ooms[oom_since] > self.oom_grace
            ):
                self._kill()
                return {"result": self._state.hung_result()}
            time.sleep(0.05)
        with open(path) as handle:
            return json.load(handle)

    def call(self, **kwargs: Any) -> Any:
        """Run the handler with these arguments in the child (starting it if needed)."""
        return self.collect(self.submit(**kwargs))

    def submit(self, **kwargs: Any) -> tuple[str, int]:
        """Send one call to the child and return at once; `collect` waits for its result."""
        self._ensure_ready()
        assert self._proc is not None and self._proc.stdin is not None
        self._calls += 1
        path = os.path.join(self._tmp.name, f"result-{self._calls}.json")
        self._state.oom_line, self._state.max_in_use = None, None
        since = len(self._ooms)
        self._proc.stdin.write(json.dumps({"kwargs": kwargs, "result": path}) + "\n")
        self._proc.stdin.flush()
        return path, since

    def collect(self, ticket: tuple[str, int]) -> Any:
        """Wait for a submitted call's result (its error raised here, as with `call`)."""
        path, since = ticket
        return _unwrap(self._wait(path, oom_since=since))

    def close(self) -> None:
        """Stop the child; the next call starts a fresh one."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def shutdown(self, kill: bool = False) -> None:
        """Stop the child and remove the worker's files; `kill`: at once, even mid-work."""
        if kill:
            self._kill()
        self.close()
        self._tmp.cleanup()


def _describe_death(proc: _ChildRun) -> str:
    """Why a child ended without a result: its signal or exit status and its last log lines."""
    code = proc.returncode
    tail = " | ".join(line for line in (proc.stderr or "").strip().splitlines()[-3:])
    if code < 0:
        name = signal.Signals(-code).name
        return (
            f"the child process was killed by {name}"
            + (
                " (with oneDNN on, this is how TensorFlow's CPU kernels can die on OOM)"
                if name == "SIGSEGV"
                else ""
            )
            + (f": {tail}" if tail else "")
        )
    return f"the child process exited with status {code}" + (f": {tail}" if tail else "")
