"""memfit.estimate, trace once, replay many: a step made from two traces equals a fresh trace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import run_cli, run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECKS = CHILDREN / "reuse_checks.py"


@pytest.fixture(scope="module")
def results():
    return run_isolated(CHECKS, env={"PYTHONPATH": TESTS})


@pytest.mark.parametrize("model", ["small_cnn", "flat_bn_sgd"])
def test_a_step_made_from_two_traces_equals_a_fresh_trace(results, model):
    rows = results[model]
    for size in ("6", "40"):
        assert rows[size] == {"made": True, "same": True}, (size, rows)


@pytest.mark.parametrize("model", ["small_cnn", "flat_bn_sgd"])
def test_one_trace_sized_again_equals_a_fresh_trace(results, model):
    assert results[model]["sized"] == {"3": True, "12": True}
    assert results[model]["sized_ops"]


def test_the_optimizer_what_if_recompiled_equals_a_fresh_build(results):
    got = results["recompiled"]
    assert got["row"] is not None and got["row"] == got["fresh"], got
    assert got["row"] != got["base"]  # another optimizer: other slots
    assert got["base"] == got["alone"]  # the base estimate is the one made alone


@pytest.mark.parametrize("model", ["small_cnn", "flat_bn_sgd"])
def test_sizes_that_may_build_other_ops_are_traced(results, model):
    # Batch 1 (other kernels) and a batch equal to a fixed dimension (3: the kernels' 3x3,
    # RGB) may trace to other ops: the estimate traces them instead.
    assert results[model]["refused"] == {"1": True, "3": True}


def test_what_ifs_at_other_batch_sizes_equal_fresh_estimates(results):
    what_ifs = results["what_ifs"]
    assert what_ifs["rows"][:2] == ["batch size 4", "batch size 16"]
    assert what_ifs["rows"][2].startswith("largest batch for")
    assert what_ifs["batch_rows"] == what_ifs["fresh"]
    largest = what_ifs["largest"]
    assert largest["batch_size"] and largest["peak_bytes"] <= 96 << 20


def test_samples_replayed_in_a_child_give_the_same_bound(results):
    background = results["background"]
    assert background["samples"] == 5
    assert background["ranges"] == {here: [True, True] for here in ("0", "1", "2", "5")}
    # The estimates gave the garbage collector back what they froze.
    assert background["frozen_after"] == 0


def test_the_time_is_reported(results):
    what_ifs = results["what_ifs"]
    assert 0 < what_ifs["estimate_seconds"] == what_ifs["json_seconds"]
    proc = run_cli(
        "estimate", "factories:small_cnn", "-b", "4", "--no-what-ifs", env={"PYTHONPATH": TESTS}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "estimated in " in proc.stdout and " s" in proc.stdout.split("estimated in ")[1]


def test_a_high_bound_child_that_hangs_is_stopped_and_replayed_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from memfit.estimation import background
    from memfit.estimation.bounds import PeakRange

    parent = os.getpid()

    def replayed(graph: object, region: object, seed: int, first: int, count: int) -> PeakRange:
        if os.getpid() != parent:  # the forked child: hang (a deadlock, say)
            time.sleep(60)
        return PeakRange(0, 100 + first, [100 + first + i for i in range(count)])

    def own(graph: object, likely: int, *, samples: int, **_: object) -> PeakRange:
        return PeakRange(likely, max(likely, 50), [50] * samples)

    monkeypatch.setattr(background, "_replayed", replayed)
    monkeypatch.setattr(background, "peak_range", own)
    monkeypatch.setattr(background, "CHILD_GRACE_S", 0.5)
    pending = background.start_peak_range(object(), samples=4, here=2)
    child = pending.pid
    started = time.monotonic()
    got = pending.result(10)
    assert time.monotonic() - started < 20
    # The child was stopped, its samples (2 and 3) replayed here.
    assert got.high_bytes == 102 and got.sample_bytes == [50, 50, 102, 103]
    assert child is not None and pending.pid is None
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)
