"""memfit.serialize, and every result's `to_dict()` against the JSON it gave before.

The expected dicts (serialize_expected.json) were recorded from the hand-written `to_dict`
methods before they were built with `json_dict`; their `repr` keeps key order and tuples, so the
JSON is byte-for-byte the same.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from memfit.budget.budget import Budget
from memfit.budget.devices import GpuInfo, GpuProcess
from memfit.data.audit import AuditFinding, AuditResult
from memfit.data.check import CheckResult, ImageInfo, Problem
from memfit.demo.results import DemoResult, StepResult
from memfit.doctor.preflight import DoctorReport, Finding
from memfit.estimation import Estimate
from memfit.measuring.explain import Explanation
from memfit.measuring.measurement import Measurement
from memfit.recomputation.remat import RecomputeReport, SegmentInfo
from memfit.search import BatchSearchResult, Trial
from memfit.serialize import json_dict, suffixed, to_json
from memfit.training.plan import Candidate, Plan
from memfit.training.recovery import FitSummary, Recovery
from memfit.watch.findings import WatchFinding
from memfit.watch.log import Run


def _instances():
    budget = Budget(1000, "T4", "card", total_bytes=2000, device="GPU:0", notes=("a", "b"))
    explanation = Explanation(
        device="GPU:0",
        allocator="bfc",
        peak_bytes=900,
        listed_bytes=800,
        measured_peak_bytes=1000,
        by_kind={"weights": 300, "activations": 500},
        per_layer=[{"layer": "dense", "bytes": 500}],
        largest=[{"name": "t", "bytes": 9}],
        tensors=4,
        peak_op="MatMul",
        estimate={"peak_bytes": 950},
        top_layers={"dense": 1},
        notes=["n"],
    )
    candidate = Candidate(
        "float32",
        None,
        2,
        16,
        peak_bytes=700,
        step_seconds=0.25,
        fits=True,
        predicted_peak_bytes=650,
        measured=True,
        recoveries=["r"],
    )
    estimated = Candidate("mixed_float16", "larger_than", 4, 8, predicted_peak_bytes=600)
    return {
        "budget": budget,
        "check": CheckResult(
            files=["a.tfrecord", "b.tfrecord"],
            records=3,
            valid_records=2,
            objects=5,
            problems=[
                Problem("decode_error", "a.tfrecord", 1, "bad"),
                Problem("no_objects", "b.tfrecord", 0, "none", "warning"),
            ],
            resolution_histogram={"<=256": 2, "257-512": 1},
            resolutions={"64x48": 2},
            objects_histogram={"0": 1, "3-4": 2},
            largest=[ImageInfo("a.tfrecord", 0, 48, 64, 9216)],
            batch_size=4,
            memory={"peak_bytes": 10, "mode": "fixed"},
            seconds=1.234567,
        ),
        "check_empty": CheckResult(files=[]),
        "audit": AuditResult(
            findings=[
                AuditFinding("no_prefetch", "Map/_1", "m", "f"),
                AuditFinding("no_error_policy", "", "m2", "f2", "info"),
            ],
            ops=["tensor_slices", "map", "batch"],
            steps=3,
            first_element_seconds=0.5,
            elements_per_second=10.0,
            samples_per_second=40.0,
            batch_size=4,
            target_steps_per_second=20.0,
            element_shapes=[[4, 64, 64, 3]],
            stored_sizes={"64x64": 16},
            memory={"model": "m", "pixel_ratio": 4.0},
        ),
        "audit_unbatched": AuditResult(ops=["range"], elements_per_second=3.5),
        "demo": DemoResult(
            steps=[
                StepResult("plain", "dies", True, 1.5, "memfit x", {"a": [1, 2]}, None),
                StepResult("fit", "lives", False, 2.0, "memfit y", problem="p"),
            ],
            report_path="r.html",
            memory="1GiB",
            seconds=12.345,
        ),
        "gpu": GpuInfo(
            0,
            "T4",
            16,
            4,
            12,
            compute_capability=(7, 5),
            processes=(GpuProcess(1, "python", 100), GpuProcess(2, "x", None)),
        ),
        "doctor": DoctorReport(
            devices=[{"name": "CPU:0", "type": "CPU", "processes": []}],
            host_memory={"total_bytes": 10, "available_bytes": 5},
            versions={"tensorflow": "2.21", "keras": None},
            budget=budget,
            tensorflow_initialized=True,
            findings=[Finding("problem", "x", "m", "f"), Finding("warning", "y", "m")],
        ),
        "estimate": Estimate(
            batch_size=8,
            peak_bytes=100,
            breakdown={"weights": 10, "activations": 20},
            per_layer=[{"layer": "d", "bytes": 5}],
            peak_moment={"phase": "backward"},
            what_ifs=[{"batch_size": 16, "peak_bytes": 190}],
            resident_bytes=3,
            activations_kept_bytes=4,
            budget=budget,
            input_shapes=[[32, 32, 3]],
            trace_seconds=0.1,
            high_bytes=120,
            sample_peaks_bytes=[110, 120],
            estimate_seconds=1.5,
        ),
        "estimate_no_budget": Estimate(batch_size=1, peak_bytes=5, breakdown={}),
        "explanation": explanation,
        "fit": FitSummary(
            micro_batches={"(8, 32, 32, 3)": 2},
            recoveries=[Recovery(3, 0, [[8, 32, 32, 3]], "step", 1, 2, 900, 1.5, 0.5, "oom")],
            updates=5,
            guarded_updates=1,
        ),
        "measurement": Measurement(
            batch_size=8,
            device="GPU:0",
            oom=False,
            peak_bytes=700,
            resident_bytes=100,
            step_seconds=0.2,
            peaks_bytes=[690, 700, 710],
            budget=budget,
            input_shapes=[(32, 32, 3)],
            leaked_bytes=1,
            trace_seconds=0.3,
            explanation=explanation,
        ),
        "measurement_oom": Measurement(8, "CPU:0", True, None, 50, None, oom_message="OOM"),
        "candidate": candidate,
        "candidate_estimated": estimated,
        "plan": Plan(
            batch_size=64,
            micro_batches=2,
            micro_batch_size=16,
            precision="float32",
            remat=None,
            peak_bytes=700,
            step_seconds=0.5,
            budget=budget,
            margin=0.1,
            candidates=[candidate, estimated],
            fits=True,
            note="n",
            seconds=9.5,
            confirmed=True,
            confirmation="c",
            replicas=2,
            allreduce_bytes=30,
        ),
        "recompute": RecomputeReport(
            policy="auto",
            segments=[
                SegmentInfo("a", "b", 3, 100, "b", 10),
                SegmentInfo("c", "d", 2, 50, None, 0, 1, False),
            ],
            candidates=4,
            kept_bytes=10,
            activation_bytes=150,
        ),
        "search": BatchSearchResult(
            batch_size=32,
            margin=0.1,
            peak_bytes=800,
            budget=budget,
            trials=[
                Trial(32, False, 800, 1.0, 780, True, True, True, 2, False),
                Trial(64, True, None, 2.0),
            ],
            limit_bytes=900,
            failing_batch_size=64,
            stopped_by="bracket",
            worst_case_samples=True,
            largest_sample={"index": 3},
            seconds=4.5,
            decided_in="child_process",
            soak_steps=3,
            replicas=2,
            allreduce_bytes=20,
        ),
        "watch_finding": WatchFinding("growth", 10, 1, "m", "c", "f", {"bytes": [1, 2]}),
        "run": Run(
            "run.jsonl",
            {"model": "m", "warmup_steps": 1, "budget_bytes": 10},
            steps=[],
            findings=[{"kind": "growth"}],
            epochs=[{"epoch": 0}],
            index=2,
        ),
    }


# repr(obj.to_dict()) of each instance, recorded from the hand-written methods before they used
# json_dict: repr keeps key order and tuples, so equal reprs mean byte-for-byte equal JSON.
EXPECTED = json.loads((pathlib.Path(__file__).parent / "serialize_expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_to_dict_is_what_it_was(name):
    data = _instances()[name].to_dict()
    assert repr(data) == EXPECTED[name]
    json.dumps(data)  # JSON-ready as it is


@dataclasses.dataclass
class _Inner:
    size_bytes: int
    shape: tuple[int, ...] = (2, 3)


@dataclasses.dataclass
class _Outer:
    name: str
    inner: _Inner
    items: list[_Inner]
    seconds: float = 1.0

    @property
    def total_bytes(self) -> int:
        return self.inner.size_bytes + sum(i.size_bytes for i in self.items)


def test_json_dict_reads_fields_in_order_and_converts_nested_dataclasses():
    outer = _Outer("o", _Inner(1), [_Inner(2, (4,))])
    assert json_dict(outer) == {
        "name": "o",
        "inner": {"size_bytes": 1, "shape": (2, 3)},
        "items": [{"size_bytes": 2, "shape": (4,)}],
        "seconds": 1.0,
    }
    assert json_dict(outer) == dataclasses.asdict(outer)


def test_json_dict_keys_in_the_order_asked_with_values_given_or_read():
    outer = _Outer("o", _Inner(1), [_Inner(2)], seconds=2.5)
    data = json_dict(outer, "total_bytes name run_seconds", run_seconds=outer.seconds)
    assert list(data.items()) == [("total_bytes", 3), ("name", "o"), ("run_seconds", 2.5)]
    extra = json_dict(outer, name="renamed", ok=True)
    assert list(extra) == ["name", "inner", "items", "seconds", "ok"]
    assert extra["name"] == "renamed"
    with pytest.raises(TypeError, match="ok"):
        json_dict(outer, "name", ok=True)


def test_to_json_prefers_to_dict_and_copies_containers():
    class WithToDict:
        def to_dict(self):
            return {"from": "to_dict"}

    items = [1, {"a": WithToDict()}]
    out = to_json(items)
    assert out == [1, {"a": {"from": "to_dict"}}] and out is not items
    assert to_json(_Inner) is _Inner  # a class is a value, not a dataclass instance
    assert suffixed({"weights": 1, "activations": 2}, "_bytes") == {
        "weights_bytes": 1,
        "activations_bytes": 2,
    }
