"""Benchmark: does `memfit.fit` lose anything to OOMs, preemption, `kill -9` or a long run?

Four parts, each in fresh processes under memfit's emulated budgets (2 CPU cores):

1. **OOMs** (`oom`): one `memfit.fit` run over a dataset whose batches change resolution
   (a small CNN, batch 16, 128 MiB), with an Adam whose update needs a 2 GiB temporary at
   chosen updates (an OOM inside the optimizer update, `guard_update=True`). Every recovery
   counts as an OOM survived when the run ends with nothing lost: one update per batch, every
   sample fed (memfit.Watch's records), the final weights equal (1e-5) to a reference run in
   4 GiB that trains the same data with the run's final K per input shape from the start.
2. **SIGTERM** (`sigterm`): one run (`backup_dir`, a checkpoint every 4 updates) preempted at
   N random updates (seeded), each time resumed by a new process; at the end the weights
   (1e-5) and update count against an uninterrupted run.
3. **kill -9 mid-write** (`kill9`): the same run, killed -9 N times in the middle of a
   checkpoint write (memfit's test hook pauses the write between the temporary file and the
   replace); each time the previous checkpoint must read back at the expected update, and a
   new process resumes from it; at the end the same comparison.
4. **Watch** (`watch`): 2,000 steps of a small MLP under `memfit.fit` with `memfit.Watch`:
   no `memory_growth` finding, and the allocator's resident bytes (Watch's
   `memory_current_bytes`) at step 100 and at the end within 1%; the process RSS is shown too.

    python -m bench.reliability                # 20 OOMs, 10 SIGTERMs, 10 kill -9, 2,000 steps
    python -m bench.reliability --quick        # 5, 3, 3, 300 (under 10 minutes on 2 cores)
    python -m bench.reliability --out rel.json --parts oom watch
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.models import box_dataset, detector_cnn
from bench.trials import ROOT

console = Console(stderr=True)

PARTS = ("oom", "sigterm", "kill9", "watch")
RESULT_MARK = "RELIABILITY-RESULT:"
TOLERANCE = 1e-5
OOM_BUDGET = "128MiB"
ROOMY_BUDGET = "4GiB"
WATCH_BUDGET = "512MiB"


@dataclass(frozen=True)
class Sizes:
    """How much of each part a run does.

    Attributes:
        resolutions: the input sizes of run 1's dataset, in order (2 batches of 16 each).
        apply_ooms: updates (from 0) whose optimizer update runs out of memory in run 1.
        epochs: epochs of run 1 (K is kept per shape, but under this tight budget a shape
            can need a larger K in a later epoch: those OOMs count too).
        preemptions: SIGTERMs in run 2.
        kills: `kill -9`s mid-write in run 3.
        train_epochs: epochs of runs 2 and 3 (16 updates each).
        watch_steps: steps of run 4.
    """

    resolutions: tuple[int, ...]
    apply_ooms: tuple[int, ...]
    epochs: int
    preemptions: int
    kills: int
    train_epochs: int
    watch_steps: int


FULL = Sizes(
    # Under 128 MiB: 64 px fits whole, 192 px in micro-batches of 2 (224 px not even in 1s).
    resolutions=(64, 128, 64, 96, 160, 192, 112, 144, 176, 128),
    apply_ooms=(1, 5, 9, 13, 17, 21, 25, 33),
    epochs=2,
    preemptions=10,
    kills=10,
    train_epochs=4,
    watch_steps=2000,
)
QUICK = Sizes(
    resolutions=(64, 128, 64, 192),
    apply_ooms=(1, 5),
    epochs=1,
    preemptions=3,
    kills=3,
    train_epochs=2,
    watch_steps=300,
)
BATCH = 16
TRAIN_BATCHES = 16  # per epoch in runs 2 and 3 (batch 8 of 32x32 images)
SAVE_EVERY = 4  # run 2's checkpoint frequency (updates)
KILL_SAVE_EVERY = 2  # run 3's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: `--quick`, `--out FILE`, `--parts ...`, `--seed N`."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.reliability", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="5 OOMs, 3 SIGTERMs, 3 kills, 300 steps"
    )
    parser.add_argument("--out", metavar="FILE", help="write the results here as JSON")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--seed", type=int, default=0, help="the random preemption updates")
    args = parser.parse_args(argv)
    args.sizes = QUICK if args.quick else FULL
    return args


def planned(sizes: Sizes, part: str) -> int:
    """The trials a part sets out to make (the OOM count is only known once it ran)."""
    return {
        "oom": len(sizes.apply_ooms) + len(set(sizes.resolutions)) - 1,
        "sigterm": sizes.preemptions,
        "kill9": sizes.kills,
        "watch": 1,
    }[part]


# -- rows, table, JSON ------------------------------------------------------------------------
OUTCOME = {"oom": "survived", "sigterm": "resumed", "kill9": "recoverable", "watch": "flat"}
TITLES = {
    "oom": "OOMs in one run (input sizes, optimizer update)",
    "sigterm": "SIGTERM at random updates, resumed",
    "kill9": "kill -9 during a checkpoint write",
    "watch": "memfit.Watch over a long run",
}


def row(
    part: str, trials: int, ok: int, seconds: float, detail: str, **extra: Any
) -> dict[str, Any]:
    """One part's result: `ok` of `trials` went right (survived, resumed...), the rest lost."""
    if not 0 <= ok <= trials:
        raise ValueError(f"{part}: {ok} of {trials} trials cannot be")
    return {
        "part": part,
        "title": TITLES[part],
        "trials": trials,
        "outcome": OUTCOME[part],
        "ok": ok,
        "lost": trials - ok,
        "seconds": round(seconds, 1),
        "detail": detail,
        **extra,
    }


