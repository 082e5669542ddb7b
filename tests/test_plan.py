"""memfit.plan and `memfit plan`: measured candidates, the fastest that fits, clear errors."""

from __future__ import annotations

import json
import os

import pytest
from helpers import run_cli, run_isolated

TESTS = os.path.dirname(__file__)


@pytest.mark.slow
def test_plan_splits_a_batch_that_does_not_fit_and_fit_follows_it() -> None:
    result = run_isolated(
        """
import memfit, numpy as np
p = memfit.plan("factories:small_cnn", 64, "150MiB", precisions=["float32"],
                remat_modes=[None])
m = memfit.load_model("factories:small_cnn")
x = np.zeros((64, 64, 64, 3), "float32"); y = np.zeros((64,), "int64")
h = memfit.fit(m, x, y, batch_size=64, epochs=1, verbose=0, micro_batches=p)
emit({"plan": p.to_dict(), "summary": p.summary(), "fit": h.memfit.to_dict()})
""",
        env={"PYTHONPATH": TESTS, "MEMFIT_MEMORY": "150MiB"},
    )
    plan = result["plan"]
    assert plan["fits"]
    assert plan["accumulation_steps"] > 1
    assert plan["micro_batch_size"] * plan["accumulation_steps"] >= 64
    first = plan["candidates"][0]
    assert first["micro_batches"] == 1 and not first["fits"]
    assert plan["peak_bytes"] <= plan["limit_bytes"]
    # memfit.fit trains at the planned K without needing a recovery.
    assert result["fit"]["recoveries"] == []
    assert list(result["fit"]["micro_batches"].values()) == [plan["accumulation_steps"]]


@pytest.mark.slow
def test_plan_cli_json_and_a_plain_model_file_plans_k_only(tmp_path) -> None:
    env = {"PYTHONPATH": TESTS}
    proc = run_cli(
        "plan",
        "factories:small_cnn",
        "--batch-size",
        "16",
        "--memory",
        "1GiB",
        "--precision",
        "float32",
        "--precision",
        "mixed_bfloat16",
        "--remat",
        "none",
        "--json",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    for key in ("micro_batch_size", "accumulation_steps", "precision", "remat"):
        assert key in data
    assert {c["precision"] for c in data["candidates"]} == {"float32", "mixed_bfloat16"}
    assert data["accumulation_steps"] == 1  # batch 16 fits 1 GiB unsplit


def test_plan_bad_input_is_one_line() -> None:
    proc = run_cli("plan", "keras.applications.MobileNetV2", "--batch-size", "0")
    assert proc.returncode == 2
    assert proc.stderr.startswith("memfit: error:") and "Traceback" not in proc.stderr
    proc = run_cli("plan", "keras.applications.MobileNetV2")
    assert proc.returncode == 2 and "--batch-size" in proc.stderr
