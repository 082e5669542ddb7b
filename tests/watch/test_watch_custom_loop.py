"""memfit.Watch in a Keras 3 custom (GradientTape) loop that makes the calls Keras makes: every
step's memory, time and own loss are logged (tests/garden/test_tf_keras_watch.py does the same under
tf_keras)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"

LOOP = CHILDREN / "custom_loop.py"


def test_watch_in_a_custom_loop_logs_every_step(tmp_path) -> None:
    log = str(tmp_path / "loop.jsonl")
    result = run_isolated(LOOP, env={"MEMFIT_MEMORY": "256MiB"}, args={"log": log}, timeout=300)
    with open(log) as handle:
        lines = [json.loads(line) for line in handle]
    assert lines[0]["type"] == "header" and lines[0]["tf_keras"] is None
    steps = [line for line in lines if line["type"] == "step"]
    assert [s["step"] for s in steps] == list(range(12))
    assert all(s["memory_peak_bytes"] > 0 and s["step_seconds"] > 0 for s in steps)
    logged = [s["loss"] for s in steps]
    assert max(abs(a - b) for a, b in zip(logged, result["own"], strict=True)) < 1e-4
    assert lines[-1]["type"] == "end" and lines[-1]["steps"] == 12
