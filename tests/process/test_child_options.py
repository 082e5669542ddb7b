"""Every option of `memfit measure`, `batch` and `plan` reaches the child processes that load,
estimate and train MODEL (`--classes` and `--unsafe` used to be dropped there, so the answer
could be for another model than the one asked about).

The fast tests catch what each path hands its child process (the `WorkloadSpec`, whole) and
bind it to the child's function; the slow ones run the children and read their answers."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import run_cli, run_isolated

from memfit.budget.budget import Budget
from memfit.estimation.child import open_what_if_estimator  # noqa: F401 - named below
from memfit.measuring.child import measure_spec, open_measurer
from memfit.planning.child import open_estimator
from memfit.process.runner import entry_name
from memfit.training.child import confirm_plan
from memfit.workload.spec import WorkloadSpec

CHILDREN = Path(__file__).resolve().parent / "children"
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"PYTHONPATH": TESTS}
# MobileNet (v1): a built-in that builds and traces in about 6 s less CPU a process than
# MobileNetV2 (measured), and every command here builds it in one process or more.
MOBILENET = ("keras.applications.MobileNet", "--input-shape", "32,32,3")
# What --classes 20000 adds to MobileNet's resident bytes: the classifier's weights for 19000
# more classes (a 1x1 convolution of 1024 inputs and a bias each), and Adam's two slots of
# them. Large enough to stand out of the allocator's fragmentation, which moves a peak by
# several MiB. (Measured: resident bytes rose by 1.41x this, the allocator's
# rounding of the three 78 MB tensors; MobileNetV2's rose by 1.22x its own.)
CLASSES = "20000"
CLASSES_DELTA = (20000 - 1000) * (1024 + 1) * 4 * 3


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memfit: error:"), proc.stderr[-3000:]
    return lines[0]


# Every option a workload has, away from its default (precision and remat are the plan's).
SPEC = WorkloadSpec(
    "keras.applications.MobileNet",
    input_shape=(32, 32, 3),
    data="option_models:samples_40px",
    optimizer="sgd",
    loss="mse",
    classes=20000,
    safe_mode=False,
    worst_case=True,
)
CLI_OPTIONS = (
    "keras.applications.MobileNet",
    "--input-shape",
    "32,32,3",
    "--data",
    "option_models:samples_40px",
    "--optimizer",
    "sgd",
    "--loss",
    "mse",
    "--classes",
    "20000",
    "--unsafe",
)


class _Sent(Exception):
    """Raised by the fake runner once it has seen what a child would be given."""


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """What would start a child process: `(function, kwargs)`, read back from JSON as the
    child reads its job, and checked to bind to the child's function. Nothing starts."""
    import memfit.measuring.isolate
    import memfit.planning.trials
    import memfit.search.trials

    calls: list[tuple[Any, dict[str, Any]]] = []

    def record(function: Any, kwargs: dict[str, Any]) -> None:
        entry_name(function)  # a child could import it
        kwargs = json.loads(json.dumps(kwargs))
        inspect.signature(function).bind(**kwargs)
        calls.append((function, kwargs))

    def run_in_child(function: Any, kwargs: dict[str, Any], **_options: Any) -> Any:
        record(function, kwargs)
        if function.__name__ == "dataset_size":
            return 40
        raise _Sent

    class ChildWorker:
        def __init__(self, function: Any, kwargs: dict[str, Any], **_options: Any) -> None:
            record(function, kwargs)
            raise _Sent

    monkeypatch.setattr(memfit.measuring.isolate, "run_in_child", run_in_child)
    for trials in (memfit.search.trials, memfit.planning.trials):
        monkeypatch.setattr(trials, "run_in_child", run_in_child)
        monkeypatch.setattr(trials, "ChildWorker", ChildWorker)
    return calls


def _arrived(call: tuple[str, dict[str, Any]]) -> WorkloadSpec:
    return WorkloadSpec.from_json(call[1]["workload"])


def test_the_cli_hands_its_children_every_option(sent: list[Any]) -> None:
    from click.testing import CliRunner

    from memfit.cli import cli

    runner = CliRunner()
    result = runner.invoke(cli, ["measure", *CLI_OPTIONS, "-b", "2"])
    assert isinstance(result.exception, _Sent), result.output
    assert sent[-1][0] is measure_spec
    assert _arrived(sent[-1]) == dataclasses.replace(SPEC, worst_case=False)
    plan = ["plan", *CLI_OPTIONS, "-b", "4", "--memory", "1GiB", "--precision", "mixed_float16"]
    result = runner.invoke(cli, [*plan, "--remat", "memfit"])
    assert isinstance(result.exception, _Sent), result.output
    assert sent[-1][0] is open_estimator
    assert _arrived(sent[-1]) == SPEC  # with --data, the plan uses the largest samples


