"""Benchmark: `memfit.measure`'s peak against plain `model.fit`'s, and a step's spread.

For each model, `--processes` (3) fresh child processes measure the step with
`memfit.measure` (a warm-up step, then `--steps` measured steps, the highest peak), and as many
fresh children train `--steps` + 1 steps of plain `model.fit` on a dataset of the same batch
(the batch dimension left undefined, as a pipeline's `batch` leaves it) with a callback that
reads the allocator's peak after each step (reset before it); the highest peak is that
process's. The table compares the medians over processes (a measured peak is fixed per
process, not per model: compare medians), and reports the spread of one process's peaks over
its steps (same step, same process, `--steps` in a row: highest minus lowest, as a share of
the highest) under the default emulation (one region, a GPU with memory growth off) and under
`--memory-growth` (regions that grow).

Default threading (TensorFlow's own pools), as users run. Every child runs under the same
emulated budget, large enough that nothing runs out of memory.

    python -m bench.measure_vs_fit --quick          # 2 small models (a few minutes)
    python -m bench.measure_vs_fit --out out.json   # 4 models
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from helpers import run_isolated  # noqa: E402

from bench.machine import describe  # noqa: E402

console = Console()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2**20

# model, input side, batch, budget (MiB): sizes well inside the budget.
CASES = [
    ("MobileNetV2", 160, 32, 3072),
    ("ResNet50", 160, 16, 3072),
    ("EfficientNetB0", 160, 16, 3072),
    ("RetinaNet", 192, 4, 3072),
]
QUICK_CASES = [("MobileNetV2", 96, 16, 1024), ("EfficientNetB0", 96, 8, 1024)]

_BUILD = """
import sys
sys.path.insert(0, ROOT)
import memfit, keras
from memfit.workload.workload import Workload
name, side, batch, steps = NAME, SIDE, BATCH, STEPS
if name == "RetinaNet":
    from bench import models
    model, data = models.retinanet(), models.detection_samples()
else:
    model = getattr(keras.applications, name)(weights=None, input_shape=(side, side, 3),
                                              classes=10)
    model.compile("adam", "sparse_categorical_crossentropy")
    data = None
workload = Workload(model, data=data)
"""

MEASURE = (
    _BUILD
    + """
m = memfit.measure(model, batch, data=data, options=memfit.Options(repeats=steps))
emit({"peaks": m.peaks_bytes})
"""
)

FIT = (
    _BUILD
    + """
import tensorflow as tf
x, y = workload.batch(batch)
peaks = []
class Peaks(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        tf.config.experimental.reset_memory_stats("CPU:0")
    def on_train_batch_end(self, batch, logs=None):
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
dataset = workload.fit_dataset((x, y)).take(steps + 1)
del x, y
model.fit(dataset, epochs=1, verbose=0, callbacks=[Peaks()])
emit({"peaks": peaks})
"""
)


def _run(code: str, case: tuple[str, int, int, int], steps: int, growth: bool) -> list[int]:
    name, side, batch, budget = case
    filled = (
        code.replace("ROOT", repr(ROOT))
        .replace("NAME", repr(name))
        .replace("SIDE", str(side))
        .replace("BATCH", str(batch))
        .replace("STEPS", str(steps))
    )
    env = {"MEMFIT_MEMORY": f"{budget}MiB", "MEMFIT_MEMORY_GROWTH": "1" if growth else "0"}
    return [int(p) for p in run_isolated(filled, env=env, timeout=1800)["peaks"]]


def _spread(peaks: list[int]) -> float:
    return (max(peaks) - min(peaks)) / max(peaks)


def run_case(case: tuple[str, int, int, int], processes: int, steps: int) -> dict[str, Any]:
    """Measure one case: `processes` fresh processes of each kind, plus one under growth."""
    measured = [_run(MEASURE, case, steps, growth=False) for _ in range(processes)]
    fitted = [_run(FIT, case, steps, growth=False) for _ in range(processes)]
    grown = _run(MEASURE, case, steps, growth=True)
    measure_peak = statistics.median(max(p) for p in measured)
    fit_peak = statistics.median(max(p) for p in fitted)
    name, side, batch, budget = case
    return {
        "model": name,
        "input_side": side,
        "batch_size": batch,
        "budget_bytes": budget * MIB,
        "measure_peaks_bytes": measured,
        "fit_peaks_bytes": fitted,
        "measure_peak_bytes": int(measure_peak),
        "fit_peak_bytes": int(fit_peak),
        "measure_over_fit": measure_peak / fit_peak,
        "spread_one_region": statistics.median(_spread(p) for p in measured),
        "spread_memory_growth": _spread(grown),
        "growth_peaks_bytes": grown,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table; `--out` writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 small models")
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per side")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per process")
    parser.add_argument("--models", nargs="*", help="only these models")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    cases = QUICK_CASES if args.quick else CASES
    if args.models:
        cases = [c for c in cases if c[0] in args.models]
    started = time.perf_counter()
    results = []
    for case in cases:
        console.print(f"{case[0]} {case[1]} px, batch {case[2]} ...")
        results.append(run_case(case, args.processes, args.steps))
    table = Table(title="memfit.measure vs model.fit (medians over fresh processes)")
    for column in (
        "model",
        "batch",
        "measure",
        "model.fit",
        "measure / fit",
        "spread, one region",
        "spread, growth",
    ):
        table.add_column(column)
    for r in results:
        table.add_row(
            f"{r['model']} {r['input_side']} px",
            str(r["batch_size"]),
            f"{r['measure_peak_bytes'] / MIB:.0f} MiB",
            f"{r['fit_peak_bytes'] / MIB:.0f} MiB",
            f"{r['measure_over_fit']:.3f}",
            f"{r['spread_one_region']:.1%}",
            f"{r['spread_memory_growth']:.1%}",
        )
    console.print(table)
    seconds = time.perf_counter() - started
    console.print(
        f"{seconds / 60:.1f} min, {args.processes} processes per side, {args.steps} steps"
    )
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(
                {
                    "machine": describe("CPU BFC capped at the budget, one region"),
                    "processes": args.processes,
                    "steps": args.steps,
                    "results": results,
                    "seconds": seconds,
                },
                handle,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