def table(rows: list[dict[str, Any]]) -> Table:
    """The rich table: part, trials, survived/resumed/recoverable, lost, seconds, detail."""
    out = Table(title="Reliability of memfit.fit")
    for column in (
        "part",
        "trials",
        "survived / resumed / recoverable",
        "lost",
        "seconds",
        "detail",
    ):
        out.add_column(column)
    for r in rows:
        out.add_row(
            r["title"],
            str(r["trials"]),
            f"{r['ok']} {r['outcome']}",
            str(r["lost"]),
            f"{r['seconds']:.0f}",
            r["detail"],
        )
    return out


def report(args: argparse.Namespace, rows: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """The JSON document `--out` writes."""
    from bench.machine import describe

    return {
        "command": "python -m bench.reliability" + (" --quick" if args.quick else ""),
        "quick": bool(args.quick),
        "seed": args.seed,
        "sizes": asdict(args.sizes),
        "machine": describe("CPU BFC capped at the budget (memfit emulation, MEMFIT_MEMORY)"),
        "parts": rows,
        "all_ok": all(r["lost"] == 0 for r in rows),
        "seconds": round(seconds, 1),
    }


# -- children ---------------------------------------------------------------------------------
def _env(budget: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMFIT_", "TF_CPU_BFC"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if budget:
        env["MEMFIT_MEMORY"] = budget
    env.update(extra)
    return env


def _command(function: str, payload: dict[str, Any]) -> list[str]:
    code = f"import bench.reliability as r; r.child_main({function!r}, {json.dumps(payload)!r})"
    return [sys.executable, "-c", code]


def _run(function: str, payload: dict[str, Any], budget: str | None, timeout: int = 1800) -> Any:
    proc = subprocess.run(
        _command(function, payload),
        env=_env(budget),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    return parse_result(proc.returncode, proc.stdout, proc.stderr)


def parse_result(returncode: int, stdout: str, stderr: str) -> Any:
    """A child's result (its `RESULT_MARK` line); RuntimeError with its output if it failed."""
    found = [s[len(RESULT_MARK) :] for s in stdout.splitlines() if s.startswith(RESULT_MARK)]
    if returncode != 0 or not found:
        raise RuntimeError(f"child exited {returncode}\n{stdout[-2000:]}\n{stderr[-4000:]}")
    return json.loads(found[-1])


def child_main(function: str, payload: str) -> None:
    """Child side: run one of this module's `*_child` functions; print its JSON result."""
    result = globals()[function](**json.loads(payload))
    print(RESULT_MARK + json.dumps(result), flush=True)


def _resolution_dataset(resolutions: list[int]) -> tuple[Any, int]:
    """Two batches of 16 per resolution, in order; and the number of samples."""
    return box_dataset(tuple(resolutions), 2 * BATCH, BATCH), 2 * BATCH * len(resolutions)


def _flaky_adam(updates: int, oom_at: list[int]) -> Any:
    """Adam whose update at each of `oom_at` allocates 2 GiB after its third variable, once."""
    import keras
    import numpy as np
    import tensorflow as tf

    class FlakyAdam(keras.optimizers.Adam):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            armed = np.zeros(updates + 1, "float32")
            armed[oom_at] = 1.0
            # A plain tf.Variable: not optimizer state, so the guard's restore keeps it at 0.
            self.armed = tf.Variable(armed, trainable=False)

        def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
            super().update_step(gradient, variable, learning_rate)
            if self._get_variable_index(variable) != 2:
                return
            at = tf.cast(self.iterations, tf.int32)

            def boom() -> Any:
                with tf.control_dependencies([self.armed[at].assign(0.0)]):
                    big = tf.random.uniform([512 * 1024 * 1024])  # 2 GiB
                return tf.minimum(tf.reduce_max(big), 0.0)

            hit = tf.cond(self.armed[at] > 0, boom, lambda: 0.0)
            with tf.control_dependencies([hit]):
                variable.assign_add(tf.zeros_like(variable))

    return FlakyAdam(learning_rate=1e-3)


def oom_child(resolutions: list[int], apply_ooms: list[int], epochs: int) -> dict[str, Any]:
    """Run 1: memfit.fit through the changing resolutions under the tight budget."""
    import memfit

    dataset, samples = _resolution_dataset(resolutions)
    updates = len(resolutions) * 2 * epochs
    model = detector_cnn(optimizer=_flaky_adam(updates, apply_ooms))
    watch = memfit.Watch(verbose=False)
    history = memfit.fit(
        model, dataset, epochs=epochs, verbose=0, guard_update=True, callbacks=[watch]
    )
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "iterations": int(model.optimizer.iterations.numpy()),
        "summary": history.memfit.to_dict(),
        "loss": history.history["loss"],
        "fed_samples": sum(s["batch_size"] or 0 for s in watch.steps),
        "fed_shapes": [s["input_shape"] for s in watch.steps],
        "samples_per_epoch": samples,
    }


def oom_reference_child(
    resolutions: list[int], epochs: int, micro_batches: dict[str, int]
) -> dict[str, Any]:
    """The reference: the same data in a roomy budget, each shape at its final K from the start."""
    import memfit

    dataset, _ = _resolution_dataset(resolutions)
    model = detector_cnn()
    step = memfit.GuardedStep(model, guard_update=True, verbose=False)
    step.resume_micro_batches(micro_batches)
    for _ in range(epochs):
        for batch in dataset:
            step(batch)
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "iterations": int(model.optimizer.iterations.numpy()),
        "summary": step.summary.to_dict(),
    }


def train_child(
    backup_dir: str | None, out: str, epochs: int, save_freq: int, stop_at: int = -1
) -> dict[str, Any]:
    """Runs 2 and 3: small CNN on 32x32 images, announcing each update on stdout.

    At update `stop_at` it writes `backup_dir.ready` and waits (up to 10 s) for
    `backup_dir.sent`, so the parent's signal lands after that update.
    """
    import logging

    import keras
    import numpy as np

    import memfit

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # memfit's resume line
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (8 * TRAIN_BATCHES, 32, 32, 3)).astype("float32")
    y = rng.uniform(0, 1, (8 * TRAIN_BATCHES, 4)).astype("float32")
    model = detector_cnn()

    class Announce(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            update = int(self.model.optimizer.iterations.numpy())
            print(f"UPDATE {update}", flush=True)
            if update == stop_at and backup_dir:
                open(backup_dir + ".ready", "w").close()
                for _ in range(1000):
                    if os.path.exists(backup_dir + ".sent"):
                        break
                    time.sleep(0.01)

    kwargs: dict[str, Any] = {}
    if backup_dir:
        kwargs = {"backup_dir": backup_dir, "save_freq": save_freq}
    memfit.fit(
        model,
        x,
        y,
        batch_size=8,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[Announce()],
        **kwargs,
    )
    updates = int(model.optimizer.iterations.numpy())
    np.savez(out, *model.get_weights(), updates=np.array(updates))
    return {"iterations": updates}


def watch_child(steps: int) -> dict[str, Any]:
    """Run 4: a small MLP for `steps` updates under memfit.fit with memfit.Watch."""
    import keras
    import numpy as np

    import memfit

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(10),
        ]
    )  # 1.1 M parameters: weights and Adam's slots, 13 MiB resident
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    rng = np.random.default_rng(0)
    per_epoch = 100
    x = rng.normal(size=(32 * per_epoch, 64)).astype("float32")
    y = rng.integers(0, 10, 32 * per_epoch)
    page = os.sysconf("SC_PAGE_SIZE")
    rss: dict[int, int] = {}

    def read_rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    class Rss(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            update = int(self.model.optimizer.iterations.numpy())
            if update in (100, steps):
                rss[update] = read_rss()

    watch = memfit.Watch(verbose=False)
    memfit.fit(
        model,
        x,
        y,
        batch_size=32,
        epochs=steps // per_epoch,
        shuffle=True,
        verbose=0,
        callbacks=[watch, Rss()],
    )
    records = watch.steps
    return {
        "steps": len(records),
        "findings": [f.to_dict() for f in watch.findings],
        "current_at_100": records[99]["memory_current_bytes"],
        "current_at_end": records[-1]["memory_current_bytes"],
        "peak_at_100": records[99]["memory_peak_bytes"],
        "peak_at_end": records[-1]["memory_peak_bytes"],
        "rss_at_100": rss.get(100),
        "rss_at_end": rss.get(steps),
        "current_every_50": [r["memory_current_bytes"] for r in records[::50]],
    }


# -- the parts --------------------------------------------------------------------------------
def _rel(a: list[Any], b: list[Any]) -> float:
    import numpy as np

    x = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in a])
    y = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in b])
    return float(np.linalg.norm(x - y) / (np.linalg.norm(y) + 1e-30))


