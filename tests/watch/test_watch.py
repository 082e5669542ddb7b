"""memfit.Watch on real training: each detector on the run it is for, and no false alarms.

All scenarios run in one child process under an emulated budget (the CPU's BFC allocator
keeps the memory statistics Watch reads), one after the other, each with its own model.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"
SCENARIOS = CHILDREN / "scenarios.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    logs = tmp_path_factory.mktemp("watch_logs")
    result = run_isolated(
        SCENARIOS,
        env={"MEMFIT_MEMORY": "256MiB", "TF_NUM_INTEROP_THREADS": "1"},
        args={"logs": str(logs)},
        timeout=600,
    )
    result["_logs"] = str(logs)
    return result


def _kinds(run: dict) -> list[str]:
    return [f["kind"] for f in run["findings"]]


def _finding(run: dict, kind: str) -> dict:
    found = [f for f in run["findings"] if f["kind"] == kind]
    assert found, f"no {kind} finding; got {run['findings']}"
    return found[0]


@pytest.mark.slow
def test_retracing_every_batch_is_memory_growth_with_retracing_named(runs: dict) -> None:
    run = runs["retrace"]
    growth = _finding(run, "memory_growth")
    assert growth["evidence"]["cause"] == "retracing"
    assert "traced" in growth["cause"] and growth["evidence"]["retraces"] >= 2
    assert growth["evidence"]["rise_bytes"] >= 1024 * 1024
    assert "retracing" in _kinds(run)
    assert growth["fix"] and growth["severity"] == "problem"


@pytest.mark.slow
def test_tensors_kept_in_a_callback_list_are_memory_growth(runs: dict) -> None:
    run = runs["leak"]
    growth = _finding(run, "memory_growth")
    assert growth["evidence"]["cause"] == "python_references"
    assert "list" in growth["cause"]
    assert "retracing" not in _kinds(run)
    # ~256 KiB of feature maps kept per step
    assert growth["evidence"]["growth_bytes_per_step"] > 100 * 1024


@pytest.mark.slow
def test_map_without_parallelism_and_a_sleep_is_input_bound(runs: dict) -> None:
    run = runs["input"]
    bound = _finding(run, "input_bound")
    assert bound["evidence"]["input_wait_fraction"] >= 0.25
    assert "num_parallel_calls" in bound["fix"] and "prefetch" in bound["fix"]
    assert "memory_growth" not in _kinds(run)


@pytest.mark.slow
def test_learning_rate_10_is_flagged_diverging_before_nan(runs: dict) -> None:
    run = runs["lr10"]
    divergence = _finding(run, "divergence")
    first_nan = next(
        (i for i, v in enumerate(run["losses"]) if v is None or not math.isfinite(v)),
        len(run["losses"]),
    )
    assert divergence["step"] < first_nan
    assert divergence["evidence"]["learning_rate"] == pytest.approx(10.0)
    assert "learning rate" in divergence["fix"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["clean_cnn", "clean_mlp", "clean_text", "clean_batch4"])
def test_clean_runs_have_no_finding(runs: dict, name: str) -> None:
    run = runs[name]
    assert run["steps"] >= 60
    assert run["findings"] == [], run["findings"]
    assert run["summary"]["peak_bytes"] > 0
    # Watch times its own work: always counted; at its defaults (no TensorBoard folder, whose
    # writer is traced once per fit) well under a couple of milliseconds a step.
    own = run["summary"]["watch_seconds"]
    assert own > 0 and run["summary"]["watch_overhead_fraction"] > 0
    if name != "clean_mlp":
        assert own / run["steps"] < 0.002, own


@pytest.mark.slow
def test_near_budget_names_the_batch_that_would_not_fit(runs: dict) -> None:
    near = _finding(runs["near"], "near_budget")
    evidence = near["evidence"]
    assert evidence["budget_bytes"] == runs["near"]["budget"]
    assert evidence["peak_bytes"] >= 0.9 * evidence["budget_bytes"]
    assert evidence["oom_batch_size"] > evidence["batch_size"] == 16


@pytest.mark.slow
def test_oom_recoveries_of_memfit_fit_are_findings(runs: dict) -> None:
    run = runs["oom"]
    recovery = _finding(run, "oom_recovery")
    assert recovery["evidence"]["new_micro_batches"] > recovery["evidence"]["old_micro_batches"]
    assert run["summary"]["micro_batches"]


@pytest.mark.slow
def test_log_has_header_steps_findings_and_tensorboard_scalars(runs: dict) -> None:
    path = os.path.join(runs["_logs"], "leak.jsonl")
    with open(path, encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    assert lines[0]["type"] == "header" and lines[0]["tool"] == "memfit.watch"
    assert lines[0]["estimate_peak_bytes"] == 60 * 2**20
    steps = [line for line in lines if line["type"] == "step"]
    assert [s["step"] for s in steps] == list(range(64))
    assert all(s["memory_peak_bytes"] and s["loss"] is not None for s in steps)
    assert steps[0]["batch_size"] == 16
    assert any(line["type"] == "finding" for line in lines)
    assert lines[-1]["type"] == "end" and lines[-1]["steps"] == 64
    assert {
        "memfit/memory_current_bytes",
        "memfit/step_seconds",
        "memfit/input_wait_seconds",
    } <= set(runs["clean_mlp"]["tensorboard_tags"])


@pytest.mark.slow
def test_batch4_noise_quiet_where_the_old_spike_rule_fired(runs: dict) -> None:
    """The control: the rule Watch used before (3x the recent median, 1.5x the start) fires
    on this run's losses; the noise-aware detectors do not."""
    losses = [v for v in runs["clean_batch4"]["losses"] if v is not None]
    base = sorted(losses[:3])[1]
    fired = [
        i
        for i in range(2, len(losses))
        if losses[i] > 3 * sorted(losses[max(0, i - 20) : i])[len(losses[max(0, i - 20) : i]) // 2]
        and losses[i] > 1.5 * base
    ]
    assert fired, "the control did not fire: pick a noisier seed"
    assert runs["clean_batch4"]["findings"] == []
