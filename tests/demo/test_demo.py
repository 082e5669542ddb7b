"""The shortened demo, end to end, as `memfit demo --quick` runs it."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import run_cli

pytest.importorskip("keras_hub")


@pytest.mark.slow
def test_quick_demo_shows_every_step(tmp_path) -> None:
    out = tmp_path / "demo"
    proc = run_cli("demo", "--quick", "--out", str(out), "--json", timeout=1200)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    failed = [(s["name"], s["problem"], s["details"]) for s in result["steps"] if not s["ok"]]
    assert proc.returncode == 0 and not failed, failed
    names = [s["name"].split(":")[0] for s in result["steps"]]
    assert names[:3] == ["doctor", "data check", "estimate and measure"]
    steps = {s["name"].split(":")[0]: s for s in result["steps"]}
    # The seed scenario: plain fit cannot finish, memfit.fit recovers with every update.
    plain = steps["plain model.fit under the same card"]["details"]
    assert plain["new_shard"]["outcome"] == "ResourceExhaustedError"
    fitted = steps["memfit.fit on the same job"]["details"]
    assert fitted["updates"] == fitted["expected_updates"]
    assert fitted["summary"]["recoveries"]
    report = result["report_path"]
    assert report and os.path.exists(report)
    with open(report, encoding="utf-8") as handle:
        assert "<svg" in handle.read()


def test_demo_rejects_a_bad_memory_size(tmp_path) -> None:
    proc = run_cli("demo", "--memory", "lots", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith("memfit: error:") and "Traceback" not in proc.stderr