def part_oom(sizes: Sizes) -> dict[str, Any]:
    """Run 1 and its reference; every recovery survived when nothing was lost."""
    started = time.perf_counter()
    resolutions = list(sizes.resolutions)
    run = _run(
        "oom_child",
        {"resolutions": resolutions, "apply_ooms": list(sizes.apply_ooms), "epochs": sizes.epochs},
        OOM_BUDGET,
    )
    summary = run["summary"]
    reference = _run(
        "oom_reference_child",
        {
            "resolutions": resolutions,
            "epochs": sizes.epochs,
            "micro_batches": summary["micro_batches"],
        },
        ROOMY_BUDGET,
    )
    recoveries = summary["recoveries"]
    phases = [r["phase"] for r in recoveries]
    batches = len(resolutions) * 2 * sizes.epochs
    difference = _rel(run["weights"], reference["weights"])
    expected_shapes = [[BATCH, s, s, 3] for s in resolutions for _ in range(2)] * sizes.epochs
    checks = {
        "updates_equal_batches": run["iterations"] == reference["iterations"] == batches,
        "every_sample_fed": run["fed_samples"] == run["samples_per_epoch"] * sizes.epochs
        and run["fed_shapes"] == expected_shapes,
        "weights_match_reference": difference < TOLERANCE,
        "reference_without_oom": reference["summary"]["recoveries"] == [],
    }
    ok = len(recoveries) if all(checks.values()) else 0
    ks = sorted({k for k in summary["micro_batches"].values()})
    detail = (
        f"{phases.count('gradients')} in the gradients, {phases.count('apply')} in the update; "
        f"K up to {max(ks)}; {run['iterations']} updates = {batches} batches; weights vs "
        f"reference {difference:.1e}"
    )
    return row(
        "oom",
        len(recoveries),
        ok,
        time.perf_counter() - started,
        detail,
        checks=checks,
        weight_difference=difference,
        recoveries=recoveries,
        micro_batches=summary["micro_batches"],
        loss=run["loss"],
    )


