"""Benchmark: memfit's batch search against Lightning's and Accelerate's, on real Keras models.

Every method searches the same model under the same emulated budget, one after the other in
one run, each as its tool runs it, and only the search is timed:

- memfit: `find_batch_size(..., margin=0, soak_steps=0)` as `memfit batch --soak-steps 0` runs
  it — every trial in one child process on one relaxed trace (a spare child takes over after an
  OOM), one measured step per trial (and a warm-up in a fresh process), an OOM answered when
  the step stalls in the allocator's retry;
- memfit_soak: `memfit batch` as it runs by default, with its soak (the size found trains 8 more
  steps before it is the answer; compared with the sustained maximum below);
- memfit_in_process: the same search given the model loaded in the search's own process
  (`--in-process`, the Python API's default: the trials run on a saved copy in a child);
- Lightning `power` and `binsearch` (init 2, 3 `train_on_batch` steps per trial, see
  bench/baselines/) and Accelerate's back-off (start 128, x0.9 per OOM, 3 steps per attempt),
  each in one process as the originals run: the model built once, an OOM caught and the next
  size tried; each search in a fresh child process of its own, so the budget applies.

The ground truth is the largest size that trains 3 steps without OOM in a fresh process:
the bracket the methods saw (largest size that ran, smallest above it that failed),
bisected with 1-size resolution, the final pair (runs, size+1 fails) confirmed by fresh runs.
The sustained maximum is the largest size that trains `--sustain-steps` steps (default 12) in a
fresh process: near the limit a step's peak rises over the first steps, and a size that trains
3 steps can run out of memory at the 4th. Searched down from the 3-step truth (sizes 1, 2, 4, ...
below it until one trains, then bisected).

    python -m bench.batch_search            # all four models (about an hour on 2 cores)
    python -m bench.batch_search --quick    # MobileNetV2, no Accelerate (under 10 minutes)
    python -m bench.batch_search --models ResNet50 --out out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.machine import describe
from bench.trials import ROOT, ChildTrials
from memfit.errors import MeasurementError
from memfit.search import DEFAULT_SOAK_STEPS

console = Console(stderr=True)


@dataclass(frozen=True)
class Case:
    """A model under a budget whose true limit is above 16."""

    spec: str
    budget: str
    input_shape: list[int] | None = None
    data: str | None = None


CASES = {
    "MobileNetV2": Case("keras.applications.MobileNetV2", "2.3GiB", [224, 224, 3]),
    "ResNet50": Case("keras.applications.ResNet50", "3.25GiB", [224, 224, 3]),
    "EfficientNetB0": Case("keras.applications.EfficientNetB0", "3GiB", [224, 224, 3]),
    "RetinaNet": Case("bench.models:retinanet", "1.5GiB", data="bench.models:detection_samples"),
}
QUICK = ["MobileNetV2"]
# --quick leaves out Accelerate's back-off: from 128 it spends a dozen OOM trials.
QUICK_METHODS = ["memfit", "lightning_power", "lightning_binsearch"]
STEPS = 3
# memfit answers as soon as the bracket closes, without its soak (`--soak-steps 0`): the
# ground truth and the baselines are three-step trials, and a soak answers the (lower) size
# that still fits after more steps of training.
SOAK_STEPS = 0
SUSTAIN_STEPS = 12
METHODS = [
    "memfit",
    "memfit_soak",
    "memfit_in_process",
    "lightning_power",
    "lightning_binsearch",
    "accelerate",
]
SEARCH_TIMEOUT = 3600.0


def _progress(method: str) -> Any:
    def report(size: int, oom: bool, seconds: float) -> None:
        outcome = "[red]OOM[/red]" if oom else "[green]runs[/green]"
        console.print(f"    {method:<20} batch {size:>4}: {outcome}  ({seconds:.1f} s)")

    return report


def run_isolated_memfit(
    case: Case, budget: Any, seen: dict[int, list[bool]], soak_steps: int = SOAK_STEPS
) -> dict[str, Any]:
    """memfit's default: the trials in a child process (the CLI without --in-process)."""
    import memfit

    report = _progress("memfit" if not soak_steps else "memfit_soak")

    def on_trial(trial: memfit.Trial) -> None:
        seen.setdefault(trial.batch_size, []).append(trial.fits)
        report(trial.batch_size, not trial.fits, trial.seconds)

    start = time.perf_counter()
    result = memfit.find_batch_size(
        case.spec,
        budget,
        margin=0.0,
        soak_steps=soak_steps,
        isolated=True,
        input_shape=case.input_shape,
        data=case.data,
        on_trial=on_trial,
    )
    return {
        "found": result.batch_size,
        "trials": [
            {"batch_size": t.batch_size, "oom": not t.fits, "seconds": t.seconds}
            for t in result.trials
        ],
        "steps": sum(t.steps for t in result.trials),
        "seconds": time.perf_counter() - start,
    }


