"""memfit.training.distributed: workers of MultiWorkerMirroredStrategy agree on every OOM decision.

Real processes: two loopback workers (`distributed_worker.py`, TF_CONFIG each), each with its
own emulated budget, and a single-worker reference of the same global batch.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

WORKER = Path(__file__).resolve().parents[1] / "distributed_worker.py"
TIMEOUT = 240  # a hung collective ends here, as a failure


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _env(tf_config: dict | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMFIT_", "TF_CPU_BFC"))}
    env.pop("TF_CONFIG", None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def _start(name: str, budget: str, arm_at: int, tf_config: dict | None, tmp: Path) -> Any:
    """Start one worker; its output goes to files (a full pipe would stall it)."""
    with open(tmp / f"{name}.out", "w") as out, open(tmp / f"{name}.err", "w") as err:
        return subprocess.Popen(
            [sys.executable, str(WORKER), budget, str(tmp / f"{name}.npz"), str(arm_at)],
            env=_env(tf_config),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
        )


def _wait(procs: dict[str, Any], tmp: Path, deadline: float) -> dict[str, dict]:
    """Wait for every worker until `deadline`, then kill what still runs; read each one's
    result. Skips the test when the cluster itself never started."""
    hung = []
    for name, proc in procs.items():
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung.append(name)
    for name in hung:
        procs[name].kill()
        procs[name].wait()
    outs = {n: ((tmp / f"{n}.out").read_text(), (tmp / f"{n}.err").read_text()) for n in procs}
    multi = [out for name, (out, _) in outs.items() if name != "ref"]
    if multi and not any("STRATEGY-UP" in out for out in multi):
        err = next(iter(outs.values()))[1]
        pytest.skip(f"MultiWorkerMirroredStrategy cannot start here: {err[-500:]}")
    if hung:
        tails = {name: outs[name][1][-1500:] for name in hung}
        pytest.fail(f"worker(s) {hung} hung for {TIMEOUT} s (a collective never ended): {tails}")
    return {name: _result(procs[name].returncode, *outs[name]) for name in procs}


def _result(rc: int, stdout: str, stderr: str) -> dict:
    lines = [line[len("RESULT ") :] for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert rc == 0 and lines, f"worker exited {rc}\n{stdout[-2000:]}\n{stderr[-4000:]}"
    return json.loads(lines[-1])


def _weights(path: Path) -> np.ndarray:
    with np.load(path) as saved:
        names = sorted(saved.files, key=lambda name: int(name.split("_")[1]))
        return np.concatenate([saved[name].ravel() for name in names]).astype(np.float64)


def _decisions(result: dict) -> list[tuple]:
    return [
        (r["update"], r["phase"], r["old_micro_batches"], r["new_micro_batches"])
        for r in result["summary"]["recoveries"]
    ]


@pytest.mark.slow
def test_two_workers_agree_on_every_oom_and_match_one_worker(tmp_path: Path) -> None:
    # Worker 1 has the smaller budget: only it runs out of memory, once inside the optimizer
    # update of update 1 (an injected 2 GiB allocation) and once in the gradients of the
    # first 256x256 batch (update 4), which fits its budget only in micro-batches.
    ports = _free_ports(2)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    budgets, arm = ["512MiB", "150MiB"], [-1, 0]
    tasks = [{"cluster": cluster, "task": {"type": "worker", "index": i}} for i in range(2)]
    procs = {f"w{i}": _start(f"w{i}", budgets[i], arm[i], tasks[i], tmp_path) for i in range(2)}
    results = _wait(procs, tmp_path, time.monotonic() + TIMEOUT)
    roomy, tight = results["w0"], results["w1"]
    ref_proc = _start("ref", "512MiB", -1, None, tmp_path)
    reference = _wait({"ref": ref_proc}, tmp_path, time.monotonic() + TIMEOUT)["ref"]

    assert roomy["replicas"] == tight["replicas"] == 2
    assert roomy["agreement_active"] and tight["agreement_active"]
    assert reference["agreement_active"] is False  # one process: no vote
    # Only the tight worker ran out of memory; both took its decisions at the same updates.
    own = [r for r in tight["summary"]["recoveries"] if not r["elsewhere"]]
    assert [(r["update"], r["phase"]) for r in own] == [(0, "apply"), (3, "gradients")]
    assert all("OOM when allocating" in r["message"] for r in own)
    assert roomy["summary"]["recoveries"] and all(
        r["elsewhere"] for r in roomy["summary"]["recoveries"]
    )
    assert _decisions(roomy) == _decisions(tight)
    assert roomy["summary"]["micro_batches"] == tight["summary"]["micro_batches"]
    assert tight["summary"]["micro_batches"]["8x256x256x3|8x4"] > 1
    # The update count is unchanged by the recoveries; the reference needed none.
    assert roomy["iterations"] == tight["iterations"] == reference["iterations"] == 5
    assert reference["summary"]["recoveries"] == []
    # The OOMs strike outside any collective: only the all-reduce holds one.
    for result in (roomy, tight):
        counts = result["collectives"]
        assert counts["reduce"] > 0
        assert all(n == 0 for name, n in counts.items() if name != "reduce"), counts
    # Equal weights across workers, and equal to one worker on the same global batch.
    w0, w1, ref = (_weights(tmp_path / f"{n}.npz") for n in ("w0", "w1", "ref"))
    assert np.array_equal(w0, w1)
    assert np.linalg.norm(w0 - ref) / np.linalg.norm(ref) < 1e-5
