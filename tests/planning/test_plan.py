"""memfit.plan and `memfit plan`: estimated candidates, measured finalists, a confirmed choice."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import run_cli, run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_plan_splits_a_batch_that_does_not_fit_and_fit_follows_it() -> None:
    result = run_isolated(
        CHILDREN / "plan_and_fit.py",
        env={"PYTHONPATH": TESTS, "MEMFIT_MEMORY": "150MiB"},
    )
    plan = result["plan"]
    assert plan["fits"]
    assert plan["accumulation_steps"] > 1
    assert plan["micro_batch_size"] * plan["accumulation_steps"] >= 64
    first = plan["candidates"][0]
    # K=1 was only estimated (predicted over the limit), never run.
    assert first["micro_batches"] == 1 and not first["fits"] and first["estimated_only"]
    assert plan["peak_bytes"] <= plan["limit_bytes"]
    assert plan["confirmed"] and "trained 20 steps of memfit.fit" in plan["confirmation"]
    assert "Confirmed: trained 20 steps" in result["summary"]
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
    assert data["accumulation_steps"] == 1  # batch 16 fits 1 GiB unsplit
    assert data["precision"] == "float32" and data["confirmed"]
    # mixed_bfloat16 costs more per step on a CPU and cannot need fewer than one
    # micro-batch: it is not even estimated.
    assert {c["precision"] for c in data["candidates"]} == {"float32"}
    assert "Not estimated: 1 configuration (mixed_bfloat16)" in data["note"]


def test_plan_bad_input_is_one_line() -> None:
    proc = run_cli("plan", "keras.applications.MobileNetV2", "--batch-size", "0")
    assert proc.returncode == 2
    assert proc.stderr.startswith("memfit: error:") and "Traceback" not in proc.stderr
    proc = run_cli("plan", "keras.applications.MobileNetV2")
    assert proc.returncode == 2 and "--batch-size" in proc.stderr


@pytest.mark.slow
def test_a_choice_that_needs_a_recovery_gives_way_to_more_micro_batches(monkeypatch) -> None:
    # small_cnn at batch 64 under 140 MiB: one unsplit step fits (about 139 MiB), the second
    # runs out of memory, so only the 20-step confirmation shows that K=1 does not hold.
    monkeypatch.setenv("PYTHONPATH", TESTS)
    from memfit.budget.budget import Budget
    from memfit.planning.planner import Planner
    from memfit.workload.spec import WorkloadSpec

    budget = Budget.from_size("140MiB")
    planner = Planner(
        64,
        budget,
        int(budget.usable_bytes * 0.95),
        workload=WorkloadSpec("factories:small_cnn"),
        repeats=1,
        on_candidate=None,
    )
    chosen, how = planner.confirm_queue([planner.candidate("float32", None, 1)], 20)
    first = planner.candidates[0]
    # K=1 does not hold: a later step runs out of memory, or (the allocator's history
    # differs from process to process) peaks over the limit without running out.
    assert first.confirmed is False and first.recoveries
    assert first.oom or "over the limit" in first.recoveries[0]
    assert "out of memory" in first.recoveries[0] or "over the limit" in first.recoveries[0]
    assert chosen is not None and chosen.confirmed and chosen.micro_batches >= 2
    assert chosen.peak_bytes <= int(budget.usable_bytes * 0.95)
    assert how.startswith("confirmed: trained 20 steps") and "K=1 float32 did not hold" in how


def test_plan_no_confirm_answers_from_a_measured_step_and_says_so() -> None:
    proc = run_cli(
        "plan",
        "factories:small_cnn",
        "--batch-size",
        "8",
        "--memory",
        "512MiB",
        "--precision",
        "float32",
        "--remat",
        "none",
        "--no-confirm",
        "--json",
        env={"PYTHONPATH": TESTS},
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["confirmed"] is None and data["confirmation"] == ""
    chosen = data["candidates"][0]
    assert chosen["measured"] and chosen["confirmed"] is None and not chosen["estimated_only"]
    assert chosen["predicted_peak_bytes"] and chosen["peak_bytes"] <= data["limit_bytes"]


@pytest.mark.slow
def test_plan_measures_only_the_finalists_and_confirms_the_fastest() -> None:
    proc = run_cli(
        "plan",
        "factories:small_cnn",
        "--batch-size",
        "64",
        "--memory",
        "150MiB",
        "--json",
        env={"PYTHONPATH": TESTS},
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    by_config = {(c["precision"], c["remat"], c["micro_batches"]): c for c in data["candidates"]}
    # float32 needs 2 micro-batches; mixed_float16 fits unsplit, so it is a finalist too.
    # Recompute at K=1 is predicted over the limit; nothing else is even estimated.
    measured = {key for key, c in by_config.items() if c["measured"]}
    assert measured == {("float32", None, 2), ("mixed_float16", None, 1)}
    assert by_config[("float32", None, 1)]["estimated_only"]
    assert all(c["predicted_peak_bytes"] for c in data["candidates"])
    assert ("mixed_bfloat16", None, 1) not in by_config and "mixed_bfloat16" in data["note"]
    # On a CPU float32 is the faster of the two; it is the one confirmed.
    chosen = by_config[(data["precision"], data["remat"], data["accumulation_steps"])]
    assert (data["precision"], data["accumulation_steps"]) == ("float32", 2)
    assert chosen["confirmed"] and data["confirmed"]
    assert by_config[("mixed_float16", None, 1)]["confirmed"] is None


def test_a_failed_choice_gives_way_to_the_next_fastest_not_blindly_to_more_k(monkeypatch) -> None:
    # MobileNetV2 96 px, batch 16 under 150 MiB: K=2 float32 measured 0.191 s
    # and peaked over the limit in its confirmation; recompute K=1 was measured at 0.210 s.
    # K=4 float32 (never measured) is expected slower than recompute K=1, so recompute goes
    # next; a finalist slower than the larger K waits behind it.
    from memfit.budget.budget import Budget
    from memfit.planning.planner import Planner

    budget = Budget.from_size("150MiB")
    planner = Planner(16, budget, int(budget.usable_bytes * 0.95), {}, 1, None)
    split = planner.candidate("float32", None, 2)
    recompute = planner.candidate("float32", "memfit", 1)
    slow = planner.candidate("mixed_float16", None, 1)
    split.step_seconds, recompute.step_seconds, slow.step_seconds = 0.191, 0.210, 0.5
    tried = []

    def confirm(candidate, steps):
        tried.append((candidate.precision, candidate.remat, candidate.micro_batches))
        candidate.recoveries = [] if candidate is not split else ["peak over the limit"]
        return candidate is not split and candidate.remat != "memfit"

    monkeypatch.setattr(planner, "confirm", confirm)
    chosen, how = planner.confirm_queue([split, recompute, slow], 20)
    assert tried == [
        ("float32", None, 2),
        ("float32", "memfit", 1),
        ("float32", None, 4),
    ]
    assert chosen is planner.find("float32", None, 4) and "K=2 float32 did not hold" in how
    assert planner.expected_seconds(chosen, basis=split) == pytest.approx(
        0.191 * (1 + 0.15 * 2) / (1 + 0.15)
    )