def test_search_and_plan_hand_their_children_every_option(sent: list[Any]) -> None:
    from memfit.planning.trials import PlanTrials
    from memfit.search.trials import TrialRunner
    from memfit.training.plan import Candidate

    with pytest.raises(_Sent):
        TrialRunner(SPEC, Budget.from_size("1GiB"), None, True)
    assert sent[-1][0] is open_measurer and sent[-1][1]["warm_relaxed"]
    assert _arrived(sent[-1]) == SPEC
    trials = PlanTrials(4, Budget.from_size("1GiB"), 2**29, SPEC, 1)
    candidate = Candidate("mixed_bfloat16", "larger_than", 2, 2)
    variant = dataclasses.replace(SPEC, precision="mixed_bfloat16", remat="larger_than")
    with pytest.raises(_Sent):
        trials.measure(candidate)
    assert sent[-1][0] is measure_spec and sent[-1][1]["micro_batches"] == 2
    assert _arrived(sent[-1]) == variant
    with pytest.raises(_Sent):
        trials.confirm(candidate, 3)
    assert sent[-1][0] is confirm_plan and sent[-1][1]["steps"] == 3
    assert _arrived(sent[-1]) == variant
    with pytest.raises(_Sent), trials.estimator():
        pass
    assert _arrived(sent[-1]) == SPEC


@pytest.fixture(scope="module")
def lambda_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("unsafe") / "lambda.keras")
    run_isolated(CHILDREN / "save_lambda_model.py", ENV, args={"path": path})
    return path


def test_measure_shape_repeats_budget_and_data_reach_the_child() -> None:
    model = ("measure", "option_models:any_size_cnn", "-b", "2", "--json")
    shaped = _json(
        run_cli(*model, "--input-shape", "48,48,3", "--repeats", "2", "--memory", "300MiB", env=ENV)
    )
    assert shaped["input_shapes"] == [[48, 48, 3]]
    assert len(shaped["peaks_bytes"]) == 2
    assert shaped["budget"]["usable_bytes"] == 300 * 2**20
    data = _json(run_cli(*model, "--data", "option_models:samples_40px", "--repeats", "1", env=ENV))
    assert data["input_shapes"] == [[40, 40, 3]]


@pytest.mark.parametrize(
    "option, value", [("--optimizer", "not_an_optimizer"), ("--loss", "not_a_loss")]
)
def test_measure_optimizer_and_loss_reach_the_child(option: str, value: str) -> None:
    proc = run_cli(
        "measure",
        "option_models:any_size_cnn",
        "--input-shape",
        "16,16,3",
        "-b",
        "1",
        option,
        value,
        env=ENV,
    )
    assert value in _one_line_error(proc)  # the child compiled with it, and said so


# The fast tests above show every path hands its child the whole spec, bound to the child's
# function; every child builds its model with `WorkloadSpec.build_model`. The slow tests run one
# child end to end (measure's) for the two options that used to be dropped, and read the answer:
# batch and plan used to repeat this through their children (about 70 s more CPU a run).


@pytest.mark.slow
def test_classes_reach_the_child_and_change_its_answer() -> None:
    args = ("measure", *MOBILENET, "-b", "1", "--repeats", "1", "--json")
    more = _json(run_cli(*args, "--classes", CLASSES, env=ENV))
    default = _json(run_cli(*args, env=ENV))
    delta = more["resident_bytes"] - default["resident_bytes"]
    # At least the classifier's bytes (the allocator's chunks round large tensors up).
    assert CLASSES_DELTA <= delta < 1.5 * CLASSES_DELTA


@pytest.mark.slow
def test_unsafe_reaches_the_child(lambda_file: str) -> None:
    assert "--unsafe" in _one_line_error(run_cli("measure", lambda_file, "-b", "1", env=ENV))
    measured = _json(
        run_cli("measure", lambda_file, "--unsafe", "-b", "2", "--repeats", "1", "--json", env=ENV)
    )
    assert not measured["oom"] and measured["peak_bytes"] > 0
