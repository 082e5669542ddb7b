"""Every option of `memfit measure`, `batch` and `plan` reaches the child processes that load,
estimate and train MODEL (`--classes` and `--unsafe` used to be dropped there, so the answer
could be for another model than the one asked about)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from helpers import run_cli, run_isolated

TESTS = os.path.dirname(__file__)
ENV = {"PYTHONPATH": TESTS}
# MobileNet (v1): a built-in that builds and traces in about 6 s less CPU a process than
# MobileNetV2 (measured), and every command here builds it in one process or more.
MOBILENET = ("keras.applications.MobileNet", "--input-shape", "32,32,3")
# What --classes 20000 adds to MobileNet's resident bytes: the classifier's weights for 19000
# more classes (a 1x1 convolution of 1024 inputs and a bias each), and Adam's two slots of
# them. Large enough to stand out of the allocator's fragmentation, which moves a peak by
# several MiB. (Measured 2026-11-27: resident bytes rose by 1.41x this, the allocator's
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


@pytest.fixture(scope="module")
def lambda_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("unsafe") / "lambda.keras")
    run_isolated(f"import option_models\noption_models.save_lambda_model({path!r})\nemit(1)", ENV)
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


@pytest.mark.slow
def test_classes_reach_the_children_of_measure_batch_and_plan() -> None:
    def both(*args: str) -> tuple[Any, Any]:
        return (
            _json(run_cli(*args, "--classes", CLASSES, "--json", env=ENV)),
            _json(run_cli(*args, "--json", env=ENV)),
        )

    more, default = both("measure", *MOBILENET, "-b", "1", "--repeats", "1")
    delta = more["resident_bytes"] - default["resident_bytes"]
    # At least the classifier's bytes (the allocator's chunks round large tensors up).
    assert CLASSES_DELTA <= delta < 1.5 * CLASSES_DELTA
    more, default = both(
        "batch", *MOBILENET, "--memory", "1GiB", "--max-batch", "1", "--soak-steps", "0"
    )
    assert more["peak_bytes"] - default["peak_bytes"] > CLASSES_DELTA
    more, default = both(
        "plan",
        *MOBILENET,
        "--batch-size",
        "2",
        "--memory",
        "1GiB",
        "--precision",
        "float32",
        "--remat",
        "none",
    )
    # The estimator's child and the confirmation run's child both built 20000 classes.
    for key in ("predicted_peak_bytes", "peak_bytes"):
        assert more["candidates"][0][key] - default["candidates"][0][key] > CLASSES_DELTA
    assert more["confirmed"] and more["candidates"][0]["confirmed"]


@pytest.mark.slow
def test_unsafe_reaches_the_children_of_measure_batch_and_plan(lambda_file: str) -> None:
    assert "--unsafe" in _one_line_error(run_cli("measure", lambda_file, "-b", "1", env=ENV))
    measured = _json(
        run_cli("measure", lambda_file, "--unsafe", "-b", "2", "--repeats", "1", "--json", env=ENV)
    )
    assert not measured["oom"] and measured["peak_bytes"] > 0
    found = _json(
        run_cli(
            "batch",
            lambda_file,
            "--unsafe",
            "--memory",
            "256MiB",
            "--max-batch",
            "4",
            "--soak-steps",
            "0",
            "--json",
            env=ENV,
        )
    )
    assert found["batch_size"] == 4
    planned = _json(
        run_cli(
            "plan",
            lambda_file,
            "--unsafe",
            "--batch-size",
            "4",
            "--memory",
            "256MiB",
            "--json",
            env=ENV,
        )
    )
    assert planned["fits"] and planned["confirmed"]
    assert planned["candidates"][0]["predicted_peak_bytes"]  # the estimator loaded it too
