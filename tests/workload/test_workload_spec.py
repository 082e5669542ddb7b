"""WorkloadSpec: one frozen, picklable value that carries every workload option whole, to the
child processes included (fast: no TensorFlow, no child process)."""

from __future__ import annotations

import dataclasses
import json
import pickle
from typing import Any

import click
import pytest

from memfit.errors import WorkloadError
from memfit.workload.spec import WorkloadSpec

# Every field set to something other than its default.
FULL = WorkloadSpec(
    "keras.applications.MobileNet",
    input_shape=(32, 32, 3),
    data="option_models:samples_40px",
    optimizer="sgd",
    loss="mse",
    precision="mixed_bfloat16",
    remat="larger_than",
    classes=20000,
    safe_mode=False,
    worst_case=True,
    saved_data="/tmp/samples",
    imports=("keras_hub",),
)


# A Model Garden task's fields: its config's overrides (the rest of FULL is a Keras model's).
FULL_TASK = WorkloadSpec(
    "garden:retinanet_resnetfpn_coco",
    overrides=("task.model.input_size=[128,128,3]",),
    params=("overrides.yaml",),
    imports=("mypkg",),
)
TASK_ONLY = ("overrides", "params")


def test_every_field_is_set_away_from_its_default() -> None:
    defaults = WorkloadSpec()
    for f in dataclasses.fields(WorkloadSpec):
        full = FULL_TASK if f.name in TASK_ONLY else FULL
        assert getattr(full, f.name) != getattr(defaults, f.name), f.name
    assert WorkloadSpec.from_json(json.loads(json.dumps(FULL_TASK.to_json()))) == FULL_TASK


def test_the_spec_round_trips_through_pickle_and_the_childs_json() -> None:
    assert pickle.loads(pickle.dumps(FULL)) == FULL
    # What a child process reads: the job file is JSON (memfit.process.runner).
    assert WorkloadSpec.from_json(json.loads(json.dumps(FULL.to_json()))) == FULL


def test_variants_are_replacements_and_the_spec_is_frozen() -> None:
    spec = WorkloadSpec("keras.applications.MobileNet", input_shape=[32, 32, 3])
    mixed = dataclasses.replace(spec, precision="mixed_float16", remat="memfit")
    assert (mixed.precision, mixed.remat, mixed.input_shape) == (
        "mixed_float16",
        "memfit",
        ((32, 32, 3),),
    )
    assert spec.precision is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.classes = 3  # type: ignore[misc]


def test_shapes_are_one_sample_or_one_per_input() -> None:
    assert WorkloadSpec(input_shape=(8, 8, 3)).sample_shape == (8, 8, 3)
    two = WorkloadSpec(input_shape=[(8,), [4, 4]])
    assert two.input_shape == ((8,), (4, 4)) and two.sample_shape == [(8,), (4, 4)]
    assert WorkloadSpec().sample_shape is None


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"input_shape": (8, 0, 3)}, "input_shape must be one sample's shape"),
        ({"input_shape": "224"}, "input_shape must be one sample's shape"),
        ({"input_shape": ()}, "input_shape must be one sample's shape"),
        ({"precision": "float8"}, "unknown precision 'float8'; choose one of float32"),
        ({"remat": "most"}, "unknown remat 'most'; choose one of memfit"),
        ({"classes": 0}, "classes must be a whole number of at least 1, got 0"),
        ({"classes": True}, "classes must be a whole number of at least 1"),
        ({"model": 3}, "the spec's model must be a MODEL string"),
        ({"model": "missing.keras"}, "does not exist"),
    ],
)
def test_each_field_is_checked_once_with_one_error_text(
    fields: dict[str, Any], message: str
) -> None:
    from memfit.errors import MemfitError

    with pytest.raises(MemfitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        WorkloadSpec(**fields)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"optimizer": object()}, "optimizer must be given by name"),
        ({"loss": object()}, "loss must be given by name"),
        ({"data": object()}, "data must be a 'package.module:dataset_fn' string"),
        ({}, "needs the model as a MODEL string"),
    ],
)
def test_what_a_child_cannot_rebuild_is_refused_before_it_starts(
    fields: dict[str, Any], message: str
) -> None:
    spec = WorkloadSpec(**fields)  # in process, objects may stand here
    with pytest.raises(WorkloadError, match=message):
        spec.to_json()


def test_the_cli_turns_every_workload_option_into_one_argument() -> None:
    # The one decorator the CLI's commands share: every option arrives in the spec.
    from memfit.cli.options import workload_options

    seen: list[WorkloadSpec] = []

    @click.command()
    @workload_options
    @click.option("--other", default="x")
    def command(workload: WorkloadSpec, other: str) -> None:
        seen.append(workload)

    args = [
        "keras.applications.MobileNet",
        "--input-shape",
        "32,32,3",
        "--classes",
        "20000",
        "--optimizer",
        "sgd",
        "--loss",
        "mse",
        "--data",
        "option_models:samples_40px",
        "--unsafe",
    ]
    command.main(args=args, standalone_mode=False)
    expected = dataclasses.replace(FULL, precision=None, remat=None, worst_case=False)
    expected = dataclasses.replace(expected, saved_data=None, imports=())
    assert seen == [expected]
    # The child gets all of it: the JSON a child reads holds every option.
    assert WorkloadSpec.from_json(json.loads(json.dumps(seen[0].to_json()))) == expected
