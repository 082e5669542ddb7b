"""Per-replica planning: the global batch split, one budget per replica, the tightest decides."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from helpers import run_cli

from memfit.budget.budget import (
    Budget,
    as_budgets,
    resolve_budgets,
    split_budget_list,
    tightest_index,
)
from memfit.cli.options import replica_budget_specs
from memfit.errors import MemfitError
from memfit.measuring.replicas import per_replica_batch, replica_budget, replica_count
from memfit.planning import Plan

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_global_batch_splits_evenly_or_says_which_sizes_would() -> None:
    assert per_replica_batch(256, 4) == 64
    assert per_replica_batch(7, 1) == 7
    with pytest.raises(MemfitError, match=r"batch 10 is not divisible by 4 replicas.*8 or 12"):
        per_replica_batch(10, 4)
    with pytest.raises(MemfitError, match=r"not divisible by 4 replicas.*use 4$"):
        per_replica_batch(3, 4)
    with pytest.raises(MemfitError, match="replicas must be a whole number of at least 1, got 0"):
        per_replica_batch(8, 0)


def test_budget_lists_parse_one_per_replica() -> None:
    assert split_budget_list(" T4, L4 ") == ["T4", "L4"]
    assert [b.usable_bytes for b in resolve_budgets(memory="1GiB,512MiB")] == [2**30, 2**29]
    assert [b.name for b in resolve_budgets(device="T4,L4")] == ["T4", "L4"]
    assert [b.name for b in as_budgets("T4,L4")] == ["T4", "L4"]
    assert [b.usable_bytes for b in as_budgets([2**20, "2MiB"])] == [2**20, 2**21]
    assert as_budgets(None) == [] and resolve_budgets() == []
    with pytest.raises(MemfitError, match="empty entry"):
        split_budget_list("T4,,L4")
    with pytest.raises(MemfitError, match="either --memory or --device"):
        resolve_budgets(memory="1GiB", device="T4")


def test_the_tightest_budget_decides() -> None:
    budgets = resolve_budgets(device="L4,T4,A100-40GB")
    assert budgets[tightest_index(budgets)].name == "T4"
    assert tightest_index(as_budgets(["2GiB", "1GiB", "1GiB"])) == 1  # the first of equals
    # The CLI emulates the tightest budget alone, as --memory / --device would name it.
    assert replica_budget_specs(None, "L4,T4", None) == (None, "T4", 2)
    assert replica_budget_specs("22GiB,15GiB", None, 2) == ("15GiB", None, 2)
    assert replica_budget_specs("1GiB", None, 4) == ("1GiB", None, 4)  # one budget, shared
    assert replica_budget_specs(None, None, None) == (None, None, 1)


def test_replica_counts_that_disagree_are_one_error() -> None:
    assert replica_count() == 1
    assert replica_count(strategy=SimpleNamespace(num_replicas_in_sync=8)) == 8
    assert replica_count(3, budgets=3) == 3 and replica_count(3, budgets=1) == 3
    with pytest.raises(MemfitError, match=r"disagree: 3 --replicas / replicas=, 2 budgets"):
        replica_count(3, budgets=2)
    with pytest.raises(MemfitError, match="disagree"):
        replica_count(2, strategy=SimpleNamespace(num_replicas_in_sync=4))
    with pytest.raises(MemfitError, match="replicas must be a whole number"):
        replica_count(0)


def test_each_replica_budget_keeps_room_for_the_all_reduce() -> None:
    budget = Budget.from_size("1GiB")
    assert replica_budget(budget, 2**20, 1) is budget  # one replica: no all-reduce
    reduced = replica_budget(budget, 2**20, 2)
    assert reduced.usable_bytes == 2**30 - 2**20
    assert "all-reduce" in reduced.name and "all-reduce" in reduced.notes[-1]
    with pytest.raises(MemfitError, match="all-reduce buffer alone"):
        replica_budget(budget, 2**30, 2)


def test_a_plan_says_replicas_and_its_global_batch() -> None:
    budget = Budget.from_size("1GiB")
    one = Plan(64, 2, 32, "float32", None, 2**29, 0.1, budget, 0.05)
    assert one.to_dict()["replicas"] == 1 and one.per_replica_batch_size == 64
    two = Plan(64, 4, 8, "float32", None, 2**29, 0.1, budget, 0.05, replicas=2)
    data = two.to_dict()
    assert (data["replicas"], data["per_replica_batch_size"], data["batch_size"]) == (2, 32, 64)
    assert "per-replica micro-batch 8, K=4, global effective batch 64 (2 replicas x 4 x 8" in (
        two.summary()
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (("batch", "--replicas", "3", "--device", "T4,L4"), "replica counts disagree"),
        (("batch", "--replicas", "0"), "replicas must be a whole number of at least 1"),
        (("plan", "-b", "64", "--memory", "1GiB,,2GiB"), "empty entry"),
        (("plan", "-b", "64", "--replicas", "3"), "global batch 64 is not divisible by 3"),
    ],
)
def test_cli_replica_mistakes_are_one_line(args: tuple[str, ...], says: str) -> None:
    proc = run_cli(args[0], "factories:small_cnn", *args[1:], env={"PYTHONPATH": TESTS})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("memfit: error:") and says in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_cli_plan_over_two_replicas_plans_each_replica_share() -> None:
    # small_cnn: 32 samples per replica do not fit 100 MiB unsplit (about 123 MiB); the
    # tightest of the two budgets decides, less the gradient all-reduce's buffer.
    proc = run_cli(
        *("plan", "factories:small_cnn", "-b", "64", "--replicas", "2"),
        *("--memory", "100MiB,1GiB", "--precision", "float32", "--remat", "none"),
        *("--no-confirm", "--json"),
        env={"PYTHONPATH": TESTS},
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["fits"] and data["replicas"] == 2 and data["per_replica_batch_size"] == 32
    assert data["accumulation_steps"] > 1
    assert 2 * data["accumulation_steps"] * data["micro_batch_size"] == 64
    assert data["allreduce_bytes"] > 0
    assert data["budget"]["usable_bytes"] == 100 * 2**20 - data["allreduce_bytes"]
    assert data["peak_bytes"] <= data["limit_bytes"]


def test_cli_batch_over_two_replicas_reports_per_replica_and_global() -> None:
    proc = run_cli(
        *("batch", "factories:any_size_cnn", "--input-shape", "16,16,3", "--replicas", "2"),
        *("--memory", "300MiB", "--soak-steps", "0", "--max-batch", "4"),
        env={"PYTHONPATH": TESTS},
    )
    assert proc.returncode == 0, proc.stderr
    assert "largest batch: 4 per replica, global batch 8 over 2 replicas (2 x 4;" in proc.stdout
    assert "kept per replica for the gradient all-reduce" in proc.stdout
