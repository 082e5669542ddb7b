"""Benchmark: how a training step's peak rises over a run of `model.fit`, against the estimate.

A step's peak is not the same at every step: the allocator's free chunks split up as training
goes on (in one region a chunk less than twice a request is handed out whole), and under
several inter-op threads each step's order is a race. `memfit estimate`'s high bound covers
the highest of 5 steps after a warm-up in a fresh process; a run trains thousands. This
measures, per case, `--processes` (3) fresh processes under an emulated 6 GiB card (one
region, default threading: nothing pinned), each training `--steps` (200) steps of plain
`model.fit` on one batch repeated (so no input pipeline's buffers count), with the device's
peak read after every step. Reported per case: the highest of steps 2-6 (what the estimate's
bound is checked against), the highest of the first N steps for N in 20, 50, 100 and all,
as a ratio to it (the rise), in the highest process; and the estimate's likely peak and high
bound (made in the first process, before training) against the highest step of all.

    python -m bench.step_rise --quick                  # 2 cases, 1 process, 60 steps
    python -m bench.step_rise --out rise.json          # 6 cases, 3 processes, 200 steps
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from helpers import run_isolated  # noqa: E402

from bench.machine import describe  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 200)
BUDGET = "6GiB"
SPANS = (20, 50, 100)


@dataclass(frozen=True)
class Case:
    """One model of the benchmark: image side and batch size (Adam)."""

    model: str
    size: int
    batch: int


CASES = [
    Case("MobileNetV2", 96, 8),
    Case("ResNet50", 96, 4),
    Case("EfficientNetB0", 96, 8),
    Case("MobileNet", 128, 16),
    Case("DenseNet121", 96, 4),
    Case("UNet", 128, 4),
    Case("RetinaNet", 128, 2),
]
QUICK = [Case("MobileNetV2", 96, 8), Case("UNet", 128, 4)]

CHILD = """
import memfit, keras
from memfit.backend import tf as tfb
from memfit.workload.workload import Workload
tf = tfb.import_tf()
from bench.models import accuracy_model
name, size, batch, steps = {name!r}, {size}, {batch}, {steps}
model, data = accuracy_model(name, size, batch, keras.optimizers.Adam())
workload = Workload(model, optimizer=None if data is not None else keras.optimizers.Adam(),
                    data=data)
estimate = None
if {estimate}:
    e = memfit.estimate(model, batch, data=data)
    estimate = {{"peak": e.peak_bytes, "high": e.high_bytes, "seconds": e.estimate_seconds}}
x, y = workload.batch(batch)
peaks = []

class PeakPerStep(keras.callbacks.Callback):
    def on_train_batch_begin(self, step, logs=None):
        tf.config.experimental.reset_memory_stats("CPU:0")
    def on_train_batch_end(self, step, logs=None):
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])

ds = tf.data.Dataset.from_tensors((x, y)).repeat()
started = __import__("time").perf_counter()
model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[PeakPerStep()])
emit({{"peaks": peaks, "estimate": estimate,
      "seconds": __import__("time").perf_counter() - started}})
"""


def run_case(case: Case, processes: int, steps: int) -> dict[str, Any]:
    """Train `case` in `processes` fresh processes; each step's peak, and the estimate."""
    env = {"MEMFIT_MEMORY": BUDGET, "PYTHONPATH": ROOT}
    runs = []
    for i in range(processes):
        code = CHILD.format(
            name=case.model, size=case.size, batch=case.batch, steps=steps, estimate=i == 0
        )
        runs.append(run_isolated(code, env=env, timeout=3600))
    return {"case": asdict(case), "runs": runs}


def summarise(row: dict[str, Any]) -> dict[str, Any]:
    """The rise over N steps (highest process) and the estimate against the run's peak."""
    runs = row["runs"]
    first5 = max(max(r["peaks"][1:6]) for r in runs)  # steps 2-6: after a warm-up step
    top = max(max(r["peaks"][1:]) for r in runs)
    rise = {
        str(n): max(max(r["peaks"][1 : n + 1]) for r in runs) / first5
        for n in (*SPANS, len(runs[0]["peaks"]))
        if n <= len(runs[0]["peaks"])
    }
    est = runs[0]["estimate"] or {}
    out: dict[str, Any] = {
        "first5_bytes": first5,
        "top_bytes": top,
        "rise": rise,
        "top_step": [int(max(range(1, len(r["peaks"])), key=r["peaks"].__getitem__)) for r in runs],
        "per_process_rise": [max(r["peaks"][1:]) / max(r["peaks"][1:6]) for r in runs],
        "step_seconds": statistics.median(r["seconds"] / len(r["peaks"]) for r in runs),
    }
    if est.get("high"):
        out["estimate_error_vs_first5"] = est["peak"] / first5 - 1
        out["high_covers_first5"] = est["high"] >= first5
        out["high_covers_run"] = est["high"] >= top
        out["high_over_run"] = est["high"] / top - 1
    return out


def table(rows: list[dict[str, Any]]) -> Table:
    """One line per case: the first 5 steps' peak, the rise at each N, the estimate."""
    t = Table(title="Peak rise over a run of model.fit (highest of the processes)")
    for column in ("case", "steps 2-6", *(f"x at {n}" for n in SPANS), "x at all", "high bound"):
        t.add_column(column)
    for row in rows:
        s, c = row["summary"], row["case"]
        n_all = max(int(k) for k in s["rise"])
        high = (
            f"{'covers' if s['high_covers_run'] else 'UNDER'} the run "
            f"({100 * s['high_over_run']:+.1f}%); 5 steps: "
            f"{'covered' if s['high_covers_first5'] else 'UNDER'}"
            if "high_covers_run" in s
            else "-"
        )
        t.add_row(
            f"{c['model']} {c['size']} px b{c['batch']}",
            f"{s['first5_bytes'] / 2**20:.1f} MiB",
            *(f"{s['rise'].get(str(n), float('nan')):.3f}" for n in SPANS),
            f"{s['rise'][str(n_all)]:.3f} ({n_all})",
            high,
        )
    return t


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table, write `--out` JSON after each case."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 cases, 1 process, 60 steps")
    parser.add_argument("--processes", type=int, help="fresh processes per case (default 3)")
    parser.add_argument("--steps", type=int, help="steps of model.fit per process (200)")
    parser.add_argument("--models", nargs="+", help="only these models (names in CASES)")
    parser.add_argument("--out", metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    cases = QUICK if args.quick else CASES
    if args.models:
        cases = [c for c in CASES if c.model in args.models]
    processes = args.processes or (1 if args.quick else 3)
    steps = args.steps or (60 if args.quick else 200)
    report: dict[str, Any] = {
        "machine": describe(f"CPU BFC capped at {BUDGET} (memfit emulation), default threads"),
        "processes": processes,
        "steps": steps,
        "cases": [],
    }
    started = time.perf_counter()
    for case in cases:
        console.print(f"{case.model} {case.size} px b{case.batch}: {processes} x {steps} steps")
        row = run_case(case, processes, steps)
        row["summary"] = summarise(row)
        console.print(f"  {row['summary']}")
        report["cases"].append(row)
        if args.out:
            with open(args.out, "w") as handle:
                json.dump(report, handle, indent=2)
    report["seconds"] = time.perf_counter() - started
    console.print(table(report["cases"]))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
