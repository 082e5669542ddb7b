"""Benchmark: memfit's recompute against the plain step and each `keras.RematScope` mode.

For each model, each variant runs in its own fresh child process under the same emulated
budget: `plain` (the model's step), `memfit sqrt` (`memfit.measure(..., recompute="sqrt")`:
segments at articulation points under `tf.recompute_grad`), and `remat <mode>` (the model
built inside `keras.RematScope(mode=...)`). Each child measures with `memfit.measure` (one
warm-up step, then `--repeats` steps; the highest peak, the median step time), the same peak
definition as every other memfit figure. The table gives the peak, its change against plain,
the step time as a ratio to plain (same machine, same run), and "not applicable: <why>" for
a variant that cannot build or run. Goal: memfit's recompute at least 30% lower
peak at no more than 1.4x the step time, and the estimate of the recompute step within 5% of
its measured peak (`estimate` column: plain and sqrt, estimated in the same child after the
measurement, under the same emulated budget).

    python -m bench.recompute --quick                 # 2 small models (a few minutes)
    python -m bench.recompute --out results.json      # the full table (long on a CPU)
    python -m bench.recompute --only ResNet50 --variants plain,sqrt
    python -m bench.recompute --only MobileNetV2 --size 160 --batch 32 --variants plain,sqrt
"""

from __future__ import annotations

import argparse
import json
import os
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

# model, input side, batch, budget (MiB): the full table.
CASES = [
    ("ResNet50", 224, 32, 12288),
    ("MobileNetV2", 224, 64, 12288),
    ("EfficientNetB0", 224, 32, 12288),
    ("RetinaNet", 512, 8, 12288),
]
QUICK_CASES = [("MobileNetV2", 96, 16, 2048), ("ResNet50", 64, 8, 2048)]
VARIANTS = ["plain", "sqrt", "remat full", "remat activations", "remat larger_than"]

CHILD = """
import sys, contextlib
sys.path.insert(0, ROOT)
import memfit, keras
name, side, batch, repeats, variant = NAME, SIDE, BATCH, REPEATS, VARIANT
mode = variant.split(" ", 1)[1] if variant.startswith("remat ") else None
try:
    with keras.RematScope(mode=mode) if mode else contextlib.nullcontext():
        if name == "RetinaNet":
            from memfit import zoo
            model, data = zoo.retinanet(side), zoo.detection_samples(2 * batch, side)
        else:
            model = getattr(keras.applications, name)(
                weights=None, input_shape=(side, side, 3), classes=10
            )
            model.compile("adam", "sparse_categorical_crossentropy")
            data = None
    recompute = "sqrt" if variant == "sqrt" else None
    report = str(memfit.recompute(model, "sqrt").report) if recompute else None
    m = memfit.measure(
        model, batch, data=data, recompute=recompute, options=memfit.Options(repeats=repeats)
    )
    estimated = high = None
    if ESTIMATE and variant in ("plain", "sqrt"):
        from memfit.estimation import estimate_workload
        from memfit.estimation.bounds import SAMPLES
        from memfit.workload.workload import Workload
        workload = Workload(model, data=data)
        # As `memfit estimate` does: the likely peak with the high bound's samples.
        est = estimate_workload(workload, batch, recompute=recompute, samples=SAMPLES)
        estimated, high = est.peak_bytes, est.high_bytes
    emit({"peak": m.peak_bytes, "resident": m.resident_bytes, "oom": m.oom,
          "step_seconds": m.step_seconds, "peaks": m.peaks_bytes, "report": report,
          "estimate": estimated, "estimate_high": high})
except Exception as exc:
    from memfit.estimation.what_ifs import not_applicable
    emit({"error": not_applicable(exc)})
"""


