"""keras-hub's D-FINE (DETR family, HGNetV2, Hungarian matching) through memfit's commands.

The model (`mypkg.detectors:dfine`: 64 px, 16 queries, 2 decoder layers) and its samples
(`mypkg.detectors:dfine_data`, normalised center_xywh boxes) are built offline and trained
through D-FINE's own `compute_loss`; budgets are emulated, so each OOM is TensorFlow's own.
A D-FINE step takes 50-60 s to trace on 2 CPU cores, so each test starts as few processes as
it can.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import run_cli, run_isolated

pytest.importorskip("keras_hub")

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(os.path.dirname(TESTS), "src")
ENV = {"PYTHONPATH": os.pathsep.join([SRC, TESTS]), "DFINE_SIZE": "64"}
MODEL = ("mypkg.detectors:dfine", "--data", "mypkg.detectors:dfine_data")
CHILDREN = Path(__file__).resolve().parent / "children"


def _json(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_a_model_that_cannot_trace_is_one_error_line_in_estimate_and_measure() -> None:
    """32 queries but 20 anchors at 64 px: Keras' error as one line, the same in both."""
    env = {**ENV, "DFINE_QUERIES": "32"}
    lines = {}
    for command in ("estimate", "measure"):
        proc = run_cli(command, *MODEL, "-b", "2", "--memory", "600MiB", env=env)
        assert proc.returncode == 2, proc.stderr[-2000:]
        errors = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and errors[0].startswith("memfit: error: "), proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and "\x1b[" not in proc.stderr
        lines[command] = errors[0]
    cause = (
        "ValueError: Exception encountered when calling "
        "DFineInitialQueryAndReferenceGenerator.call(): input must have last dimension >= "
        "k = 32 but is 20"
    )
    assert all(cause in line for line in lines.values()), lines


@pytest.mark.slow
def test_estimate_checked_against_a_measured_step() -> None:
    """The estimate of D-FINE's step is within 20% of the measured peak, under its high bound.

    One inter-op thread, as TensorFlow's environment variable sets it for the estimate and
    the measured steps alike: at 64 px the stem's two Conv2D backprop kernels hold a 27 MiB
    im2col buffer each, and whether they run at once under two threads depends on the
    machine (both: 68 MiB, one after the other: 40 MiB).
    """
    env = {**ENV, "TF_NUM_INTEROP_THREADS": "1"}
    out = _json(
        run_cli("estimate", *MODEL, "-b", "2", "--check", "--no-what-ifs", "--json", env=env)
    )
    check = out["check"]
    assert check["measured_bytes"] > 20 << 20
    assert abs(check["error"]) < 0.2, check
    assert check["within_high_bound"], check


@pytest.mark.slow
def test_fit_recovers_from_a_batch_too_large_and_the_report_shows_it(tmp_path) -> None:
    """Batches of 32 at 128 px OOM under 150 MiB; `memfit.fit`, watched, trains them in halves.

    D-FINE's anchors are fixed to one image size, so what grows here is the batch.
    """
    log = tmp_path / "run.jsonl"
    result = run_isolated(CHILDREN / "dfine_fit.py", env=ENV, args={"log": str(log)})
    summary = result["summary"]
    assert summary["updates"] == result["updates"] == 2  # both batches, one update each
    recovery = summary["recoveries"][0]
    assert recovery["old_micro_batches"] == 1 and recovery["new_micro_batches"] >= 2
    assert recovery["input_shapes"][0] == [32, 128, 128, 3]
    assert "OOM" in recovery["message"]
    assert result["loss"] == result["loss"]  # not NaN
    assert "oom_recovery" in result["findings"]

    out = _json(run_cli("report", str(log), "--json", env=ENV))
    assert (tmp_path / "run.html").exists()
    assert any(f["kind"] == "oom_recovery" for f in out["findings"])


@pytest.mark.slow
def test_batch_and_plan_under_an_emulated_card() -> None:
    """`memfit batch` brackets D-FINE's largest batch; `memfit plan` reaches 32 in micro-batches.

    One inter-op thread (TensorFlow's variable, seen by the trials and the estimate alike):
    at 64 px the stem's two 27 MiB im2col buffers otherwise overlap in some steps and not in
    others, and the search chases that noise. The soak (20 steps of `model.fit` in fresh
    processes) is left out here (`--soak-steps 0`; the YOLO tests soak): D-FINE's trace makes
    each soak process a minute or more.
    """
    env = {**ENV, "TF_NUM_INTEROP_THREADS": "1"}
    found = _json(
        run_cli("batch", *MODEL, "--memory", "64MiB", "--soak-steps", "0", "--json", env=env)
    )
    assert found["stopped_by"] == "bracket", found
    assert 2 <= found["batch_size"] < 32  # 3 in a whole suite, more alone
    plan = _json(
        run_cli(
            "plan", *MODEL, "-b", "32", "--memory", "64MiB", "--precision", "float32",
            "--remat", "none", "--no-confirm", "--json", env=env,
        )
    )
    assert plan["micro_batch_size"] * plan["accumulation_steps"] == 32, plan
    assert plan["accumulation_steps"] >= 2
