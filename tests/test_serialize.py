"""memfit.serialize, and every result's `to_dict()` against the JSON it gave before (issue 20).

The expected dicts were recorded from the hand-written `to_dict` methods before they were
built with `json_dict`; `repr` keeps key order and tuples, so the JSON is byte-for-byte the same.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from memfit.budget import Budget
from memfit.data.audit import AuditFinding, AuditResult
from memfit.data.check import CheckResult, ImageInfo, Problem
from memfit.demo.results import DemoResult, StepResult
from memfit.devices import GpuInfo, GpuProcess
from memfit.doctor import DoctorReport, Finding
from memfit.estimate import Estimate
from memfit.explain import Explanation
from memfit.measurement import Measurement
from memfit.planning.candidates import Candidate, Plan
from memfit.recompute import RecomputeReport, SegmentInfo
from memfit.recovery import FitSummary, Recovery
from memfit.search import BatchSearchResult, Trial
from memfit.serialize import json_dict, suffixed, to_json
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


# Each instance's to_dict(), recorded before the methods used json_dict; compared by repr,
# which keeps key order and tuples.
EXPECTED = {
    "budget": {
        "usable_bytes": 1000,
        "name": "T4",
        "source": "card",
        "total_bytes": 2000,
        "device": "GPU:0",
        "notes": ["a", "b"],
    },
    "check": {
        "ok": False,
        "files": ["a.tfrecord", "b.tfrecord"],
        "records": 3,
        "valid_records": 2,
        "invalid_records": 1,
        "objects": 5,
        "errors": 1,
        "warnings": 1,
        "problem_counts": {"decode_error": 1, "no_objects": 1},
        "problems": [
            {
                "kind": "decode_error",
                "file": "a.tfrecord",
                "index": 1,
                "message": "bad",
                "severity": "error",
            },
            {
                "kind": "no_objects",
                "file": "b.tfrecord",
                "index": 0,
                "message": "none",
                "severity": "warning",
            },
        ],
        "resolution_histogram": {"<=256": 2, "257-512": 1},
        "resolutions": {"64x48": 2},
        "objects_histogram": {"0": 1, "3-4": 2},
        "largest": [
            {"file": "a.tfrecord", "index": 0, "height": 48, "width": 64, "decoded_bytes": 9216}
        ],
        "batch_size": 4,
        "largest_batch_float32_bytes": 147456,
        "memory": {"peak_bytes": 10, "mode": "fixed"},
        "check_seconds": 1.235,
    },
    "check_empty": {
        "ok": True,
        "files": [],
        "records": 0,
        "valid_records": 0,
        "invalid_records": 0,
        "objects": 0,
        "errors": 0,
        "warnings": 0,
        "problem_counts": {},
        "problems": [],
        "resolution_histogram": {},
        "resolutions": {},
        "objects_histogram": {},
        "largest": [],
        "batch_size": 8,
        "largest_batch_float32_bytes": None,
        "memory": None,
        "check_seconds": 0.0,
    },
    "audit": {
        "findings": [
            {
                "kind": "no_prefetch",
                "node": "Map/_1",
                "message": "m",
                "fix": "f",
                "severity": "warning",
            },
            {
                "kind": "no_error_policy",
                "node": "",
                "message": "m2",
                "fix": "f2",
                "severity": "info",
            },
        ],
        "ops": ["tensor_slices", "map", "batch"],
        "steps": 3,
        "first_element_seconds": 0.5,
        "elements_per_second": 10.0,
        "samples_per_second": 40.0,
        "batch_size": 4,
        "target_steps_per_second": 20.0,
        "element_shapes": [[4, 64, 64, 3]],
        "stored_sizes": {"64x64": 16},
        "memory": {"model": "m", "pixel_ratio": 4.0},
        "ok": False,
        "batches_per_second": 10.0,
    },
    "audit_unbatched": {
        "findings": [],
        "ops": ["range"],
        "steps": 0,
        "first_element_seconds": None,
        "elements_per_second": 3.5,
        "samples_per_second": None,
        "batch_size": None,
        "target_steps_per_second": None,
        "element_shapes": [],
        "stored_sizes": {},
        "memory": None,
        "ok": True,
        "batches_per_second": None,
    },
    "demo": {
        "ok": False,
        "memory": "1GiB",
        "report_path": "r.html",
        "demo_seconds": 12.3,
        "steps": [
            {
                "name": "plain",
                "claim": "dies",
                "ok": True,
                "seconds": 1.5,
                "command": "memfit x",
                "details": {"a": [1, 2]},
                "problem": None,
            },
            {
                "name": "fit",
                "claim": "lives",
                "ok": False,
                "seconds": 2.0,
                "command": "memfit y",
                "details": {},
                "problem": "p",
            },
        ],
    },
    "gpu": {
        "index": 0,
        "name": "T4",
        "total_bytes": 16,
        "used_bytes": 4,
        "free_bytes": 12,
        "compute_capability": (7, 5),
        "processes": [
            {"pid": 1, "name": "python", "used_bytes": 100},
            {"pid": 2, "name": "x", "used_bytes": None},
        ],
    },
    "doctor": {
        "ok": False,
        "devices": [{"name": "CPU:0", "type": "CPU", "processes": []}],
        "host_memory": {"total_bytes": 10, "available_bytes": 5},
        "versions": {"tensorflow": "2.21", "keras": None},
        "budget": {
            "usable_bytes": 1000,
            "name": "T4",
            "source": "card",
            "total_bytes": 2000,
            "device": "GPU:0",
            "notes": ["a", "b"],
        },
        "emulated_budget": None,
        "emulated_memory_growth": None,
        "tensorflow_initialized": True,
        "findings": [
            {"level": "problem", "topic": "x", "message": "m", "fix": "f"},
            {"level": "warning", "topic": "y", "message": "m", "fix": ""},
        ],
        "problems": 1,
        "warnings": 1,
    },
    "estimate": {
        "batch_size": 8,
        "peak_bytes": 100,
        "high_bytes": 120,
        "sample_peaks_bytes": [110, 120],
        "resident_bytes": 3,
        "activations_kept_bytes": 4,
        "breakdown": {"weights_bytes": 10, "activations_bytes": 20},
        "per_layer": [{"layer": "d", "bytes": 5}],
        "peak_moment": {"phase": "backward"},
        "what_ifs": [{"batch_size": 16, "peak_bytes": 190}],
        "budget": {
            "usable_bytes": 1000,
            "name": "T4",
            "source": "card",
            "total_bytes": 2000,
            "device": "GPU:0",
            "notes": ["a", "b"],
        },
        "fits": True,
        "input_shapes": [[32, 32, 3]],
        "trace_seconds": 0.1,
        "estimate_seconds": 1.5,
    },
    "estimate_no_budget": {
        "batch_size": 1,
        "peak_bytes": 5,
        "high_bytes": None,
        "sample_peaks_bytes": [],
        "resident_bytes": 0,
        "activations_kept_bytes": 0,
        "breakdown": {},
        "per_layer": [],
        "peak_moment": {},
        "what_ifs": [],
        "budget": None,
        "fits": None,
        "input_shapes": [],
        "trace_seconds": 0.0,
        "estimate_seconds": 0.0,
    },
    "explanation": {
        "device": "GPU:0",
        "allocator": "bfc",
        "peak_bytes": 900,
        "listed_bytes": 800,
        "measured_peak_bytes": 1000,
        "listed_error": -0.19999999999999996,
        "by_kind": {"weights_bytes": 300, "activations_bytes": 500},
        "per_layer": [{"layer": "dense", "bytes": 500}],
        "largest": [{"name": "t", "bytes": 9}],
        "tensors": 4,
        "peak_op": "MatMul",
        "estimate": {"peak_bytes": 950},
        "top_layers": {"dense": 1},
        "notes": ["n"],
    },
    "fit": {
        "micro_batches": {"(8, 32, 32, 3)": 2},
        "recoveries": [
            {
                "update": 3,
                "epoch": 0,
                "input_shapes": [[8, 32, 32, 3]],
                "phase": "step",
                "old_micro_batches": 1,
                "new_micro_batches": 2,
                "peak_bytes": 900,
                "seconds": 1.5,
                "trace_seconds": 0.5,
                "message": "oom",
                "elsewhere": False,
            }
        ],
        "updates": 5,
        "guarded_updates": 1,
    },
    "measurement": {
        "batch_size": 8,
        "device": "GPU:0",
        "oom": False,
        "peak_bytes": 700,
        "resident_bytes": 100,
        "step_seconds": 0.2,
        "peaks_bytes": [690, 700, 710],
        "oom_message": None,
        "budget": {
            "usable_bytes": 1000,
            "name": "T4",
            "source": "card",
            "total_bytes": 2000,
            "device": "GPU:0",
            "notes": ["a", "b"],
        },
        "input_shapes": [(32, 32, 3)],
        "leaked_bytes": 1,
        "trace_seconds": 0.3,
        "explanation": {
            "device": "GPU:0",
            "allocator": "bfc",
            "peak_bytes": 900,
            "listed_bytes": 800,
            "measured_peak_bytes": 1000,
            "listed_error": -0.19999999999999996,
            "by_kind": {"weights_bytes": 300, "activations_bytes": 500},
            "per_layer": [{"layer": "dense", "bytes": 500}],
            "largest": [{"name": "t", "bytes": 9}],
            "tensors": 4,
            "peak_op": "MatMul",
            "estimate": {"peak_bytes": 950},
            "top_layers": {"dense": 1},
            "notes": ["n"],
        },
        "step_bytes": 600,
        "peak_spread_bytes": 20,
        "peak_min_bytes": 690,
        "peak_median_bytes": 700,
        "headroom_bytes": 300,
        "repeats": 3,
    },
    "measurement_oom": {
        "batch_size": 8,
        "device": "CPU:0",
        "oom": True,
        "peak_bytes": None,
        "resident_bytes": 50,
        "step_seconds": None,
        "peaks_bytes": [],
        "oom_message": "OOM",
        "budget": None,
        "input_shapes": [],
        "leaked_bytes": 0,
        "trace_seconds": None,
        "explanation": None,
        "step_bytes": None,
        "peak_spread_bytes": 0,
        "peak_min_bytes": None,
        "peak_median_bytes": None,
        "headroom_bytes": None,
        "repeats": 0,
    },
    "candidate": {
        "precision": "float32",
        "remat": None,
        "micro_batches": 2,
        "micro_batch_size": 16,
        "peak_bytes": 700,
        "step_seconds": 0.25,
        "fits": True,
        "oom": False,
        "error": None,
        "predicted_peak_bytes": 650,
        "measured": True,
        "confirmed": None,
        "recoveries": ["r"],
        "estimated_only": False,
    },
    "candidate_estimated": {
        "precision": "mixed_float16",
        "remat": "larger_than",
        "micro_batches": 4,
        "micro_batch_size": 8,
        "peak_bytes": None,
        "step_seconds": None,
        "fits": False,
        "oom": False,
        "error": None,
        "predicted_peak_bytes": 600,
        "measured": False,
        "confirmed": None,
        "recoveries": [],
        "estimated_only": True,
    },
    "plan": {
        "batch_size": 64,
        "replicas": 2,
        "per_replica_batch_size": 32,
        "allreduce_bytes": 30,
        "micro_batch_size": 16,
        "accumulation_steps": 2,
        "micro_batches": 2,
        "precision": "float32",
        "remat": None,
        "peak_bytes": 700,
        "step_seconds": 0.5,
        "fits": True,
        "budget": {
            "usable_bytes": 1000,
            "name": "T4",
            "source": "card",
            "total_bytes": 2000,
            "device": "GPU:0",
            "notes": ["a", "b"],
        },
        "margin": 0.1,
        "limit_bytes": 900,
        "candidates": [
            {
                "precision": "float32",
                "remat": None,
                "micro_batches": 2,
                "micro_batch_size": 16,
                "peak_bytes": 700,
                "step_seconds": 0.25,
                "fits": True,
                "oom": False,
                "error": None,
                "predicted_peak_bytes": 650,
                "measured": True,
                "confirmed": None,
                "recoveries": ["r"],
                "estimated_only": False,
            },
            {
                "precision": "mixed_float16",
                "remat": "larger_than",
                "micro_batches": 4,
                "micro_batch_size": 8,
                "peak_bytes": None,
                "step_seconds": None,
                "fits": False,
                "oom": False,
                "error": None,
                "predicted_peak_bytes": 600,
                "measured": False,
                "confirmed": None,
                "recoveries": [],
                "estimated_only": True,
            },
        ],
        "confirmed": True,
        "confirmation": "c",
        "note": "n",
        "plan_seconds": 9.5,
    },
    "recompute": {
        "policy": "auto",
        "segments": [
            {
                "first_layer": "a",
                "last_layer": "b",
                "layers": 3,
                "activation_bytes": 100,
                "boundary": "b",
                "boundary_bytes": 10,
                "boundary_tensors": 1,
                "recomputed": True,
            },
            {
                "first_layer": "c",
                "last_layer": "d",
                "layers": 2,
                "activation_bytes": 50,
                "boundary": None,
                "boundary_bytes": 0,
                "boundary_tensors": 1,
                "recomputed": False,
            },
        ],
        "boundaries": ["b"],
        "candidates": 4,
        "kept_bytes": 10,
        "activation_bytes": 150,
    },
    "search": {
        "batch_size": 32,
        "margin": 0.1,
        "peak_bytes": 800,
        "headroom_bytes": 200,
        "limit_bytes": 900,
        "budget": {
            "usable_bytes": 1000,
            "name": "T4",
            "source": "card",
            "total_bytes": 2000,
            "device": "GPU:0",
            "notes": ["a", "b"],
        },
        "failing_batch_size": 64,
        "stopped_by": "bracket",
        "worst_case_samples": True,
        "largest_sample": {"index": 3},
        "trials": [
            {
                "batch_size": 32,
                "oom": False,
                "peak_bytes": 800,
                "seconds": 1.0,
                "predicted_peak_bytes": 780,
                "fits": True,
                "deciding": True,
                "fresh": True,
                "steps": 2,
                "soak": False,
            },
            {
                "batch_size": 64,
                "oom": True,
                "peak_bytes": None,
                "seconds": 2.0,
                "predicted_peak_bytes": None,
                "fits": False,
                "deciding": False,
                "fresh": False,
                "steps": 2,
                "soak": False,
            },
        ],
        "decided_in": "child_process",
        "soak_steps": 3,
        "confirmed_by": (
            "trained 3 steps of model.fit's train function back to back in a fresh process,"
            " after a warm-up step, peaking at 800 B: within 900 B (the budget less the 10% margin)"
        ),
        "search_seconds": 4.5,
        "replicas": 2,
        "global_batch_size": 64,
        "allreduce_bytes": 20,
    },
    "watch_finding": {
        "kind": "growth",
        "step": 10,
        "epoch": 1,
        "message": "m",
        "cause": "c",
        "fix": "f",
        "evidence": {"bytes": [1, 2]},
        "severity": "warning",
        "run": 0,
    },
    "run": {
        "header": {"model": "m", "warmup_steps": 1, "budget_bytes": 10},
        "summary": {
            "name": "run",
            "run": 2,
            "steps": 0,
            "mean_step_seconds": None,
            "input_wait_fraction": None,
            "peak_bytes": None,
            "epochs": 1,
            "finished": False,
            "budget_bytes": 10,
            "estimate_peak_bytes": None,
            "estimate_error_fraction": None,
            "watch_overhead_fraction": None,
            "findings": 1,
        },
        "findings": [{"kind": "growth"}],
    },
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_to_dict_is_what_it_was(name):
    data = _instances()[name].to_dict()
    assert repr(data) == repr(EXPECTED[name])
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
