"""memfit.fit(backup_dir=...): SIGTERM, kill -9 mid-write, resume, K kept, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import run_isolated

from memfit.training.checkpoint import BACKUP_FILE, read_checkpoint
from memfit.training.preemption import PREEMPTED_EXIT_CODE

CHILDREN = Path(__file__).resolve().parent / "children"

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A child that trains factories.small_cnn for 3 epochs of 6 batches with backup_dir. At update
# READY_AT it writes BACKUP.ready and waits (up to 5 s, until BACKUP.sent) in a callback, for
# the test to signal it. With REFERENCE set it then trains a fresh model without backup_dir
# (the uninterrupted run).
CHILD = """
import json, logging, os, sys, time
sys.path.insert(0, {tests!r})
logging.basicConfig(level=logging.INFO, format="%(message)s")  # memfit's lines at verbose=0
import memfit
import keras, numpy as np
import factories

backup_dir, out = sys.argv[1], sys.argv[2]
ready_at = int(os.environ.get("READY_AT", "0"))
save_freq = os.environ.get("SAVE_FREQ", "epoch")
save_freq = save_freq if save_freq == "epoch" else int(save_freq)
rng = np.random.default_rng(0)
x = rng.uniform(0, 1, (48, 64, 64, 3)).astype("float32")
y = rng.integers(0, 10, 48)

class Ready(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations) == ready_at:
            open(backup_dir + ".ready", "w").close()
            for _ in range(500):
                if os.path.exists(backup_dir + ".sent"):
                    break
                time.sleep(0.01)

def train(**kwargs):
    model = factories.small_cnn()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = memfit.fit(model, x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, **kwargs)
    return model, history

watch = memfit.Watch(log_path=backup_dir + ".jsonl", verbose=False)
model, history = train(backup_dir=backup_dir, save_freq=save_freq, callbacks=[watch, Ready()])
result = dict(
    weights=[w.tolist() for w in model.get_weights()],
    iterations=int(model.optimizer.iterations),
    losses=history.history["loss"],
    accuracy=history.history["accuracy"],
)
if os.environ.get("REFERENCE"):
    reference, history = train()
    result.update(
        reference=[w.tolist() for w in reference.get_weights()],
        reference_iterations=int(reference.optimizer.iterations),
        reference_losses=history.history["loss"],
        reference_accuracy=history.history["accuracy"],
    )
with open(out, "w") as f:
    json.dump(result, f)
