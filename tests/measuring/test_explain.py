"""`memfit measure --explain`: what was alive at the measured peak, by layer and kind.

The reconstruction is checked on synthetic allocator records (no TensorFlow); one real small
model in a child process under an emulated budget checks that the listed bytes add up to the
measured peak; the CLI's JSON and its one-line error when the profiler is missing close it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers import run_cli, run_isolated

from memfit.backend.attribution import AllocationRecord, LayerTree, StepInfo, VariableInfo
from memfit.measuring.explain import (
    Explanation,
    allocator_order,
    compare_with_estimate,
    explain_live_set,
    live_at_peak,
)

CHILDREN = Path(__file__).resolve().parent / "children"

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"PYTHONPATH": TESTS}
MIB = 2**20


def _records(events: list[tuple[str, int, int, str, str, list[int] | None]], before: int) -> list:
    """Records from (event, addr, bytes, op, region, shape), bytes in use counted from `before`."""
    records, in_use = [], before
    for time, (event, addr, nbytes, op, region, shape) in enumerate(events):
        in_use += nbytes if event == "alloc" else -nbytes
        records.append(
            AllocationRecord(
                event=event,
                time_ps=time * 1000,
                addr=addr,
                nbytes=nbytes,
                requested_bytes=nbytes,
                in_use_bytes=in_use,
                op=op if event == "alloc" else "",
                region=region,
                dtype="float32",
                shape=shape,
                allocator="bfc",
            )
        )
    return records


FWD = "StatefulPartitionedCall/functional_1"
BWD = "StatefulPartitionedCall/gradient_tape/functional_1"
STEP = [
    ("alloc", 1, 4 * MIB, f"{FWD}/conv2d_1/Relu", "output", [8, 32, 32, 32]),
    ("alloc", 2, 2 * MIB, f"{FWD}/conv2d_1_2/Relu", "output", [8, 16, 16, 32]),
    ("alloc", 3, 1 * MIB, f"{BWD}/conv2d_1_2/convolution/Conv2DBackpropInput", "temp", [1]),
    ("alloc", 4, 4 * MIB, f"{BWD}/conv2d_1_2/convolution/Conv2DBackpropInput", "output", [8]),
    (
        "alloc",
        5,
        36864,
        f"{BWD}/conv2d_1_2/convolution/Conv2DBackpropFilter",
        "output",
        [3, 3, 32, 32],
    ),  # noqa: E501
    ("free", 3, 1 * MIB, "", "", None),  # the scratch goes: the peak was just before
    ("free", 2, 2 * MIB, "", "", None),
    ("free", 900, 256, "", "", None),  # a chunk made before the profile (resident)
    ("alloc", 6, 1 * MIB, "StatefulPartitionedCall/adam/Mul", "output", [3, 3, 32, 32]),
    ("free", 6, 1 * MIB, "", "", None),
    ("free", 1, 4 * MIB, "", "", None),
    ("free", 4, 4 * MIB, "", "", None),
    ("free", 5, 36864, "", "", None),
]
RESIDENT = 3 * 36864 + 1024


def _info() -> StepInfo:
    tree = LayerTree([("input_layer",), ("conv2d",), ("conv2d_1",)])
    return StepInfo(
        tree=tree,
        variables=[
            VariableInfo(
                "conv2d_1/kernel", "conv2d_1", "weights", 36864, [3, 3, 32, 32], "float32", True
            ),  # noqa: E501
            VariableInfo(
                "adam/conv2d_1_kernel_momentum",
                "conv2d_1",
                "optimizer_slots",
                36864,
                [3, 3, 32, 32],
                "float32",
            ),  # noqa: E501
            VariableInfo(
                "adam/conv2d_1_kernel_velocity",
                "conv2d_1",
                "optimizer_slots",
                36864,
                [3, 3, 32, 32],
                "float32",
            ),  # noqa: E501
            VariableInfo("adam/iteration", "", "other_state", 8, [], "int64"),
        ],
        optimizer_name="adam",
    )


def test_live_set_at_the_peak_adds_up_to_the_allocators_count() -> None:
    live = live_at_peak(_records(STEP, RESIDENT))
    assert live.peak_bytes == RESIDENT + 11 * MIB + 36864
    assert live.before_bytes == RESIDENT
    assert live.resident_bytes == RESIDENT  # the resident chunk is freed after the peak
    assert [t.addr for t in live.tensors] == [1, 4, 2, 3, 5]
    assert live.listed_bytes == live.peak_bytes and live.unmatched_bytes == 0
    assert "Conv2DBackpropFilter" in live.peak_op


def test_frees_of_chunks_made_before_the_profile_leave_the_resident_bytes() -> None:
    # The same step, but the resident chunk is freed before the peak.
    events = [STEP[7], *STEP[:7], *STEP[8:]]
    live = live_at_peak(_records(events, RESIDENT))
    assert live.resident_bytes == RESIDENT - 256
    assert live.listed_bytes == live.peak_bytes


def test_swapped_timestamps_follow_the_allocators_count() -> None:
    records = _records(STEP, RESIDENT)
    # Two threads: the second allocation's timestamp came before the first's.
    records[0].time_ps, records[1].time_ps = records[1].time_ps, records[0].time_ps
    ordered = allocator_order(records)
    assert [r.addr for r in ordered[:2]] == [1, 2]
    assert live_at_peak(records).unmatched_bytes == 0


def test_groups_by_layer_and_kind() -> None:
    explanation = explain_live_set(
        live_at_peak(_records(STEP, RESIDENT)), _info(), measured_peak_bytes=None
    )
    kinds = explanation.by_kind
    assert kinds["weights"] == 36864
    assert kinds["optimizer_slots"] == 2 * 36864
    assert kinds["other_state"] == 1024  # iteration (256) and what is not a variable
    assert kinds["activations"] == 6 * MIB
    assert kinds["workspace"] == 1 * MIB
    assert kinds["temporaries"] == 4 * MIB  # gradient of an activation
    assert kinds["gradients"] == 36864  # the kernel's shape: a weight gradient
    assert explanation.listed_bytes == explanation.peak_bytes
    layers = {row["layer"]: row for row in explanation.per_layer}
    # `conv2d_1/...` is the first conv layer (TensorFlow made its scope unique), `conv2d_1_2`
    # the second one.
    assert layers["conv2d"]["activations_bytes"] == 4 * MIB
    assert layers["conv2d_1"]["activations_bytes"] == 2 * MIB
    assert layers["conv2d_1"]["gradients_bytes"] == 36864
    assert explanation.largest[0]["bytes"] == 4 * MIB
    assert explanation.largest[0]["shape"] == [8, 32, 32, 32]
    again = Explanation.from_dict(json.loads(json.dumps(explanation.to_dict())))
    assert again.to_dict() == explanation.to_dict()


def test_layer_tree_keeps_same_named_layers_of_two_heads_apart() -> None:
    tree = LayerTree(
        [("backbone",), ("backbone", "conv1"), ("box_head",), ("box_head", "conv2d_0")]
        + [("classification_head",), ("classification_head", "conv2d_0")]
    )
    tree.choose_policy([])
    assert tree.layer_of("model_1/box_head_1/conv2d_0_1/Conv2D") == "box_head/conv2d_0"
    assert (
        tree.layer_of("gradient_tape/model_1/classification_head_1/conv2d_0_2/BiasAddGrad")
        == "classification_head/conv2d_0"
    )
    assert tree.layer_of("model_1/backbone_1/conv1_1/Relu") == "conv1"
    assert tree.layer_of("adam/Mul") == ""


def test_the_resident_batch_is_inputs() -> None:
    # `memfit.measure` makes the batch before the steps: resident, after the variables.
    info = _info()
    info.batch_bytes = 500  # rounded to the allocator's 512
    explanation = explain_live_set(
        live_at_peak(_records(STEP, RESIDENT)), info, measured_peak_bytes=None
    )
    kinds = explanation.by_kind
    assert kinds["inputs"] == 512
    assert kinds["other_state"] == 1024 - 512
    assert explanation.listed_bytes == explanation.peak_bytes
    layers = {row["layer"]: row for row in explanation.per_layer}
    assert layers["(batch)"]["inputs_bytes"] == 512


def test_top_layers_are_compared_with_the_estimate() -> None:
    explanation = explain_live_set(live_at_peak(_records(STEP, RESIDENT)), _info())
    estimate = {
        "peak_bytes": 10 * MIB,
        "breakdown": {"activations_bytes": 6 * MIB},
        "per_layer": [
            {"layer": "conv2d_1", "bytes": 7 * MIB},
            {"layer": "(other)", "bytes": 2 * MIB},
            {"layer": "conv2d", "bytes": 1 * MIB},
        ],
    }
    compare_with_estimate(explanation, estimate)
    assert explanation.top_layers == {
        "measured": ["conv2d_1", "conv2d"],
        "estimated": ["conv2d_1", "conv2d"],
        "common": 2,
    }


def test_measure_explain_lists_the_measured_peak() -> None:
    """A real step under a 600 MiB CPU budget: the live set adds up to the measured peak."""
    result = run_isolated(
        CHILDREN / "explain_peak.py",
        env={**ENV, "MEMFIT_MEMORY": "600MiB"},
    )
    e = result["explanation"]
    assert abs(e["listed_bytes"] - result["peak"]) <= 0.05 * result["peak"]
    kinds = e["by_kind"]
    # small_cnn: 29,290 float32 parameters, Adam keeps two slots of each.
    assert 29290 * 4 <= kinds["weights_bytes"] < 29290 * 4 + 8 * 256
    assert 2 * 29290 * 4 <= kinds["optimizer_slots_bytes"] < 2 * 29290 * 4 + 16 * 256
    step = ("activations_bytes", "temporaries_bytes", "workspace_bytes", "gradients_bytes")
    assert kinds["activations_bytes"] > 0 and kinds["workspace_bytes"] > 0
    # The batch (16 images of 64x64x3 and their labels) is held in the emulated card's
    # allocator, as a GPU holds it, before the steps: resident, listed as inputs.
    images = 16 * 64 * 64 * 3 * 4
    assert images <= kinds["inputs_bytes"] <= images + 16 * 8 + 512
    assert sum(kinds[k] for k in step) > result["peak"] / 2
    layers = [row["layer"] for row in e["per_layer"]]
    assert {"conv2d", "conv2d_1"} <= set(layers[:5])
    assert e["estimate"]["peak_bytes"] > 0 and e["top_layers"]["common"] >= 2
    assert e["largest"][0]["shape"] and e["largest"][0]["dtype"] == "float32"


def test_cli_measure_explain_json() -> None:
    proc = run_cli(
        "measure", "factories:small_cnn", "-b", "8", "--repeats", "1", "--memory", "500MiB",
        "--explain", "--json", env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    e = data["explanation"]
    assert e["measured_peak_bytes"] == data["peak_bytes"]
    assert abs(e["listed_error"]) < 0.05
    assert set(e["by_kind"]) >= {"weights_bytes", "activations_bytes", "optimizer_slots_bytes"}
    assert sum(e["by_kind"].values()) == e["listed_bytes"]


def test_cli_explain_without_the_profiler_is_one_clear_error(tmp_path: object) -> None:
    # The profile's protobufs cannot be imported (as in a TensorFlow build without the
    # profiler): an import hook, installed in every process memfit starts, refuses them.
    block = os.path.join(str(tmp_path), "sitecustomize.py")
    with open(block, "w") as handle:
        handle.write(
            "import sys\n"
            "class _NoProfiler:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.endswith('profiler.protobuf') or name.endswith('xplane_pb2'):\n"
            "            raise ImportError('no profiler in this build: ' + name)\n"
            "sys.meta_path.insert(0, _NoProfiler())\n"
        )
    proc = run_cli(
        "measure", "factories:small_cnn", "-b", "2", "--repeats", "1", "--memory", "300MiB",
        "--explain", env={"PYTHONPATH": os.pathsep.join([str(tmp_path), TESTS])},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memfit: error:"), proc.stderr[-3000:]
    assert "profiler" in lines[0] and "--memory" in lines[0]


def test_report_shows_the_explanation_of_a_measure_json_and_of_a_log(tmp_path: object) -> None:
    from memfit.report import build_html, build_measure_html, load_log, load_measurements

    explanation = explain_live_set(live_at_peak(_records(STEP, RESIDENT)), _info())
    measured = {"batch_size": 8, "peak_bytes": explanation.peak_bytes, "oom": False}
    path = os.path.join(str(tmp_path), "measure.json")
    with open(path, "w") as handle:
        json.dump({**measured, "explanation": explanation.to_dict()}, handle)
    found = load_measurements(path)
    assert found is not None and found[0]["explanation"]["listed_bytes"] == explanation.peak_bytes
    page = build_measure_html(found, "factories:small_cnn")
    assert "What was alive at the peak" in page and "conv2d_1" in page and "8x32x32x32" in page
    log = os.path.join(str(tmp_path), "run.jsonl")
    with open(log, "w") as handle:
        handle.write(json.dumps({"type": "header", "tool": "memfit.watch", "format": 1}) + "\n")
        handle.write(json.dumps({"type": "explain", **explanation.to_dict()}) + "\n")
    assert load_measurements(log) is None
    assert "What was alive at the peak" in build_html(load_log(log))
