"""Benchmark: memfit's batch search against Lightning's and Accelerate's, on real Keras models.

Every method searches the same model under the same emulated budget, one after the other in
one run, each with the defaults its users get, and only the search is timed:

- memfit: `memfit batch` as it runs by default (its default margin and soak; the flags are
  parsed by memfit's own CLI, see `memfit_options`), trials in a child process;
- memfit_no_soak: `memfit batch --soak-steps 0` (answers as soon as the bracket closes);
- memfit_in_process: `--soak-steps 0` with the model loaded in the search's own process
  (`--in-process`, the Python API's default: the trials run on a saved copy in a child);
- Lightning 2.6.5 `power` and `binsearch` (init 2, 3 steps per trial, binsearch's answer
  reduced by its default 5% margin, `max_val` 8192; see bench/baselines/lightning.py) and
  Accelerate's back-off (start 128, x0.9 per OOM, 3 steps per attempt), each in one process
  as the originals run: the model built once, an OOM caught and the next size tried; each
  search in a fresh child process of its own, so the budget applies.

**The check** ("trains?"): every answer is trained for `CHECK_STEPS` (20) steps of plain
`model.fit` in a fresh child process under the same budget (`bench.trials.fit_steps`); an
OOM, a SIGSEGV past the cap or a hang in the allocator's retry means it does not train.

**The 20-step max** (the ground truth): the largest size that passes that same check in every
fresh process it ran in (at least twice; once with --quick), with the size above it failing:
seeded with the answers' checks, galloped up or down from them, bisected to 1 size, the
largest confirmed by a second fresh run. Each answer is reported as a share of it, and each
method's search time as a ratio to Lightning binsearch's. The **3-step max** (the largest
size that trains 3 steps of Keras' train function on the batch, as Lightning's trials do) is
kept as a second column (`--three-step`; on by default, off with --quick).

    python -m bench.batch_search            # four models (about 2 hours on 2 cores)
    python -m bench.batch_search --quick    # MobileNetV2 96x96, no Accelerate (~10 min)
    python -m bench.batch_search --models ResNet50 --out out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.baselines.lightning import VERSION as LIGHTNING_VERSION
from bench.machine import describe
from bench.trials import FIT_STEPS, ROOT, ChildTrials
from memfit.checks import Options
from memfit.errors import MeasurementError

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
# --quick: a small image, so that every child (and the 20-step checks) takes seconds.
QUICK_CASES = {"MobileNetV2-96": Case("keras.applications.MobileNetV2", "500MiB", [96, 96, 3])}
# --quick leaves out Accelerate's back-off: from 128 it spends a dozen OOM trials.
QUICK_METHODS = ["memfit", "memfit_no_soak", "lightning_power", "lightning_binsearch"]
STEPS = 3
CHECK_STEPS = 20
# memfit's variants as a user types them; parsed by memfit's CLI (`memfit_options`).
MEMFIT_FLAGS = {
    "memfit": [],
    "memfit_no_soak": ["--soak-steps", "0"],
    "memfit_in_process": ["--soak-steps", "0", "--in-process"],
}
METHODS = [
    "memfit",
    "memfit_no_soak",
    "memfit_in_process",
    "lightning_power",
    "lightning_binsearch",
    "accelerate",
]
SEARCH_TIMEOUT = 3600.0
# Fresh runs a size's check must pass to be the 20-step max, and the most checks one
# 20-step max may cost.
CONFIRMATIONS = 2
MAX_TRUTH_RUNS = 24
# `find_batch_size`'s knobs that go in its `memfit.Options`.
OPTIONS_FIELDS = tuple(field.name for field in dataclasses.fields(Options))


def memfit_options(flags: list[str]) -> dict[str, Any]:
    """The `find_batch_size` keyword arguments that `memfit batch MODEL *flags` runs with.

    The flags go through memfit's own CLI parser, so its defaults (margin, soak) are the
    ones a user gets, and a flag the CLI no longer has fails here, loudly.

    Args:
        flags: options after `memfit batch MODEL`, e.g. `["--soak-steps", "0"]`.

    Returns:
        The parsed options that `memfit.find_batch_size` takes (by name, or in its
        `memfit.Options`: `soak_steps`), plus `"in_process"` (the CLI's `--in-process`).

    Example:
        >>> memfit_options(["--soak-steps", "0"])["soak_steps"]
        0
    """
    import click

    from memfit.cli import batch
    from memfit.search import find_batch_size

    try:
        context = batch.make_context("batch", ["keras.applications.MobileNetV2", *flags])
    except click.UsageError as exc:
        message = f"memfit batch no longer takes {flags}: {exc.format_message()}"
        raise RuntimeError(message) from exc
    takes = {*inspect.signature(find_batch_size).parameters, *OPTIONS_FIELDS}
    options = {
        name: value
        for name, value in context.params.items()
        # --device names the emulated card (it goes in the budget), not the TF device.
        if name in takes and name not in ("model", "input_shape", "data", "budget", "device")
    }
    options["in_process"] = bool(context.params.get("in_process"))
    return options


def _progress(method: str) -> Callable[[int, bool, float], None]:
    def report(size: int, oom: bool, seconds: float) -> None:
        outcome = "[red]OOM[/red]" if oom else "[green]runs[/green]"
        console.print(f"    {method:<20} batch {size:>4}: {outcome}  ({seconds:.1f} s)")

    return report


def run_memfit(method: str, case: Case, budget: Any, seen: dict[int, list[bool]]) -> dict[str, Any]:
    """memfit's search as `memfit batch MODEL *MEMFIT_FLAGS[method]` runs it.

    Without `--in-process` the trials load the MODEL string in a child (the CLI's default);
    with it, the model is loaded here and a saved copy searched in a child. Trials that were
    not soaks go into `seen` (ran or ran out of memory) for the 3-step max.
    """
    import memfit

    options = memfit_options(MEMFIT_FLAGS[method])
    in_process = options.pop("in_process")
    report = _progress(method)

    def on_trial(trial: memfit.Trial) -> None:
        if not trial.soak:
            seen.setdefault(trial.batch_size, []).append(not trial.oom)
        report(trial.batch_size, trial.oom, trial.seconds)

    model: Any = case.spec
    data: Any = case.data
    if in_process:
        from memfit.workload.models import call_factory

        model = memfit.load_model(case.spec, input_shape=case.input_shape)
        data = call_factory(case.data) if case.data else None
    start = time.perf_counter()
    knobs = {name: options[name] for name in OPTIONS_FIELDS if name in options}
    result = memfit.find_batch_size(
        model,
        budget=budget,
        input_shape=case.input_shape,
        data=data,
        progress=on_trial,
        options=memfit.Options(isolated=not in_process, **knobs),
        **{name: value for name, value in options.items() if name not in knobs},
    )
    return {
        "found": result.batch_size,
        "options": {k: v for k, v in options.items() if isinstance(v, (int, float, type(None)))},
        "trials": [
            {
                "batch_size": t.batch_size,
                "oom": t.oom,
                "fits": t.fits,
                "soak": t.soak,
                "seconds": t.seconds,
            }
            for t in result.trials
        ],
        "steps": sum(t.steps for t in result.trials),
        "seconds": time.perf_counter() - start,
    }


def run_in_process(
    method: str, case: Case, budget: Any, seen: dict[int, list[bool]]
) -> dict[str, Any]:
    """One whole baseline search in one fresh child process (`bench.trials.search_child`)."""
    from memfit.process.runner import run_in_child

    start = time.perf_counter()
    result = run_in_child(
        "bench.trials:search_child",
        {
            "method": method,
            "spec": case.spec,
            "steps": STEPS,
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


def largest_passing(
    run: Callable[[int], bool],
    known: dict[int, list[bool]],
    start: int,
    confirmations: int = CONFIRMATIONS,
    max_runs: int = MAX_TRUTH_RUNS,
) -> dict[str, Any]:
    """The largest size that passes `run` every time it ran (at least `confirmations` times).

    A size passes when every run of it passed. From the outcomes in `known` (updated in
    place), the bracket is the largest passing size and the smallest failing one above it;
    with no failure above, sizes are galloped up from it (+1, +2, +4, ...), with no pass,
    down from the failure (or from `start`); the bracket is bisected to adjacent sizes, and
    the lower one run again until it has passed `confirmations` times (a failure reopens the
    bracket below it).

    Args:
        run: one fresh run at a size; True when it passed.
        known: outcomes so far, size -> list of passed/failed; new runs are appended.
        start: the first size to try when `known` is empty.
        confirmations: passes the answer needs.
        max_runs: new runs at most; then the bracket so far is the answer (`settled` False).

    Returns:
        `largest` (0 when size 1 fails), `smallest_failing`, `runs` (new runs made),
        `settled`, and `anomalies` (sizes below the answer that failed at least once).

    Example:
        >>> largest_passing(lambda size: size <= 13, {10: [True], 16: [False]}, 10)["largest"]
        13
    """
    made = 0

    def probe(size: int) -> None:
        nonlocal made
        known.setdefault(size, []).append(bool(run(size)))
        made += 1

    def passes(size: int) -> bool:
        return bool(known.get(size)) and all(known[size])

    up = down = 1
    settled = False
    while made < max_runs:
        lo = max((s for s in known if passes(s)), default=0)
        hi = min((s for s in known if s > lo and not passes(s)), default=None)
        if lo == 0 and hi is None:
            probe(max(1, start))
        elif hi is None:
            probe(lo + up)
            up *= 2
        elif lo == 0 and hi > 1:
            probe(max(1, hi - down))
            down *= 2
        elif hi - lo > 1:
            probe((lo + hi) // 2)
        elif lo and len(known[lo]) < confirmations:
            probe(lo)
        else:
            settled = True
            break
    lo = max((s for s in known if passes(s)), default=0)
    hi = min((s for s in known if s > lo and not passes(s)), default=None)
    return {
        "largest": lo,
        "smallest_failing": hi,
        "runs": made,
        "settled": settled,
        "anomalies": sorted(s for s in known if s < lo and not passes(s)),
    }


def check_answers(
    case: Case, budget: Any, results: dict[str, Any], known: dict[int, list[bool]]
) -> ChildTrials:
    """Train every method's answer `CHECK_STEPS` steps of `model.fit` in a fresh process.

    One check per distinct size (the outcome goes into `known`, shared with the 20-step
    max); each result gets `trains` (None where the method found nothing).
    """
    check = ChildTrials(
        case.spec,
        budget,
        CHECK_STEPS,
        case.input_shape,
        case.data,
        {},
        _progress(f"model.fit x{CHECK_STEPS}"),
        function=FIT_STEPS,
    )
    for result in results.values():
        found = result.get("found")
        if not found:
            result["trains"] = None
            continue
        if found not in known:
            known[found] = [check(found)]
        result["trains"] = known[found][0]
    return check


def fit_truth(
    case: Case,
    budget: Any,
    known: dict[int, list[bool]],
    start: int,
    confirmations: int = CONFIRMATIONS,
) -> dict[str, Any]:
    """The 20-step max: `largest_passing` over `CHECK_STEPS`-step `model.fit` checks."""
    check = ChildTrials(
        case.spec,
        budget,
        CHECK_STEPS,
        case.input_shape,
        case.data,
        {},
        _progress("20-step max"),
        function=FIT_STEPS,
    )
    found = largest_passing(check, known, start, confirmations=confirmations)
    return {
        "fit_max": found["largest"],
        "check_steps": CHECK_STEPS,
        **found,
        "outcomes": {str(size): runs for size, runs in sorted(known.items())},
        **check.log.to_dict(),
    }


def ground_truth(case: Case, budget: Any, seen: dict[int, list[bool]]) -> dict[str, Any]:
    """The 3-step max: largest size that trains `STEPS` steps of Keras' train function.

    Known outcomes (the baselines' trials and memfit's), bisection, then the final pair
    (runs, size+1 fails) confirmed by fresh runs.
    """
    runs = ChildTrials(
        case.spec, budget, STEPS, case.input_shape, case.data, seen, _progress("3-step max")
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


def summarise(results: dict[str, Any], fit_max: int | None, three_step_max: int | None) -> None:
    """Add each method's share of the maxima and its time ratio to Lightning binsearch's."""
    binsearch = results.get("lightning_binsearch") or {}
    reference = binsearch.get("seconds") if binsearch.get("found") is not None else None
    for result in results.values():
        found = result.get("found")
        result["share_of_fit_max"] = found / fit_max if fit_max and found else None
        result["share_of_three_step_max"] = (
            found / three_step_max if three_step_max and found else None
        )
        result["time_vs_binsearch"] = (
            result["seconds"] / reference if reference and found is not None else None
        )


def bench_case(
    name: str,
    case: Case,
    methods: list[str],
    three_step: bool,
    confirmations: int = CONFIRMATIONS,
) -> dict[str, Any]:
    """Run every method on one case, check every answer, find the maxima."""
    from memfit.budget.budget import Budget

    budget = Budget.from_size(case.budget)
    console.rule(f"{name} under {case.budget}")
    seen: dict[int, list[bool]] = {}
    results: dict[str, Any] = {}
    for method in methods:
        console.print(f"  [bold]{method}[/bold]")
        if method in MEMFIT_FLAGS:
            results[method] = run_memfit(method, case, budget, seen)
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
    console.print(f"  [bold]check: {CHECK_STEPS} steps of model.fit, fresh process[/bold]")
    known: dict[int, list[bool]] = {}
    check = check_answers(case, budget, results, known)
    three = None
    if three_step:
        console.print(f"  [bold]3-step max ({STEPS} steps of the train function)[/bold]")
        three = ground_truth(case, budget, seen)
    three_step_max = three["true_max"] if three else None
    console.print(f"  [bold]20-step max ({CHECK_STEPS} steps of model.fit)[/bold]")
    answers = [r["found"] for r in results.values() if r.get("found")]
    start = three_step_max or max(answers, default=1)
    truth = fit_truth(case, budget, known, start, confirmations)
    summarise(results, truth["fit_max"], three_step_max)
    return {
        "spec": case.spec,
        "input_shape": case.input_shape,
        "budget": case.budget,
        "fit_max": truth["fit_max"],
        "fit_truth": truth,
        "answer_checks": check.log.to_dict(),
        "three_step_max": three_step_max,
        "three_step_truth": three,
        "methods": results,
    }


def _trains(value: bool | None) -> str:
    return {True: "[green]yes[/green]", False: "[red]no[/red]"}.get(value, "-")  # type: ignore[arg-type]


def table(report: dict[str, Any]) -> Table:
    """The results as one table: a row per model and method.

    Example:
        >>> Console().print(table(json.load(open("out.json"))))  # doctest: +SKIP
    """
    out = Table(
        title=f"Largest batch: memfit vs Lightning {LIGHTNING_VERSION} and Accelerate, "
        f"each answer checked by {CHECK_STEPS} steps of model.fit in a fresh process"
    )
    for column in (
        "model",
        f"{CHECK_STEPS}-step max",
        f"{STEPS}-step max",
        "method",
        "found",
        "trains?",
        f"% of {CHECK_STEPS}-step max",
        "trials",
        "steps",
        "wall s",
        "time / binsearch",
    ):
        out.add_column(column, justify="left" if column in ("model", "method") else "right")
    for name, case in report["models"].items():
        for i, (method, r) in enumerate(case["methods"].items()):
            share, ratio = r.get("share_of_fit_max"), r.get("time_vs_binsearch")
            out.add_row(
                name if i == 0 else "",
                str(case["fit_max"]) if i == 0 else "",
                str(case.get("three_step_max") or "-") if i == 0 else "",
                method,
                str(r["found"]) if r["found"] is not None else "failed",
                _trains(r.get("trains")),
                f"{share:.0%}" if share is not None else "-",
                str(len(r["trials"])),
                str(r["steps"]),
                f"{r['seconds']:.0f}",
                f"{ratio:.2f}" if ratio is not None else "-",
            )
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table, write `--out` JSON after each model."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="MobileNetV2 at 96x96 under 500 MiB, without Accelerate, the 3-step max or "
        "the 20-step max's second run",
    )
    parser.add_argument(
        "--models", nargs="+", choices=sorted({**CASES, **QUICK_CASES}), help="models to run"
    )
    parser.add_argument("--methods", nargs="+", choices=METHODS, help="methods to run")
    parser.add_argument(
        "--three-step",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also find the 3-step max (default: yes, with --quick no)",
    )
    parser.add_argument("--out", metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    # The children import bench.models (the RetinaNet) from the repository root.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    cases = {**CASES, **QUICK_CASES}
    names = args.models or list(QUICK_CASES if args.quick else CASES)
    methods = args.methods or (QUICK_METHODS if args.quick else METHODS)
    three_step = args.three_step if args.three_step is not None else not args.quick
    started = time.perf_counter()
    report: dict[str, Any] = {
        "models": {},
        "lightning_version": LIGHTNING_VERSION,
        "check_steps": CHECK_STEPS,
        "memfit_flags": {m: MEMFIT_FLAGS[m] for m in methods if m in MEMFIT_FLAGS},
        "machine": describe("CPU BFC capped at the budget, oneDNN off (memfit emulation)"),
    }
    for name in names:
        confirmations = 1 if args.quick else CONFIRMATIONS
        report["models"][name] = bench_case(name, cases[name], methods, three_step, confirmations)
        report["seconds"] = time.perf_counter() - started
        if args.out:  # after each model, so a long run keeps what it has measured
            with open(args.out, "w") as handle:
                json.dump(report, handle, indent=2)
    Console(width=170).print(table(report))
    console.print(f"total {report['seconds'] / 60:.1f} min")
    if args.out:
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