"""


def _child(tmp_path: Path, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=TESTS))
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMFIT_", "TF_CPU_BFC"))}
    child_env.update(TF_CPP_MIN_LOG_LEVEL="2", **env)
    command = [sys.executable, str(script), str(tmp_path / "backup"), str(tmp_path / "out.json")]
    return command, child_env


def _start_and_stop(tmp_path: Path, env: dict[str, str], stop: int) -> tuple[int, str]:
    """Start the child, wait until it reached READY_AT, send it `stop`; its status, stderr."""
    command, child_env = _child(tmp_path, env)
    proc = subprocess.Popen(
        command, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    ready = tmp_path / "backup.ready"
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the child never got to READY_AT"
        time.sleep(0.02)
    proc.send_signal(stop)
    (tmp_path / "backup.sent").touch()  # after the signal: the child's handler has run
    _, stderr = proc.communicate(timeout=120)
    ready.unlink()
    (tmp_path / "backup.sent").unlink()
    return proc.returncode, stderr


def _resume_with_reference(tmp_path: Path) -> dict[str, Any]:
    command, env = _child(tmp_path, {"REFERENCE": "1"})
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads((tmp_path / "out.json").read_text()), "stderr": proc.stderr}


def _rel(a: list[Any], b: list[Any]) -> float:
    x = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in a])
    y = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in b])
    return float(np.linalg.norm(x - y) / (np.linalg.norm(y) + 1e-30))


@pytest.mark.slow
def test_kill_9_mid_write_then_sigterm_mid_epoch_then_resume_equals_uninterrupted(
    tmp_path: Path,
) -> None:
    # 1. A checkpoint every 4 updates; the second write (update 8) is killed -9 after its
    #    temporary file is written, before it replaces the first one.
    env = {
        "SAVE_FREQ": "4",
        "MEMFIT_BACKUP_TEST_PAUSE": str(tmp_path / "backup.ready"),
        "MEMFIT_BACKUP_TEST_PAUSE_AT": "2",
    }
    status, _ = _start_and_stop(tmp_path, env, signal.SIGKILL)
    assert status == -signal.SIGKILL
    leftovers = sorted(p.name for p in (tmp_path / "backup").iterdir())
    assert len(leftovers) == 2 and leftovers[1] == BACKUP_FILE  # the cut one, the old one
    checkpoint = read_checkpoint(tmp_path / "backup")
    assert checkpoint is not None
    assert (checkpoint.reason, checkpoint.updates, checkpoint.epoch, checkpoint.step) == (
        "updates",
        4,
        0,
        4,
    )

    # 2. The same fit resumes from update 4; SIGTERM at update 11: epoch 2, after batch 5 of 6.
    status, stderr = _start_and_stop(tmp_path, {"SAVE_FREQ": "4", "READY_AT": "11"}, signal.SIGTERM)
    assert "at update 4 (epoch 1, after its batch 4)" in stderr
    assert status == PREEMPTED_EXIT_CODE == 143
    # One line (printed, and logged through the `memfit` logger the child configured).
    assert {s for s in stderr.splitlines() if s.startswith("memfit: preempted")} == {
        f"memfit: preempted (SIGTERM) after update 11 (epoch 2, batch 5 of 6); checkpoint "
        f"written to {tmp_path / 'backup' / BACKUP_FILE}; run the same memfit.fit again to "
        f"resume (exit status 143)"
    }
    assert "Traceback" not in stderr
    assert sorted(p.name for p in (tmp_path / "backup").iterdir()) == [BACKUP_FILE]
    checkpoint = read_checkpoint(tmp_path / "backup")
    assert checkpoint is not None
    assert (checkpoint.reason, checkpoint.epoch, checkpoint.step) == ("preempted", 1, 5)
    assert checkpoint.updates == 11
    assert checkpoint.micro_batches == {"8x64x64x3|8": 1}
    assert len(checkpoint.watch["steps"]) == 7 and checkpoint.watch["log"]

    # 3. Resumed again, to the end: as the uninterrupted run, which the same child trains next.
    result = _resume_with_reference(tmp_path)
    assert "at update 11 (epoch 2, after its batch 5)" in result["stderr"]
    assert result["iterations"] == result["reference_iterations"] == 18
    assert _rel(result["weights"], result["reference"]) < 1e-5
    # Two epochs ran in the last fit; the one it resumed logs the whole epoch's metrics.
    assert np.allclose(result["losses"], result["reference_losses"][1:], rtol=1e-5)
    assert np.allclose(result["accuracy"], result["reference_accuracy"][1:], rtol=1e-5)
    assert "ran out of data" not in result["stderr"]  # the resumed epoch ends quietly
    assert not (tmp_path / "backup").exists()  # a completed run removes its backup
    # memfit.Watch's log: the runs up to each checkpoint, then the last one, one after another.
    lines = [json.loads(s) for s in (tmp_path / "backup.jsonl").read_text().splitlines()]
    headers = [i for i, r in enumerate(lines) if r.get("type") == "header"]
    runs = [lines[a:b] for a, b in zip(headers, [*headers[1:], len(lines)], strict=True)]
    assert [sum(r["type"] == "step" for r in run) for run in runs] == [4, 7, 7]  # 18 updates


# factories.detector_cnn on factories.box_dataset: two shards, the second at twice the
# resolution, where under 128 MiB it needs K > 1 (test_fit).
SHARDS = CHILDREN / "shards_backup.py"


@pytest.mark.slow
def test_resume_keeps_k_per_input_shape_without_a_new_recovery(tmp_path: Path) -> None:
    budget = {"MEMFIT_MEMORY": "128MiB"}
    backup = str(tmp_path / "backup")
    first = run_isolated(SHARDS, env=budget, args={"epochs": 1, "backup": backup})
    big = "16x128x128x3|16x4"
    assert first["summary"]["recoveries"] and first["summary"]["micro_batches"][big] > 1
    second = run_isolated(SHARDS, env=budget, args={"epochs": 2, "backup": backup})
    assert second["iterations"] == 8  # resumed at epoch 2: 4 updates more
    assert second["summary"]["recoveries"] == []
    assert second["summary"]["micro_batches"][big] == first["summary"]["micro_batches"][big]


def test_bad_backup_input_is_one_clear_error(tmp_path: Path) -> None:
    result = run_isolated(CHILDREN / "bad_backup.py", args={"tmp": str(tmp_path)})
    assert "is a file, not a directory" in result["file"]
    assert "save_freq must be 'epoch' or a whole number" in result["save_freq"]
    assert "leave steps_per_epoch out" in result["steps"]
    assert "repeats for ever" in result["infinite"]  # refused before the backup looks
    assert "is of another model" in result["other_model"]
    assert result["untouched"] is True
    assert result["handler_after"] is True and result["kept"] == "end"
    assert "cannot be read" in result["damaged"] and "delete it" in result["damaged"]
    for name, message in result.items():
        if name not in ("untouched", "handler_after", "kept"):
            assert message and "\n" not in message, (name, message)


def _worker_cluster(
    tmp_path: Path, name: str, backup_dir: Path, ready_at: int
) -> dict[int, subprocess.Popen]:
    """Start the two loopback workers of `backup_worker.py`; output goes to files."""
    import socket

    sockets = [socket.socket() for _ in range(2)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    procs = {}
    for task in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMFIT_", "TF_CPU"))}
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": task}}
        )
        with (
            open(tmp_path / f"{name}{task}.out", "w") as out,
            open(tmp_path / f"{name}{task}.err", "w") as err,
        ):
            procs[task] = subprocess.Popen(
                [
                    sys.executable,
                    os.path.join(TESTS, "backup_worker.py"),
                    str(backup_dir),
                    str(tmp_path / f"{name}{task}.npz"),
                    str(ready_at),
                ],
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
    return procs


def _finish(procs: dict[int, subprocess.Popen], tmp_path: Path, name: str) -> list[tuple]:
    """Wait (60 s at most: a hung collective fails the test) for both workers; their
    (exit status, stdout, stderr)."""
    out = []
    for task, proc in procs.items():
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
                p.wait()
            pytest.fail(
                f"{name} worker {task} hung: {(tmp_path / f'{name}{task}.err').read_text()[-1500:]}"
            )
        text = (
            (tmp_path / f"{name}{task}.out").read_text(),
            (tmp_path / f"{name}{task}.err").read_text(),
        )
        out.append((proc.returncode, *text))
    if not any("STRATEGY-UP" in stdout for _, stdout, _ in out):
        pytest.skip(f"MultiWorkerMirroredStrategy cannot start here: {out[0][2][-500:]}")
    return out


def _npz_weights(path: Path) -> np.ndarray:
    with np.load(path) as saved:
        names = sorted(saved.files, key=lambda name: int(name.split("_")[1]))
        return np.concatenate([saved[name].ravel() for name in names]).astype(np.float64)


@pytest.mark.slow
def test_sigterm_to_one_worker_stops_all_at_one_update_and_resumes(tmp_path: Path) -> None:
    # Two workers (MultiWorkerMirroredStrategy, loopback): SIGTERM reaches only worker 1 (not
    # the chief) at update 4; both stop after update 4, the chief writes the checkpoint, both
    # resume from it and finish 12 updates with the weights of an uninterrupted 2-worker run.
    backup = tmp_path / "backup"
    procs = _worker_cluster(tmp_path, "cut", backup, ready_at=4)
    ready = Path(f"{backup}.ready-1")
    for _ in range(600):
        if ready.exists() or procs[1].poll() is not None:
            break
        time.sleep(0.1)
    assert ready.exists(), (tmp_path / "cut1.err").read_text()[-2000:]
    procs[1].send_signal(signal.SIGTERM)
    Path(f"{backup}.sent").touch()
    cut = _finish(procs, tmp_path, "cut")
    # The line (printed, and logged by the worker's handler too): the same on both workers.
    lines = [{ln for ln in err.splitlines() if "memfit: preempted" in ln} for _, _, err in cut]
    assert [rc for rc, _, _ in cut] == [PREEMPTED_EXIT_CODE] * 2, [err[-2000:] for *_, err in cut]
    assert len(lines[0]) == 1 and lines[0] == lines[1], lines
    assert "after update 4 (epoch 1, batch 4 of 6)" in next(iter(lines[0]))
    assert os.listdir(backup) == [BACKUP_FILE]  # the chief's only, no temporary left
    checkpoint = read_checkpoint(backup)
    assert checkpoint is not None and checkpoint.reason == "preempted"
    assert (checkpoint.updates, checkpoint.epoch, checkpoint.step) == (4, 0, 4)
    assert len(checkpoint.variables) == len(checkpoint.names) > 4

    resumed = _finish(_worker_cluster(tmp_path, "resume", backup, -1), tmp_path, "resume")
    reference = _finish(_worker_cluster(tmp_path, "ref", tmp_path / "ref", -1), tmp_path, "ref")
    for rc, stdout, err in resumed + reference:
        assert rc == 0 and "RESULT " in stdout, err[-2000:]
    assert all(
        "resuming from" in stdout + err and "at update 4" in stdout + err
        for _, stdout, err in resumed
    )
    results = [json.loads(out.split("RESULT ")[-1]) for _, out, _ in resumed + reference]
    assert [r["iterations"] for r in results] == [12] * 4
    assert results[0]["micro_batches"] == results[2]["micro_batches"]
    # The interrupted epoch's loss too: its running metrics were restored on both workers.
    np.testing.assert_allclose(results[0]["loss"], results[2]["loss"], rtol=1e-5)
    w = [_npz_weights(tmp_path / f"{n}.npz") for n in ("resume0", "resume1", "ref0")]
    assert np.array_equal(w[0], w[1])
    assert np.linalg.norm(w[0] - w[2]) / np.linalg.norm(w[2]) < 1e-5
    assert not backup.exists()  # the completed run removed it