def run_variant(
    case: tuple[str, int, int, int], variant: str, repeats: int, estimate: bool = True
) -> dict[str, Any]:
    """One variant of one model in a fresh child process (plain and sqrt also estimated,
    after the measurement, in the same child)."""
    name, side, batch, budget = case
    code = (
        CHILD.replace("ROOT", repr(ROOT))
        .replace("NAME", repr(name))
        .replace("SIDE", str(side))
        .replace("BATCH", str(batch))
        .replace("REPEATS", str(repeats))
        .replace("VARIANT", repr(variant))
        .replace("ESTIMATE", repr(estimate))
    )
    started = time.perf_counter()
    env = {"MEMFIT_MEMORY": f"{budget}MiB"}
    try:
        result = run_isolated(code, env=env, timeout=3600)
    except AssertionError as exc:  # the child died (a crash, not an error it could report)
        result = {"error": f"child failed: {str(exc).splitlines()[0]}"}
    result["seconds"] = time.perf_counter() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small models")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--repeats", type=int, default=2, help="measured steps per process")
    parser.add_argument("--only", help="comma-separated model names to run")
    parser.add_argument("--variants", help="comma-separated variants (plain,sqrt,remat full,...)")
    parser.add_argument(
        "--no-estimate", action="store_true", help="skip the estimate of plain and sqrt"
    )
    parser.add_argument("--size", type=int, help="input side instead of the table's")
    parser.add_argument("--batch", type=int, help="batch size instead of the table's")
    args = parser.parse_args()
    cases = QUICK_CASES if args.quick else CASES
    if args.only:
        cases = [c for c in cases if c[0] in args.only.split(",")]
    cases = [
        (name, args.size or side, args.batch or batch, budget)
        for name, side, batch, budget in cases
    ]
    variants = VARIANTS
    if args.variants:
        variants = [
            v if v in ("plain", "sqrt") else f"remat {v.removeprefix('remat ')}"
            for v in args.variants.split(",")
        ]
    rows = []
    for case in cases:
        for variant in variants:
            console.print(f"{case[0]} {case[1]}px batch {case[2]}: {variant} ...")
            result = run_variant(case, variant, args.repeats, not args.no_estimate)
            rows.append(
                {
                    "model": case[0],
                    "side": case[1],
                    "batch": case[2],
                    "budget_bytes": case[3] * MIB,
                    "variant": variant,
                    **result,
                }
            )
    table = Table(title="memfit recompute vs plain vs keras.RematScope (peak, step time)")
    columns = ("model", "variant", "peak", "vs plain", "step s", "time x", "estimate", "note")
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("model", "variant", "note") else "right"
        )
    for row in rows:
        plain = next(
            (
                r
                for r in rows
                if r["model"] == row["model"] and r["variant"] == "plain" and r.get("peak")
            ),
            None,
        )
        if row.get("error") or row.get("oom"):
            note = row.get("error") or "out of memory"
            table.add_row(
                f"{row['model']} {row['side']} b{row['batch']}",
                row["variant"],
                "-",
                "-",
                "-",
                "-",
                "-",
                note[:70],
            )
            continue
        change = ratio = "-"
        if plain:
            row["peak_change"] = row["peak"] / plain["peak"] - 1
            row["time_ratio"] = row["step_seconds"] / plain["step_seconds"]
            change, ratio = f"{row['peak_change']:+.0%}", f"{row['time_ratio']:.2f}x"
        estimated = "-"
        if row.get("estimate"):
            row["estimate_error"] = row["estimate"] / row["peak"] - 1
            estimated = f"{row['estimate'] / MIB:.0f} MiB ({row['estimate_error']:+.1%})"
            if row.get("estimate_high"):
                estimated += f", up to {row['estimate_high'] / MIB:.0f}"
        table.add_row(
            f"{row['model']} {row['side']} b{row['batch']}",
            row["variant"],
            f"{row['peak'] / MIB:.0f} MiB",
            change,
            f"{row['step_seconds']:.2f}",
            ratio,
            estimated,
            "",
        )
    console.print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": describe(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
