"""Step specs without the Model Garden: a task spec's JSON round trip, its checks, and the one
line a `garden:` name gets where tf-models-official is not installed."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import run_cli

from memfit.errors import MemfitError, ModelLoadError, WorkloadError
from memfit.workload.spec import WorkloadSpec

SETS = ("task.model.input_size=[128,128,3]", "task.train_data.input_path=/data/train-*")


def test_a_task_spec_crosses_to_a_child_as_json() -> None:
    spec = WorkloadSpec("garden:retinanet_resnetfpn_coco", overrides=SETS, params=("a.yaml",))
    payload = spec.to_json()
    assert payload["model"] == "garden:retinanet_resnetfpn_coco"
    assert payload["overrides"] == list(SETS) and payload["params"] == ["a.yaml"]
    back = WorkloadSpec.from_json(payload)
    assert back == spec and back.is_task and back.task_name == "retinanet_resnetfpn_coco"
    assert not back.rebuildable
    module = WorkloadSpec("garden:mypkg.tasks:experiment")
    assert module.is_task and module.task_name == "mypkg.tasks:experiment"
    assert not WorkloadSpec("mypkg.models:build").is_task


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"model": "mypkg.models:build", "overrides": SETS}, "garden:EXPERIMENT"),
        ({"model": "garden:retinanet", "input_shape": (64, 64, 3)}, "--set task."),
        ({"model": "garden:retinanet", "optimizer": "sgd"}, "its optimizer from"),
        ({"model": "garden:"}, "not a Model Garden task"),
        ({"model": "garden:a-b"}, "not a Model Garden task"),
    ],
)
def test_a_task_spec_that_cannot_be_right_says_why(kwargs: dict, words: str) -> None:
    with pytest.raises((WorkloadError, ModelLoadError)) as caught:
        WorkloadSpec(**kwargs)
    assert isinstance(caught.value, MemfitError) and words in str(caught.value)


def test_plan_of_a_task_refuses_precision_and_remat_in_one_line() -> None:
    from memfit.planning import plan_workload

    spec = WorkloadSpec("garden:retinanet_resnetfpn_coco")
    for asked in ({"precisions": ["mixed_float16"]}, {"remat_modes": ["full"]}):
        with pytest.raises(MemfitError, match=r"runtime\.mixed_precision_dtype"):
            plan_workload(spec, 8, "1GiB", **asked)


@pytest.mark.skipif(
    importlib.util.find_spec("official") is not None, reason="tf-models-official is installed"
)
@pytest.mark.parametrize(
    "command", [("measure", "-b", "2"), ("estimate", "-b", "2"), ("batch",), ("plan", "-b", "4")]
)
def test_a_garden_name_without_the_model_garden_is_one_line(command: tuple[str, ...]) -> None:
    proc = run_cli(*command, "garden:retinanet_resnetfpn_coco", "--set", SETS[0])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memfit: error: ")
    assert "tf-models-official is not installed" in lines[0] and ".venv-garden" in lines[0]
