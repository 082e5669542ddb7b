"""A kyolo YOLOv8-n through every memfit command, as a user trains it (kyolo's own loss).

The model (`mypkg.detectors:yolo`, any image size) and its samples (`mypkg.detectors:yolo_data`,
xyxy pixel boxes with a padding mask) are built offline; the budgets are emulated, so every
out-of-memory error here is TensorFlow's own. 7-8 minutes on 2 busy CPU cores (estimate 81 s,
batch and plan 199 s, recovery 188 s).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import run_cli, run_isolated

pytest.importorskip("kyolo")

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(os.path.dirname(TESTS), "src")
ENV = {"PYTHONPATH": os.pathsep.join([SRC, TESTS]), "YOLO_SIZE": "128"}
MODEL = ("mypkg.detectors:yolo", "--data", "mypkg.detectors:yolo_data")
CHILDREN = Path(__file__).resolve().parent / "children"


def _json(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_estimate_checked_against_a_measured_step() -> None:
    """The estimate of kyolo's step is within 25% of the measured peak, under its high bound."""
    out = _json(
        run_cli("estimate", *MODEL, "-b", "2", "--check", "--no-what-ifs", "--json", env=ENV)
    )
    check = out["check"]
    assert check["measured_bytes"] > 50 << 20  # a real YOLOv8-n step, not an empty one
    assert abs(check["error"]) < 0.25, check
    assert check["within_high_bound"], check


@pytest.mark.slow
def test_batch_is_bracketed_by_a_real_oom_and_plan_splits_the_batch() -> None:
    """`memfit batch` answers a size an OOM bounds; `memfit plan` reaches 32 with micro-batches."""
    found = _json(
        run_cli("batch", *MODEL, "--memory", "300MiB", "--soak-steps", "5", "--json", env=ENV)
    )
    assert found["stopped_by"] == "bracket", found
    assert 2 <= found["batch_size"] < 64
    assert any(t["oom"] or t["peak_bytes"] > found["limit_bytes"] for t in found["trials"])

    plan = _json(
        run_cli(
            "plan", *MODEL, "-b", "32", "--memory", "300MiB", "--precision", "float32",
            "--remat", "none", "--json", env=ENV,
        )
    )
    assert plan["micro_batch_size"] * plan["accumulation_steps"] == 32, plan
    assert plan["accumulation_steps"] >= 2  # 32 at once does not fit 300 MiB
    assert plan["micro_batch_size"] <= found["batch_size"] + 2


@pytest.mark.slow
def test_fit_recovers_on_a_shard_of_larger_images_and_the_report_shows_it(tmp_path) -> None:
    """Plain `fit` dies on 256 px images under 250 MiB; `memfit.fit`, watched, finishes."""
    shards = CHILDREN / "yolo_shards.py"
    plain = run_isolated(shards, env=ENV, args={"mode": "plain"})
    assert plain == "ResourceExhaustedError"

    log = tmp_path / "run.jsonl"
    result = run_isolated(shards, env=ENV, args={"mode": "watched", "log": str(log)})
    summary = result["summary"]
    assert summary["updates"] == result["updates"] == 4  # no batch lost
    small = [k for k in summary["micro_batches"] if k.startswith("8x128x128x3")]
    large = [k for k in summary["micro_batches"] if k.startswith("8x256x256x3")]
    assert summary["micro_batches"][small[0]] == 1 and summary["micro_batches"][large[0]] >= 2
    assert summary["recoveries"][0]["input_shapes"][0] == [8, 256, 256, 3]
    assert result["loss"] == result["loss"]  # finite, not NaN
    assert "oom_recovery" in result["findings"]

    out = _json(run_cli("report", str(log), "--json", env=ENV))
    assert (tmp_path / "run.html").exists()
    assert any(f["kind"] == "oom_recovery" for f in out["findings"])