def run_in_process(
    method: str, case: Case, budget: Any, seen: dict[int, list[bool]]
) -> dict[str, Any]:
    """One whole search in one fresh child process (see `bench.trials.search_child`)."""
    from memfit.isolate import run_in_child

    start = time.perf_counter()
    result = run_in_child(
        "bench.trials:search_child",
        {
            "method": method,
            "spec": case.spec,
            "steps": STEPS,
            "soak_steps": SOAK_STEPS,
            "input_shape": case.input_shape,
            "data": case.data,
        },
        budget=budget,
        env={"PYTHONPATH": ROOT},
        timeout=SEARCH_TIMEOUT,
        oom_grace=SEARCH_TIMEOUT,  # OOMs are part of the search; the tools go on after them
    )
    if result.get("hung_after_oom"):
        raise RuntimeError(f"{method}: the search process did not finish")
    report = _progress(method)
    for trial in result["trials"]:
        seen.setdefault(trial["batch_size"], []).append(not trial["oom"])
        report(trial["batch_size"], trial["oom"], trial["seconds"])
    result["process_seconds"] = time.perf_counter() - start
    return result


def ground_truth(case: Case, budget: Any, seen: dict[int, list[bool]]) -> dict[str, Any]:
    """Largest size that trains `STEPS` steps: known outcomes, bisection, then confirmation."""
    runs = ChildTrials(
        case.spec, budget, STEPS, case.input_shape, case.data, seen, _progress("ground truth")
    )
    confirmed: dict[int, bool] = {}

    def outcome(size: int, fresh: bool = False) -> bool:
        if fresh:
            confirmed[size] = runs(size)
            return confirmed[size]
        if size in confirmed:
            return confirmed[size]
        observed = seen.get(size)
        if observed and (all(observed) or not any(observed)):
            return observed[0]
        return outcome(size, fresh=True)

    ran = [s for s, obs in seen.items() if all(obs)]
    lo = max(ran, default=0)
    failed = [s for s, obs in seen.items() if not any(obs) and s > lo]
    hi = min(failed, default=None)
    # Sizes seen both running and failing, or failing below one that ran: allocator noise.
    anomalies = sorted(
        s for s, obs in seen.items() if len(set(obs)) > 1 or (not any(obs) and s < lo)
    )
    while hi is None:
        probe = max(1, lo * 2)
        if outcome(probe):
            lo = probe
        else:
            hi = probe
    for _ in range(64):
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if outcome(mid):
                lo = mid
            else:
                hi = mid
        # Confirm the pair with fresh runs; a contradiction reopens the bracket.
        lo_ok = lo == 0 or (confirmed[lo] if lo in confirmed else outcome(lo, fresh=True))
        hi_ok = not (confirmed[hi] if hi in confirmed else outcome(hi, fresh=True))
        if lo_ok and hi_ok:
            break
        if not lo_ok:
            hi, lo = lo, max([s for s, ok in confirmed.items() if ok and s < lo], default=0)
        else:
            lo, hi = hi, hi + 1
            while outcome(hi):
                lo, hi = hi, hi * 2
    return {"true_max": lo, "anomalies": anomalies, **runs.log.to_dict()}


def sustained_truth(case: Case, budget: Any, start: int, steps: int) -> dict[str, Any]:
    """Largest size that trains `steps` steps in a fresh process, searched down from `start`
    (the 3-step truth): `start`, then 1, 2, 4, ... below it until one trains, then bisected."""
    runs = ChildTrials(
        case.spec, budget, steps, case.input_shape, case.data, {}, _progress("sustained")
    )
    lo, hi, drop = 0, start, 1
    if start >= 1 and runs(start):
        lo = hi = start
    while lo < hi and hi - drop >= 1:
        if runs(hi - drop):
            lo = hi - drop
            break
        hi, drop = hi - drop, drop * 2
    while lo and hi - lo > 1:
        mid = (lo + hi) // 2
        if runs(mid):
            lo = mid
        else:
            hi = mid
    return {"sustained_max": lo, "steps": steps, **runs.log.to_dict()}


