"""memfit.data.audit and `memfit data audit`: each planted problem flagged, none once fixed."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from helpers import run_cli

import memfit.data
from memfit.data import synth

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from examples import data_pipelines as pipelines  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return synth.write_dataset(
        str(tmp_path_factory.mktemp("audit")), count=16, shards=2, image_size=(64, 96, 64, 96)
    )


def test_naive_pipeline_is_flagged_for_each_planted_problem(files):
    result = memfit.data.audit(pipelines.naive(files, batch_size=4), steps=2)
    kinds = set(result.kinds())
    assert {
        "map_not_parallel",
        "batch_before_map",
        "interleave_not_parallel",
        "no_prefetch",
        "missing_cache",
        "no_error_policy",
    } <= kinds
    assert not result.ok and result.batch_size == 4 and result.elements_per_second > 0
    by_kind = {f.kind: f for f in result.findings}
    assert "num_parallel_calls" in by_kind["map_not_parallel"].fix
    assert ".prefetch(tf.data.AUTOTUNE)" in by_kind["no_prefetch"].fix
    serial = memfit.data.audit(pipelines.naive(files, 4, parallel_files=False), steps=0)
    assert "serial_file_reads" in serial.kinds()


def test_large_from_tensor_slices_is_flagged():
    import tensorflow as tf

    array = np.zeros((64, 32, 32, 3), np.float32)  # 768 KiB
    dataset = tf.data.Dataset.from_tensor_slices(array).prefetch(1)
    assert memfit.data.audit(dataset, steps=0, large_bytes=512 * 1024).kinds() == [
        "large_tensor_slices"
    ]
    assert memfit.data.audit(dataset, steps=0).kinds() == []  # under the 64 MiB default


def test_fixed_pipeline_has_no_finding_and_a_missed_target_is_input_bound(files):
    result = memfit.data.audit(pipelines.fixed(files, batch_size=4), steps=2)
    assert result.findings == [], result.findings
    assert result.ok and result.batch_size == 4
    slow = memfit.data.audit(
        pipelines.fixed(files, batch_size=4), steps=2, target_steps_per_second=1e9
    )
    assert slow.kinds() == ["input_bound"] and not slow.ok


def test_cli_audit_exit_codes_and_json(files):
    env = {"MEMFIT_DATA_FILES": os.path.join(os.path.dirname(files[0]), "*.tfrecord")}
    naive = run_cli(
        "data",
        "audit",
        "examples.data_pipelines:naive_dataset",
        "--steps",
        "2",
        "--json",
        env=env,
    )
    assert naive.returncode == 1, naive.stderr
    payload = json.loads(naive.stdout)
    assert "batch_before_map" in [f["kind"] for f in payload["findings"]]
    assert payload["elements_per_second"] > 0 and payload["ok"] is False
    fixed = run_cli(
        "data", "audit", "examples.data_pipelines:fixed_dataset", "--steps", "2", env=env
    )
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "no findings" in fixed.stdout


def test_cli_audit_times_service_workers_and_names_them():
    out = run_cli(
        "data", "audit", "examples.data_pipelines:waiting_dataset", "--steps", "20",
        "--workers", "0,2", "--target-steps-per-second", "30", "--json",
    )
    payload = json.loads(out.stdout)
    rates = payload["service_rates"]
    assert set(rates) == {"0", "2"}, payload
    assert rates["0"] < 25 < rates["2"], rates  # 50 ms a batch: ~20/s, ~40/s with two
    assert payload["service_workers"] == 2
    bound = [f for f in payload["findings"] if f["kind"] == "input_bound"]
    assert bound and "memfit.fit(..., data_service=2)" in bound[0]["fix"]
    bad = run_cli("data", "audit", "examples.data_pipelines:waiting_dataset", "--workers", "1,x")
    assert bad.returncode == 2
    assert "'1,x' is not a list of worker counts" in bad.stderr
    assert "Traceback" not in bad.stderr
