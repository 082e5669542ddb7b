"""A TF Model Garden task as a step spec: `memfit measure` / `estimate` of RetinaNet's own
`train_step` (ResNet-18, 128 px), named as `garden:EXPERIMENT --set ...` and as a module path,
and the one line each bad input gets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import run_cli, run_isolated
from mypkg.garden import as_options, retinanet_sets

HERE = os.path.dirname(os.path.abspath(__file__))
CHILDREN = Path(HERE) / "children"
TASK = "garden:retinanet_resnetfpn_coco"


@pytest.fixture(scope="module")
def od_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = str(tmp_path_factory.mktemp("od"))
    run_isolated(CHILDREN / "write_od.py", args={"folder": folder})
    return folder


def small(folder: str) -> list[str]:
    """`--set` options of a small RetinaNet: ResNet-18, 128 px, 6 classes, no checkpoint."""
    return as_options(retinanet_sets(f"{folder}/train-*"))


def env(folder: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), HERE) if p)
    return {"PYTHONPATH": path, "MEMFIT_TEST_OD": folder, "TF_CPP_MIN_LOG_LEVEL": "2"}


def one_line(proc: object) -> str:
    assert proc.returncode == 2, proc.stderr  # type: ignore[attr-defined]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("memfit: ")]  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("memfit: error: "), proc.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in proc.stderr  # type: ignore[attr-defined]
    return lines[0]


@pytest.mark.slow
def test_measure_and_estimate_of_the_tasks_own_step(od_data: str) -> None:
    common = [*small(od_data), "--memory", "2GiB", "--json"]
    measured = run_cli("measure", TASK, "-b", "2", *common, env=env(od_data))
    assert measured.returncode == 0, measured.stderr
    m = json.loads(measured.stdout)
    assert m["oom"] is False and m["batch_size"] == 2
    # ResNet-18 RetinaNet: ~19 M weights and SGD momentum, ~150 MiB before the step.
    assert 100 * 2**20 < m["resident_bytes"] < 250 * 2**20
    assert m["peak_bytes"] > m["resident_bytes"] + 50 * 2**20 and m["step_seconds"] > 0
    estimated = run_cli("estimate", TASK, "-b", "2", *common, "--samples", "0", env=env(od_data))
    assert estimated.returncode == 0, estimated.stderr
    e = json.loads(estimated.stdout)
    assert e["breakdown"]["optimizer_slots_bytes"] > 50 * 2**20  # the legacy SGD's momentum
    assert 0.7 < e["peak_bytes"] / m["peak_bytes"] < 1.4, (e["peak_bytes"], m["peak_bytes"])


@pytest.mark.slow
def test_a_batch_over_the_budget_is_a_real_oom(od_data: str) -> None:
    proc = run_cli(
        "measure",
        TASK,
        "-b",
        "4",
        *small(od_data),
        "--memory",
        "250MiB",
        "--json",
        env=env(od_data),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["oom"] is True and result["peak_bytes"] > 150 * 2**20


def test_a_module_path_names_the_experiment(od_data: str) -> None:
    proc = run_cli(
        "estimate",
        "garden:garden_tasks:experiment",
        "-b",
        "2",
        "--samples",
        "0",
        "--json",
        env=env(od_data),
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["peak_bytes"] > 200 * 2**20


@pytest.mark.parametrize(
    ("model", "extra", "words"),
    [
        ("garden:retinanet_resnet", [], "close names: retinanet_resnetfpn_coco"),
        (TASK, ["--set", "task.model.no_such_key=3"], "does not apply"),
        (TASK, ["--set", "task.model.input_size"], "key.path=value"),
        ("garden:garden_tasks:not_a_config", [], "not a Model Garden ExperimentConfig"),
        ("garden_tasks:experiment", [], "garden:garden_tasks:experiment"),
        ("garden_tasks:tf_keras_model", [], "tf_keras (Keras 2)"),
    ],
)
def test_bad_input_is_one_line(od_data: str, model: str, extra: list[str], words: str) -> None:
    proc = run_cli("estimate", model, "-b", "2", *extra, env=env(od_data))
    assert words in one_line(proc)


@pytest.mark.slow
def test_batch_of_the_tasks_own_step_is_bracketed_and_trains_twenty_steps(od_data: str) -> None:
    """`memfit batch` on the task: trials of its own `train_step`, a size over the limit next
    to the answer, and the answer soaked 20 steps in a fresh process under the budget."""
    proc = run_cli(
        "batch", TASK, *small(od_data), "--memory", "450MiB", "--max-batch", "32", "--json",
        env=env(od_data),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    answer, limit = result["batch_size"], result["limit_bytes"]
    assert result["stopped_by"] == "bracket" and 1 < answer < 32, result
    soaks = [t for t in result["trials"] if t["soak"]]
    assert soaks[-1]["batch_size"] == answer and soaks[-1]["fits"], soaks
    assert soaks[-1]["steps"] >= 20 and soaks[-1]["peak_bytes"] <= limit
    over = [t for t in result["trials"] if not t["fits"]]
    assert over and min(t["batch_size"] for t in over) > answer, result["trials"]


@pytest.mark.slow
def test_plan_of_the_tasks_own_step_splits_the_batch_and_confirms_it(od_data: str) -> None:
    """`memfit plan` on the task: K measured through its own step at equal splits, the
    fastest that fits confirmed by 20 steps of `GuardedStep.from_task` in a fresh process.

    Batch 16 runs out of memory whole under 520 MiB; the gradient sums a micro-batched step
    keeps (ResNet-18 RetinaNet: 20 M parameters) take back much of what a split saves, so
    the answer is K=4 or K=8.
    """
    proc = run_cli(
        "plan", TASK, *small(od_data), "-b", "16", "--memory", "520MiB", "--json",
        env=env(od_data),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["fits"] and plan["confirmed"], plan
    assert plan["micro_batches"] in (4, 8) and plan["precision"] == "task's own", plan
    assert "20 steps of GuardedStep.from_task" in plan["confirmation"]
    assert plan["peak_bytes"] <= plan["limit_bytes"]
    whole = [c for c in plan["candidates"] if c["micro_batches"] == 1]
    assert whole and not whole[0]["fits"], plan["candidates"]
    assert all(16 % c["micro_batches"] == 0 for c in plan["candidates"])


def test_plan_of_a_task_refuses_precision_in_one_line(od_data: str) -> None:
    proc = run_cli(
        "plan", TASK, *small(od_data), "-b", "8", "--memory", "1GiB",
        "--precision", "mixed_float16", env=env(od_data),
    )  # fmt: skip
    assert "runtime.mixed_precision_dtype" in one_line(proc)


def test_a_tf_keras_step_fn_in_process_is_measured_and_estimated() -> None:
    out = run_isolated(CHILDREN / "tf_keras_step_spec.py")
    assert out["restored"] and out["iterations"] == 0  # the steps measured were put back
    assert out["peak"] > out["resident"] > 0
    assert 0.7 < out["estimate"] / out["peak"] < 1.4, out
