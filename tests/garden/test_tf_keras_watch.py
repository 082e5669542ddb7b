"""memfit.Watch under tf_keras (Keras 2, the Model Garden's Keras): its `model.fit` and a
custom training loop each log every step's memory and time.

Each test trains in a child process under an emulated budget (the CPU's BFC allocator keeps
the memory statistics Watch reads).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import run_isolated

ENV = {"MEMFIT_MEMORY": "256MiB", "TF_ENABLE_ONEDNN_OPTS": "0"}

CHILDREN = Path(__file__).resolve().parent / "children"


def _read(path: str) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def test_watch_in_tf_keras_model_fit_logs_memory_and_time_per_step(tmp_path) -> None:
    log = str(tmp_path / "run.jsonl")
    code = CHILDREN / "watch_fit.py"
    result = run_isolated(code, env=ENV, args={"log": log}, timeout=300)
    assert result["steps"] == 16 and len(result["losses"]) == 2
    lines = _read(log)
    header, steps = lines[0], [line for line in lines if line["type"] == "step"]
    assert header["type"] == "header" and header["tf_keras"]  # the tf_keras version
    assert header["memory_stats"] is True and header["input_wait_measured"] is False
    assert header["config"]["epochs"] == 2 and header["config"]["steps_per_epoch"] == 8
    assert [s["step"] for s in steps] == list(range(16))
    assert all(s["memory_peak_bytes"] > 0 and s["memory_current_bytes"] > 0 for s in steps)
    assert all(s["step_seconds"] > 0 for s in steps)
    assert all(s["traces"] >= 1 for s in steps)  # tf_keras' train function, found and counted
    assert all(isinstance(s["loss"], float) for s in steps)
    # Per-step losses, derived from Keras' running means, average to the epoch's loss.
    first_epoch = [s["loss"] for s in steps if s["epoch"] == 0]
    assert abs(sum(first_epoch) / 8 - result["losses"][0]) < 1e-4
    end = lines[-1]
    assert end["type"] == "end" and end["steps"] == 16 and end["peak_bytes"] > 0
    report = subprocess.run(
        [sys.executable, "-m", "memfit", "report", log, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert json.loads(report.stdout)["runs"][0]["summary"]["steps"] == 16


def test_watch_in_a_tf_keras_custom_loop_makes_the_calls_keras_makes(tmp_path) -> None:
    log = str(tmp_path / "loop.jsonl")
    code = CHILDREN / "watch_loop.py"
    result = run_isolated(code, env=ENV, args={"log": log}, timeout=300)
    steps = [line for line in _read(log) if line["type"] == "step"]
    assert len(steps) == 16
    assert all(s["memory_peak_bytes"] > 0 and s["step_seconds"] > 0 for s in steps)
    logged = [s["loss"] for s in steps]
    assert max(abs(a - b) for a, b in zip(logged, result["own"], strict=True)) < 1e-4
