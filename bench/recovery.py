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
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.machine import describe
from bench.trials import ROOT

console = Console(stderr=True)

RECOVERY_BUDGET = "600MiB"
CONTROL_BUDGET = "4GiB"  # never runs out: the control run of the recovery benchmark


def recovery_child(
    small: int, big: int, batch: int, steps: int, epochs: int, micro_batches: int = 1
) -> dict[str, Any]:
    """Child side: memfit.fit over a small-image shard then a large-image shard."""
    import keras
    import numpy as np
    import tensorflow as tf

    import memfit

    keras.utils.set_random_seed(0)
    # Any resolution: the backbone without its fixed-size top, pooled, then a 10-way head.
    backbone = keras.applications.MobileNetV2(
        weights=None, include_top=False, pooling="avg", input_shape=(None, None, 3)
    )
    model = keras.Sequential([backbone, keras.layers.Dense(10, activation="softmax")])
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

    history = memfit.fit(
        model,
        dataset,
        epochs=epochs,
        verbose=0,
        callbacks=[Clock()],
        micro_batches=micro_batches,
    )
    return {"times": times, "summary": history.memfit.to_dict(), "steps_per_shard": steps}


def bench_recovery() -> dict[str, Any]:
    """The OOM run, and a control run of the same job with memory to spare.

    A new input shape costs a trace and, at its first call, TensorFlow's graph optimisation
    and kernel set-up; the control run's first large-image step minus its steady step time
    is that cost ("retrace"), which any new input shape pays, OOM or not. Recovery time is
    from the OOM being raised to the next completed step (memfit's own record); the target is
    at most two steady step-times plus that retrace. The extra time the OOM cost in all is
    the recovery run's first large-image step minus the control run's (it includes the failed
    attempt and the allocator's own wait before it reports the OOM).
    """
    from memfit.budget.budget import Budget
    from memfit.process.runner import run_in_child

    small, big, batch, steps, epochs = 96, 192, 16, 4, 2
    console.rule(f"Recovery: MobileNetV2, {small}px then {big}px shards, batch {batch}")
    args = {"small": small, "big": big, "batch": batch, "steps": steps, "epochs": epochs}
    result = run_in_child(
        "bench.recovery:recovery_child",
        args,
        budget=Budget.from_size(RECOVERY_BUDGET),
        env={"PYTHONPATH": ROOT},
        oom_grace=1e9,  # OOMs are expected here and recovered from
    )
    recoveries = result["summary"]["recoveries"]
    control = run_in_child(
        "bench.recovery:recovery_child",
        args,
        budget=Budget.from_size(CONTROL_BUDGET),
        env={"PYTHONPATH": ROOT},
    )
    per_epoch = 2 * steps

    def big_steps(times: list[float]) -> list[float]:
        return [times[e * per_epoch + steps + i] for e in range(epochs) for i in range(steps)]

    times = [t["seconds"] for t in result["times"]]
    control_times = [t["seconds"] for t in control["times"]]
    # Steady step at the large shape: every large-shard step but the first, in both runs.
    steady = statistics.median(big_steps(times)[1:] + big_steps(control_times)[1:])
    retrace = big_steps(control_times)[0] - statistics.median(big_steps(control_times)[1:])
    extra = big_steps(times)[0] - big_steps(control_times)[0]
    rows = []
    for r in recoveries:
        overhead = r["seconds"] - retrace
        rows.append(
            {
                **r,
                "steady_step_seconds": steady,
                "retrace_seconds": retrace,
                "in_step_times": r["seconds"] / steady,
                "in_step_times_without_retrace": overhead / steady,
                "within_target": r["seconds"] <= 2 * steady + retrace,
                "first_large_step_extra_seconds": extra,
            }
        )
    for row in rows:
        console.print(
            f"  update {row['update'] + 1}: K {row['old_micro_batches']} -> "
            f"{row['new_micro_batches']}, {row['seconds']:.2f} s from the OOM to the next "
            f"completed step; retrace (trace + first call, control run) {retrace:.2f} s, of "
            f"which memfit's trace {row['trace_seconds']:.2f} s; steady step {steady:.2f} s "
            f"-> {row['in_step_times_without_retrace']:.2f} step-times plus retrace; the OOM "
            f"cost {extra:.2f} s in all against the control run"
        )
    return {
        "budget": RECOVERY_BUDGET,
        "control_budget": CONTROL_BUDGET,
        "recoveries": rows,
        "updates": result["summary"]["updates"],
        "control_updates": control["summary"]["updates"],
        "micro_batches": result["summary"]["micro_batches"],
        "step_seconds": times,
        "control_step_seconds": control_times,
    }


@dataclass(frozen=True)
class PlanCase:
    spec: str
    batch: int
    budget: str
    input_shape: list[int] | None = None
    data: str | None = None


PLAN_CASES = {
    # ResNet50 at 96 px, batch 32 peaks near 845 MiB unsplit (measured), so 800 MiB needs a split.
    "ResNet50": PlanCase("keras.applications.ResNet50", 32, "800MiB", [96, 96, 3]),
    "RetinaNet": PlanCase(
        "bench.models:retinanet", 16, "900MiB", data="bench.models:detection_samples"
    ),
}


def bench_planner(
    name: str, case: PlanCase, precisions: list[str], remats: list[str | None], ks: list[int]
) -> dict[str, Any]:
    import memfit
    from memfit.measuring.isolate import measure_in_child
    from memfit.planning import DEFAULT_MARGIN
    from memfit.workload.spec import WorkloadSpec

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
        budget=budget,
        precisions=precisions,
        remat_modes=remats,
        input_shape=case.input_shape,
        data=case.data,
        progress=show,
    )
    plan_seconds = time.perf_counter() - start
    grid = []
    for precision, remat, k in itertools.product(precisions, remats, ks):
        workload = WorkloadSpec(
            case.spec,
            input_shape=case.input_shape,
            data=case.data,
            precision=None if precision == "float32" else precision,
            remat=remat,
        )
        m = measure_in_child(workload, case.batch, repeats=3, budget=budget, micro_batches=k)
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

    report: dict[str, Any] = {
        "machine": describe("CPU BFC capped at the budget, oneDNN off (memfit emulation)")
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
    if "recovery" in report:
        rec = Table(title="Recovery from an OOM mid-training (MobileNetV2, 96 px then 192 px)")
        for column in ("update", "K", "OOM -> next step", "retrace", "steady step", "target"):
            rec.add_column(column)
        for row in report["recovery"]["recoveries"]:
            rec.add_row(
                str(row["update"] + 1),
                f"{row['old_micro_batches']} -> {row['new_micro_batches']}",
                f"{row['seconds']:.2f} s",
                f"{row['retrace_seconds']:.2f} s",
                f"{row['steady_step_seconds']:.2f} s",
                f"{row['in_step_times_without_retrace']:.2f} step-times + retrace "
                + ("(<= 2: met)" if row["within_target"] else "(> 2: not met)"),
            )
        Console().print(rec)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=2)
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