def _reference_weights(tmp: str, epochs: int) -> tuple[list[Any], int]:
    """The uninterrupted run (no backup_dir): its weights and update count."""
    out = os.path.join(tmp, "reference.npz")
    payload = {"backup_dir": None, "out": out, "epochs": epochs, "save_freq": 1}
    _run("train_child", payload, None)
    return _load(out), _load_updates(out)


def _load(out: str) -> list[Any]:
    """The weights a training child saved (`np.savez(out, *weights)`), in order."""
    import numpy as np

    with np.load(out) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files) - 1)]


def _load_updates(out: str) -> int:
    import numpy as np

    with np.load(out) as data:
        return int(data["updates"])


class _Child:
    """A training child whose stdout is followed; signalled at `stop_at`."""

    def __init__(
        self,
        backup_dir: str,
        out: str,
        epochs: int,
        save_freq: int,
        stop_at: int = -1,
        env: dict[str, str] | None = None,
    ) -> None:
        payload = {
            "backup_dir": backup_dir,
            "out": out,
            "epochs": epochs,
            "save_freq": save_freq,
            "stop_at": stop_at,
        }
        self.backup_dir = backup_dir
        self.stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by finish)
        self.proc = subprocess.Popen(
            _command("train_child", payload),
            env=_env(None, **(env or {})),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            stdin=subprocess.DEVNULL,
        )

    def wait_for(self, marker: str, timeout: float = 900) -> bool:
        """Wait until `marker` exists (True), or the child ended (False)."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(marker):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def finish(self, timeout: float = 900) -> tuple[int, str, str]:
        stdout, _ = self.proc.communicate(timeout=timeout)
        self.stderr.seek(0)
        stderr = self.stderr.read()
        self.stderr.close()
        return self.proc.returncode, stdout, stderr


def _clear(*paths: str) -> None:
    for path in paths:
        if os.path.exists(path):
            os.remove(path)


def part_sigterm(sizes: Sizes, seed: int) -> dict[str, Any]:
    """Run 2: one run, SIGTERM at `preemptions` random updates, each resumed."""
    import numpy as np

    from memfit.training.checkpoint import BACKUP_FILE, read_checkpoint
    from memfit.training.preemption import PREEMPTED_EXIT_CODE

    started = time.perf_counter()
    total = sizes.train_epochs * TRAIN_BATCHES
    rng = np.random.default_rng(seed)
    stops = sorted(
        int(u) for u in rng.choice(np.arange(1, total), sizes.preemptions, replace=False)
    )
    with tempfile.TemporaryDirectory(prefix="memfit-rel-") as tmp:
        backup, out = os.path.join(tmp, "backup"), os.path.join(tmp, "out.npz")
        reference, reference_updates = _reference_weights(tmp, sizes.train_epochs)
        events: list[dict[str, Any]] = []
        previous = 0
        pending: dict[str, Any] | None = None  # the last preemption, judged by the next resume
        for stop in [*stops, -1]:
            child = _Child(backup, out, sizes.train_epochs, SAVE_EVERY, stop)
            reached = stop < 0 or child.wait_for(backup + ".ready")
            if stop >= 0 and reached:
                child.proc.send_signal(signal.SIGTERM)
                open(backup + ".sent", "w").close()
            status, stdout, stderr = child.finish()
            _clear(backup + ".ready", backup + ".sent")
            if pending is not None:
                pending["resumed_at_checkpoint"] = resumed_at(stdout, stderr, previous)
            if stop < 0:
                final_status = status
                break
            checkpoint = (
                read_checkpoint(backup)
                if os.path.exists(os.path.join(backup, BACKUP_FILE))
                else None
            )
            pending = {
                "stop_at": stop,
                "status": status,
                "checkpoint_updates": checkpoint.updates if checkpoint else None,
                "checkpoint_reason": checkpoint.reason if checkpoint else None,
                "last_announced": last_update(stdout),
            }
            pending["preempted"] = (
                status == PREEMPTED_EXIT_CODE
                and checkpoint is not None
                and checkpoint.reason == "preempted"
                and checkpoint.updates == stop
            )
            events.append(pending)
            previous = checkpoint.updates if checkpoint else 0
        weights = _load(out) if final_status == 0 else None
        iterations = last_update(stdout)
        difference = _rel(weights, reference) if weights is not None else float("inf")
        matches = difference < TOLERANCE and iterations == reference_updates == total
        for event in events:
            event["ok"] = bool(
                event["preempted"] and event.get("resumed_at_checkpoint") and matches
            )
        good = sum(e["ok"] for e in events)
    detail = (
        f"one run of {total} updates stopped at {', '.join(map(str, stops))}; end vs "
        f"uninterrupted {difference:.1e}, {iterations} = {reference_updates} updates"
    )
    return row(
        "sigterm",
        len(stops),
        good,
        time.perf_counter() - started,
        detail,
        events=events,
        weight_difference=difference,
        final_status=final_status,
    )


def _updates(stdout: str) -> list[int]:
    return [int(s.split()[1]) for s in stdout.splitlines() if s.startswith("UPDATE ")]


def last_update(stdout: str) -> int | None:
    """The last update a training child announced."""
    updates = _updates(stdout)
    return updates[-1] if updates else None


def resumed_at(stdout: str, stderr: str, update: int) -> bool:
    """The process said it resumed at `update` and trained `update + 1` first."""
    first = _updates(stdout)[:1]
    said = update == 0 or "resuming from" in stderr and f"at update {update} (" in stderr
    return said and first == [update + 1]


def part_kill9(sizes: Sizes, seed: int) -> dict[str, Any]:
    """Run 3: one run, `kill -9` in the middle of `kills` checkpoint writes, each resumed."""
    import numpy as np

    from memfit.training.checkpoint import BACKUP_FILE, read_checkpoint

    started = time.perf_counter()
    total = sizes.train_epochs * TRAIN_BATCHES
    rng = np.random.default_rng(seed + 1)
    with tempfile.TemporaryDirectory(prefix="memfit-rel-") as tmp:
        backup, out = os.path.join(tmp, "backup"), os.path.join(tmp, "out.npz")
        marker = backup + ".ready"
        reference, reference_updates = _reference_weights(tmp, sizes.train_epochs)
        events: list[dict[str, Any]] = []
        start = 0  # the update the next process resumes at
        for _ in range(sizes.kills):
            # Pause in write j: at update start + j*N; the first process's first write has no
            # previous checkpoint, so it is killed in its second or later.
            room = (total - 1 - start) // KILL_SAVE_EVERY
            low = 2 if start == 0 else 1
            if room < low:
                break
            j = int(rng.integers(low, min(room, 3) + 1))
            env = {"MEMFIT_BACKUP_TEST_PAUSE": marker, "MEMFIT_BACKUP_TEST_PAUSE_AT": str(j)}
            child = _Child(backup, out, sizes.train_epochs, KILL_SAVE_EVERY, env=env)
            paused = child.wait_for(marker)
            if paused:
                child.proc.send_signal(signal.SIGKILL)
            status, stdout, stderr = child.finish()
            _clear(marker)
            expected = start + (j - 1) * KILL_SAVE_EVERY
            names = sorted(os.listdir(backup)) if os.path.isdir(backup) else []
            try:
                checkpoint = read_checkpoint(backup)
                error = None
            except Exception as exc:  # a damaged checkpoint is what this part looks for
                checkpoint, error = None, f"{type(exc).__name__}: {exc}"
            event = {
                "pause_in_write": j,
                "killed": paused and status == -signal.SIGKILL,
                "write_cut_at_update": start + j * KILL_SAVE_EVERY,
                "last_announced": last_update(stdout),
                "checkpoint_updates": checkpoint.updates if checkpoint else None,
                "expected_updates": expected,
                "leftover_temporary": any(n != BACKUP_FILE for n in names),
                "read_error": error,
                "resumed_where_expected": resumed_at(stdout, stderr, start),
            }
            event["recoverable"] = bool(
                event["killed"]
                and checkpoint is not None
                and checkpoint.updates == expected
                and event["resumed_where_expected"]
            )
            events.append(event)
            start = checkpoint.updates if checkpoint else 0
        child = _Child(backup, out, sizes.train_epochs, KILL_SAVE_EVERY)
        status, stdout, stderr = child.finish()
        resumed_last = resumed_at(stdout, stderr, start)
        weights = _load(out) if status == 0 else None
        iterations = last_update(stdout)
        difference = _rel(weights, reference) if weights is not None else float("inf")
        matches = (
            difference < TOLERANCE and iterations == reference_updates == total and resumed_last
        )
        for event in events:
            event["ok"] = bool(event["recoverable"] and matches)
        cut = [e["write_cut_at_update"] for e in events]
    detail = (
        f"one run of {total} updates, writes cut at {', '.join(map(str, cut))}; end vs "
        f"uninterrupted {difference:.1e}, {iterations} = {reference_updates} updates"
    )
    return row(
        "kill9",
        len(events),
        sum(e["ok"] for e in events),
        time.perf_counter() - started,
        detail,
        events=events,
        weight_difference=difference,
        final_status=status,
    )


def part_watch(sizes: Sizes) -> dict[str, Any]:
    """Run 4: flat memory over `watch_steps` steps, and no growth finding."""
    started = time.perf_counter()
    result = _run("watch_child", {"steps": sizes.watch_steps}, WATCH_BUDGET)
    growth = [f for f in result["findings"] if f["kind"] == "memory_growth"]
    a, b = result["current_at_100"], result["current_at_end"]
    drift = abs(b - a) / a if a else float("inf")
    rss_drift = (
        (result["rss_at_end"] - result["rss_at_100"]) / result["rss_at_100"]
        if result["rss_at_100"] and result["rss_at_end"]
        else None
    )
    flat = not growth and drift <= 0.01 and result["steps"] == sizes.watch_steps
    detail = (
        f"{result['steps']} steps; growth findings {len(growth)}; resident {a / 2**20:.2f} -> "
        f"{b / 2**20:.2f} MiB ({drift:+.2%})"
        + (f"; process RSS {rss_drift:+.1%}" if rss_drift is not None else "")
    )
    return row(
        "watch",
        1,
        int(flat),
        time.perf_counter() - started,
        detail,
        resident_drift=drift,
        rss_drift=rss_drift,
        **result,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the chosen parts; print the table; write the JSON with `--out`."""
    args = parse_args(argv)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    runners = {
        "oom": lambda: part_oom(args.sizes),
        "sigterm": lambda: part_sigterm(args.sizes, args.seed),
        "kill9": lambda: part_kill9(args.sizes, args.seed),
        "watch": lambda: part_watch(args.sizes),
    }
    for part in PARTS:
        if part not in args.parts:
            continue
        console.rule(TITLES[part])
        part_started = time.perf_counter()
        try:
            rows.append(runners[part]())
        except Exception as exc:  # a child that died: every trial of the part is lost
            detail = f"failed: {str(exc).strip().splitlines()[-1][:200]}"
            seconds = time.perf_counter() - part_started
            rows.append(row(part, planned(args.sizes, part), 0, seconds, detail, error=str(exc)))
        console.print(
            f"  {rows[-1]['ok']}/{rows[-1]['trials']} {rows[-1]['outcome']}: "
            f"{rows[-1]['detail']} ({rows[-1]['seconds']:.0f} s)"
        )
        if args.out:
            with open(args.out, "w") as handle:
                json.dump(report(args, rows, time.perf_counter() - started), handle, indent=2)
    Console().print(table(rows))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report(args, rows, time.perf_counter() - started), handle, indent=2)
        console.print(f"wrote {args.out}")
    return 0 if all(r["lost"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
