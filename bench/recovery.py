"""Benchmark: how fast memfit.fit recovers from an OOM, and how good the planner's choice is.

1. Recovery: MobileNetV2 trains on a dataset whose second shard holds images at twice the
   resolution, under an emulated budget where that shard's batch does not fit unsplit.
   `memfit.fit` recovers; the figure is the time from the OOM to the next completed step, in
   steady step-times at that shape (after the recovery), with the retrace shown apart.
2. Planner: for a target batch that does not fit unsplit, `memfit.plan`'s choice against the
   best of an exhaustive grid (K x precision x recompute), every grid point measured the same
   way in the same run: the chosen configuration's grid time over the grid's best time.

    python -m bench.recovery               # ResNet50 and the RetinaNet
    python -m bench.recovery --quick       # ResNet50, a smaller grid (~10 minutes)
    python -m bench.recovery --out results.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.trials import ROOT

console = Console(stderr=True)

RECOVERY_BUDGET = "600MiB"


def recovery_child(small: int, big: int, batch: int, steps: int, epochs: int) -> dict[str, Any]:
    """Child side: memfit.fit over a small-image shard then a large-image shard."""
    import keras
    import numpy as np
    import tensorflow as tf

    import memfit

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(None, None, 3), classes=10)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    shards = []
    for size in (small, big):
        x = rng.uniform(0, 1, (batch * steps, size, size, 3)).astype("float32")
        y = rng.integers(0, 10, batch * steps)
        shards.append(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))
    dataset = shards[0].concatenate(shards[1])
    times: list[dict[str, Any]] = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            times.append({"batch": batch, "seconds": time.perf_counter() - self.start})

    history = memfit.fit(model, dataset, epochs=epochs, verbose=0, callbacks=[Clock()])
    return {"times": times, "summary": history.memfit.to_dict(), "steps_per_shard": steps}


def bench_recovery() -> dict[str, Any]:
    from memfit.budget import Budget
    from memfit.isolate import run_in_child

    small, big, batch, steps, epochs = 96, 192, 16, 4, 2
    console.rule(f"Recovery: MobileNetV2, {small}px then {big}px shards, batch {batch}")
    result = run_in_child(
        "bench.recovery:recovery_child",
        {"small": small, "big": big, "batch": batch, "steps": steps, "epochs": epochs},
        budget=Budget.from_size(RECOVERY_BUDGET),
        env={"PYTHONPATH": ROOT},
        oom_grace=1e9,  # OOMs are expected here and recovered from
    )
    recoveries = result["summary"]["recoveries"]
    times = [t["seconds"] for t in result["times"]]
    per_epoch = 2 * steps
    # Steady step at the large shape: the large-shard steps after the first epoch's recovery.
    big_steps = [times[e * per_epoch + steps + i] for e in range(epochs) for i in range(steps)]
    steady = statistics.median(big_steps[1:])
    rows = []
    for r in recoveries:
        rows.append(
            {
                **r,
                "steady_step_seconds": steady,
                "in_step_times": r["seconds"] / steady,
                "in_step_times_without_retrace": (r["seconds"] - r["trace_seconds"]) / steady,
            }
        )
    for row in rows:
        console.print(
            f"  update {row['update'] + 1}: K {row['old_micro_batches']} -> "
            f"{row['new_micro_batches']}, {row['seconds']:.2f} s to the next completed step "
            f"(retrace {row['trace_seconds']:.2f} s); steady step {steady:.2f} s -> "
            f"{row['in_step_times_without_retrace']:.2f} step-times plus retrace"
        )
    return {
        "budget": RECOVERY_BUDGET,
        "recoveries": rows,
        "updates": result["summary"]["updates"],
        "micro_batches": result["summary"]["micro_batches"],
        "step_seconds": times,
    }


@dataclass(frozen=True)
class PlanCase:
    spec: str
    batch: int
    budget: str
    input_shape: list[int] | None = None
    data: str | None = None


PLAN_CASES = {
    "ResNet50": PlanCase("keras.applications.ResNet50", 32, "1.5GiB", [96, 96, 3]),
    "RetinaNet": PlanCase(
        "bench.models:retinanet", 16, "900MiB", data="bench.models:detection_samples"
    ),
}


def bench_planner(
    name: str, case: PlanCase, precisions: list[str], remats: list[str | None], ks: list[int]
) -> dict[str, Any]:
    import memfit
    from memfit.isolate import measure_in_child
    from memfit.plan import DEFAULT_MARGIN

    console.rule(f"Planner: {name}, batch {case.batch} under {case.budget}")
    budget = memfit.Budget.from_size(case.budget)
    limit = int(budget.usable_bytes * (1 - DEFAULT_MARGIN))

    def show(c: Any) -> None:
        console.print(
            f"    plan  {c.precision:<15} remat {str(c.remat):<12} K={c.micro_batches:<3} "
            f"{'fits' if c.fits else 'OOM' if c.oom else 'no'}  "
            + (f"{c.step_seconds:.2f} s" if c.step_seconds else "")
        )

    start = time.perf_counter()
    chosen = memfit.plan(
        case.spec,
        case.batch,
        budget,
        precisions=precisions,
        remat_modes=remats,
        input_shape=case.input_shape,
        data=case.data,
        on_candidate=show,
    )
    plan_seconds = time.perf_counter() - start
    grid = []
    for precision, remat, k in itertools.product(precisions, remats, ks):
        m = measure_in_child(
            case.spec,
            case.batch,
            data=case.data,
            input_shape=case.input_shape,
            optimizer=None,
            loss=None,
            repeats=1,
            budget=budget,
            micro_batches=k,
            precision=None if precision == "float32" else precision,
            remat=remat,
        )
        fits = not m.oom and m.peak_bytes is not None and m.peak_bytes <= limit
        grid.append(
            {
                "precision": precision,
                "remat": remat,
                "micro_batches": k,
                "peak_bytes": m.peak_bytes,
                "step_seconds": m.step_seconds,
                "fits": fits,
            }
        )
        console.print(
            f"    grid  {precision:<15} remat {str(remat):<12} K={k:<3} "
            f"{'fits' if fits else 'OOM' if m.oom else 'over'}  "
            + (f"{m.step_seconds:.2f} s" if m.step_seconds else "")
        )
    fitting = [g for g in grid if g["fits"]]
    best = min(fitting, key=lambda g: g["step_seconds"]) if fitting else None
    same = [
        g
        for g in grid
        if (g["precision"], g["remat"], g["micro_batches"])
        == (chosen.precision, chosen.remat, chosen.micro_batches)
    ]
    chosen_grid_seconds = same[0]["step_seconds"] if same else None
    ratio = (
        chosen_grid_seconds / best["step_seconds"]
        if best and chosen_grid_seconds is not None
        else None
    )
    return {
        "spec": case.spec,
        "batch": case.batch,
        "budget": case.budget,
        "plan": chosen.to_dict(),
        "plan_seconds": plan_seconds,
        "grid": grid,
        "grid_best": best,
        "chosen_in_grid_seconds": chosen_grid_seconds,
        "chosen_over_best": ratio,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="ResNet50, a smaller grid")
    parser.add_argument("--skip-recovery", action="store_true")
    parser.add_argument("--out", metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    from memfit.backend import tf as tfb

    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "allocator": "CPU BFC capped at the budget, oneDNN off (memfit emulation)",
            **tfb.versions(),
        }
    }
    started = time.perf_counter()
    if not args.skip_recovery:
        report["recovery"] = bench_recovery()
    if args.quick:
        precisions, remats, ks = ["float32", "mixed_bfloat16"], [None], [1, 2, 4]
        names = ["ResNet50"]
    else:
        precisions = ["float32", "mixed_float16", "mixed_bfloat16"]
        remats, ks, names = [None, "larger_than"], [1, 2, 4, 8], list(PLAN_CASES)
    report["planner"] = {}
    for name in names:
        report["planner"][name] = bench_planner(name, PLAN_CASES[name], precisions, remats, ks)
        if args.out:
            with open(args.out, "w") as handle:
                json.dump(report, handle, indent=2)
    report["seconds"] = time.perf_counter() - started
    table = Table(title="Planner's choice vs the grid's best (time per effective batch)")
    for column in (
        "model",
        "batch",
        "budget",
        "planner chose",
        "its time",
        "grid best",
        "best time",
        "chosen / best",
    ):
        table.add_column(column)
    for name, r in report["planner"].items():
        p, b = r["plan"], r["grid_best"]
        table.add_row(
            name,
            str(r["batch"]),
            r["budget"],
            f"{p['precision']}, remat {p['remat']}, K={p['accumulation_steps']}",
            f"{r['chosen_in_grid_seconds']:.2f} s" if r["chosen_in_grid_seconds"] else "-",
            f"{b['precision']}, remat {b['remat']}, K={b['micro_batches']}" if b else "-",
            f"{b['step_seconds']:.2f} s" if b else "-",
            f"{r['chosen_over_best']:.3f}" if r["chosen_over_best"] else "-",
        )
    Console().print(table)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=2)
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