def bench_case(
    name: str, case: Case, methods: list[str], sustain_steps: int = SUSTAIN_STEPS
) -> dict[str, Any]:
    from memfit.budget import Budget

    budget = Budget.from_size(case.budget)
    console.rule(f"{name} under {case.budget}")
    seen: dict[int, list[bool]] = {}
    results: dict[str, Any] = {}
    for method in methods:
        console.print(f"  [bold]{method}[/bold]")
        if method == "memfit":
            results[method] = run_isolated_memfit(case, budget, seen)
            continue
        if method == "memfit_soak":
            # Its soaks are longer trials than the 3-step truth's: kept out of what it reuses.
            results[method] = run_isolated_memfit(case, budget, {}, DEFAULT_SOAK_STEPS)
            continue
        started = time.perf_counter()
        try:
            results[method] = run_in_process(method, case, budget, seen)
        except MeasurementError as exc:
            # An in-process search can break TensorFlow itself: after OOMs, TF 2.21 once
            # failed every later step with AlreadyExistsError (a grappler TemporaryVariable
            # left in the per-step container). Recorded, and the other methods go on.
            first = str(exc).splitlines()[0][:200]
            console.print(f"    [red]{method} failed[/red]: {first}")
            results[method] = {
                "found": None,
                "failed": first,
                "trials": [],
                "steps": 0,
                "seconds": time.perf_counter() - started,
            }
    console.print("  [bold]ground truth[/bold]")
    truth = ground_truth(case, budget, seen)
    true_max = truth["true_max"]
    sustained = None
    if sustain_steps:
        console.print(f"  [bold]sustained maximum ({sustain_steps} steps)[/bold]")
        sustained = sustained_truth(case, budget, true_max, sustain_steps)
    sustained_max = sustained["sustained_max"] if sustained else None
    for result in results.values():
        found = result["found"]
        result["share_of_true_max"] = found / true_max if true_max and found else None
        result["share_of_sustained_max"] = (
            found / sustained_max if sustained_max and found else None
        )
        result["wall_ratio_memfit_to_this"] = (
            results["memfit"]["seconds"] / result["seconds"]
            if "memfit" in results and found is not None
            else None
        )
    return {
        "spec": case.spec,
        "input_shape": case.input_shape,
        "budget": case.budget,
        "true_max": true_max,
        "ground_truth": truth,
        "sustained_max": sustained_max,
        "sustained": sustained,
        "methods": results,
    }


def table(report: dict[str, Any]) -> Table:
    out = Table(title="Largest batch: memfit vs Lightning and Accelerate (margin 0)")
    for column in (
        "model",
        "true max",
        "sustained",
        "method",
        "found",
        "found/true",
        "found/sustained",
        "trials",
        "steps",
        "wall s",
        "memfit wall / this",
    ):
        out.add_column(column, justify="left" if column in ("model", "method") else "right")
    for name, case in report["models"].items():
        for i, (method, r) in enumerate(case["methods"].items()):
            ratio = r["wall_ratio_memfit_to_this"]
            out.add_row(
                name if i == 0 else "",
                str(case["true_max"]) if i == 0 else "",
                str(case.get("sustained_max")) if i == 0 else "",
                method,
                str(r["found"]) if r["found"] is not None else "failed",
                f"{r['share_of_true_max']:.0%}" if r["share_of_true_max"] is not None else "-",
                f"{r['share_of_sustained_max']:.0%}"
                if r.get("share_of_sustained_max") is not None
                else "-",
                str(len(r["trials"])),
                str(r["steps"]),
                f"{r['seconds']:.0f}",
                f"{ratio:.0%}" if ratio is not None and method != "memfit" else "",
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="MobileNetV2, without Accelerate (< 10 min)"
    )
    parser.add_argument("--models", nargs="+", choices=sorted(CASES), help="models to run")
    parser.add_argument("--methods", nargs="+", choices=METHODS, help="methods to run")
    parser.add_argument(
        "--sustain-steps",
        type=int,
        default=None,
        metavar="N",
        help=f"steps the sustained maximum trains (default {SUSTAIN_STEPS}, with --quick 0: "
        "not measured)",
    )
    parser.add_argument("--out", metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    # The children import bench.models (the RetinaNet) from the repository root.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    names = args.models or (QUICK if args.quick else list(CASES))
    chosen = args.methods or (QUICK_METHODS if args.quick else METHODS)
    methods = ["memfit", *[m for m in chosen if m != "memfit"]]
    sustain_steps = args.sustain_steps
    if sustain_steps is None:
        sustain_steps = 0 if args.quick else SUSTAIN_STEPS
    started = time.perf_counter()
    report: dict[str, Any] = {"models": {}}

    report["machine"] = describe("CPU BFC capped at the budget, oneDNN off (memfit emulation)")
    for name in names:
        report["models"][name] = bench_case(name, CASES[name], methods, sustain_steps)
        report["seconds"] = time.perf_counter() - started
        if args.out:  # after each model, so a long run keeps what it has measured
            with open(args.out, "w") as handle:
                json.dump(report, handle, indent=2)
    Console(width=160).print(table(report))
    console.print(f"total {report['seconds'] / 60:.1f} min")
    if args.out:
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
