"""The child-process runner: log lines read, results unwrapped, tiny children run and timed out.

test_isolate.py covers a MemfitError coming back from a child and the OOM-then-hang watchdog;
these tests cover the parts of `memfit.process.runner` it does not, with jobs from the standard
library or a module written to a temporary folder (each child costs a few seconds).
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from pathlib import Path

import pytest

from memfit import Budget
from memfit.errors import MeasurementError, MemfitError, MemfitWarning
from memfit.process.runner import (
    RESIDENT_MARK,
    ChildWorker,
    _child_env,
    _ChildRun,
    _describe_death,
    _read_line,
    _unwrap,
    is_oom_line,
    relay_warning,
    run_in_child,
)

# Lines as TensorFlow 2.x logs them (the BFC allocator's, then the kernel's OP_REQUIRES).
BFC_LINE = (
    "2026-01-05 10:00:00.000000: W tensorflow/core/common_runtime/bfc_allocator.cc:501] "
    "Allocator (GPU_0_bfc) ran out of memory trying to allocate 3.00GiB (rounded to "
    "3221225472)requested by op Conv2D"
)
KERNEL_LINE = (
    "2026-01-05 10:00:00.100000: W tensorflow/core/framework/op_kernel.cc:1839] "
    "OP_REQUIRES failed at conv_ops_impl.h:1204 : RESOURCE_EXHAUSTED: OOM when allocating "
    "tensor with shape[64,256,56,56] and type float on /job:localhost/replica:0/task:0/"
    "device:GPU:0 by allocator GPU_0_bfc"
)
STATS_LINE = (
    "2026-01-05 10:00:00.200000: I tensorflow/core/common_runtime/bfc_allocator.cc:1122] "
    "MaxInUse:                  1.50GiB"
)


def _job_module(folder: Path) -> dict[str, str]:
    """A module `runner_job` in `folder`; the env that lets a child import it."""
    (folder / "runner_job.py").write_text(
        "import time\n"
        "\n"
        "def add(a: int, b: int) -> dict:\n"
        "    return {'sum': a + b}\n"
        "\n"
        "def sleep(seconds: float) -> None:\n"
        "    time.sleep(seconds)\n"
        "\n"
        "def counter(start: int):\n"
        "    seen = [start]\n"
        "    def handle(step: int) -> int:\n"
        "        seen[0] += step\n"
        "        return seen[0]\n"
        "    return handle\n"
    )
    return {"PYTHONPATH": str(folder)}


# -- log lines --------------------------------------------------------------------------------
def test_real_tensorflow_oom_lines_are_oom_and_other_lines_are_not() -> None:
    assert is_oom_line(BFC_LINE)
    assert is_oom_line(KERNEL_LINE)
    assert not is_oom_line(STATS_LINE)
    assert not is_oom_line("Epoch 1/3: loss 0.25")
    assert not is_oom_line("")


def test_reading_lines_keeps_the_first_oom_message_and_the_largest_max_in_use() -> None:
    state = _ChildRun(returncode=0, stderr="")
    lines: list[str] = []
    ooms: list[float] = []
    for line in (STATS_LINE, BFC_LINE, KERNEL_LINE, "MaxInUse: 512.0MiB", f"{RESIDENT_MARK}4096"):
        _read_line(line, state, lines, ooms)
    assert len(ooms) == 2
    # The log prefix (up to "] ") is cut off the message; the first OOM line is the one kept.
    assert state.oom_line == (
        "Allocator (GPU_0_bfc) ran out of memory trying to allocate 3.00GiB (rounded to "
        "3221225472)requested by op Conv2D"
    )
    assert state.max_in_use == 3 * 2**29  # 1.50GiB; the later 512 MiB does not lower it
    assert state.resident == 4096
    assert state.hung_result() == {
        "hung_after_oom": True,
        "max_in_use_bytes": 3 * 2**29,
        "resident_bytes": 4096,
        "oom_message": state.oom_line,
    }


def test_only_the_last_200_lines_are_kept() -> None:
    state = _ChildRun(returncode=0, stderr="")
    lines: list[str] = []
    for i in range(250):
        _read_line(f"line {i}\n", state, lines, [])
    assert len(lines) == 200
    assert lines[0] == "line 50\n" and lines[-1] == "line 249\n"


def test_a_child_memfit_warning_is_warned_again_here_and_other_lines_are_not() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        relay_warning("/x/workload.py:9: MemfitWarning: model 'm' is not compiled\n")
        relay_warning("/x/y.py:3: UserWarning: something else\n")
        relay_warning("/x/y.py:3: MemfitWarning:   \n")
    assert [(w.category, str(w.message)) for w in caught] == [
        (MemfitWarning, "model 'm' is not compiled")
    ]


# -- results and deaths -----------------------------------------------------------------------
def test_unwrap_returns_the_result_or_raises_the_child_error() -> None:
    assert _unwrap({"result": [1, 2]}) == [1, 2]
    with pytest.raises(MemfitError, match="^batch too big$") as memfit_error:
        _unwrap({"error": {"type": "MemfitError", "message": "batch too big", "memfit": True}})
    assert type(memfit_error.value) is MemfitError
    with pytest.raises(MeasurementError, match="^the child process failed: ValueError: bad value$"):
        _unwrap({"error": {"type": "ValueError", "message": "bad value", "memfit": False}})


def test_a_dead_child_is_described_by_its_signal_or_status_and_last_lines() -> None:
    killed = _ChildRun(returncode=-signal.SIGSEGV, stderr="a\nb\nc\nd\n")
    assert _describe_death(killed) == (
        "the child process was killed by SIGSEGV (with oneDNN on, this is how TensorFlow's "
        "CPU kernels can die on OOM): b | c | d"
    )
    assert _describe_death(_ChildRun(returncode=-signal.SIGKILL, stderr="")) == (
        "the child process was killed by SIGKILL"
    )
    assert _describe_death(_ChildRun(returncode=3, stderr="boom\n")) == (
        "the child process exited with status 3: boom"
    )


def test_child_env_sets_the_budget_and_drops_inherited_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMFIT_MEMORY", "1GiB")
    monkeypatch.setenv("MEMFIT_DEVICE", "GPU:1")
    monkeypatch.setenv("TF_CPU_BFC_MEM_LIMIT_IN_MB", "100")
    monkeypatch.setenv("MEMFIT_EMULATED_BYTES", "123")
    env = _child_env(None, {"EXTRA": "1", "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert "MEMFIT_MEMORY" not in env and "MEMFIT_DEVICE" not in env
    assert env["TF_CPU_BFC_MEM_LIMIT_IN_MB"] == "100"  # kept: no budget replaces it
    assert env["EXTRA"] == "1" and env["TF_CPP_MIN_LOG_LEVEL"] == "3"  # env= wins
    budgeted = _child_env(Budget.from_size("64MiB"), None)
    assert budgeted["MEMFIT_MEMORY"] == str(64 * 2**20)
    assert "TF_CPU_BFC_MEM_LIMIT_IN_MB" not in budgeted
    assert "MEMFIT_EMULATED_BYTES" not in budgeted
    assert budgeted["TF_CPP_MIN_LOG_LEVEL"] == "0"  # the parent reads the allocator's log


# -- tiny children ----------------------------------------------------------------------------
def test_a_child_returns_its_value(tmp_path: Path) -> None:
    result = run_in_child(
        "runner_job:add", {"a": 2, "b": 40}, env=_job_module(tmp_path), timeout=60
    )
    assert result == {"sum": 42}


def test_a_child_that_fails_outside_memfit_raises_a_measurement_error() -> None:
    # `json.loads` fails before memfit's child could do anything else: no job module needed.
    with pytest.raises(MeasurementError, match="the child process failed: JSONDecodeError"):
        run_in_child("json:loads", {"s": "{"}, timeout=60)


def test_a_child_past_its_timeout_is_killed(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(MeasurementError, match="did not finish within 1 s"):
        run_in_child("runner_job:sleep", {"seconds": 60}, env=_job_module(tmp_path), timeout=1)
    assert time.monotonic() - start < 10


def test_a_worker_keeps_its_state_between_calls_and_restarts_fresh(tmp_path: Path) -> None:
    worker = ChildWorker("runner_job:counter", {"start": 10}, env=_job_module(tmp_path))
    try:
        assert worker.call(step=1) == 11
        ticket = worker.submit(step=5)
        assert worker.collect(ticket) == 16
        assert worker.starts == 1
        worker.close()
        assert worker.call(step=1) == 11  # a fresh child: the handler prepared again
        assert worker.starts == 2
    finally:
        worker.shutdown(kill=True)
    assert not os.path.exists(worker._tmp.name)
