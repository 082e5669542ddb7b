"""Benchmark: every memfit claim on each detector family, in one run and one table.

For each family (keras-hub RetinaNet, keras-hub D-FINE, kyolo YOLOv8-n, the TF Model
Garden's RetinaNet and Mask R-CNN) at a named size under a named emulated budget:

1. Estimate vs measured: `memfit estimate --json`'s likely peak and high bound against the
   highest of 5 measured steps (`memfit measure --repeats 5 --json`, a fresh process).
2. Batch: `memfit batch --json`'s answer under the budget, then whether the family's own
   training trains 20 steps at that size in a fresh process under the same budget: plain
   `model.fit` (as `bench/batch_search.py` checks), or the task's own `train_step` in a
   `tf.function` for a Model Garden task.
3. Recovery: under the budget, train on batches that fit, then on batches that do not (larger
   images, or a larger batch where the family takes one image size) with `memfit.fit` (Keras
   3) or `memfit.GuardedStep.from_task` (Model Garden): updates kept against batches fed, and
   the relative difference of all final weights against the same run under a roomy
   budget (same seed, same data), where nothing ran out of memory.
4. Step time: memfit's guarded step (`GuardedStep`, K=1, what `memfit.fit` runs) against the
   family's own plain step, same process, roomy budget, interleaved, median of the measured
   steps after warm-up, as a ratio.

Every figure comes from fresh child processes with default threading; Model Garden runs in its
own environment (`.venv-garden`, tf_keras and tf-models-official).

    python -m bench.detectors --quick      # the smallest sizes (64-128 px)
    python -m bench.detectors              # 224-512 px
    python -m bench.detectors --quick --only yolo,dfine --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.machine import describe
from bench.trials import FIT_STEPS, ROOT

console = Console(stderr=True)

TESTS = os.path.join(ROOT, "tests")
sys.path.insert(0, TESTS)
from mypkg import garden  # noqa: E402  (the Model Garden's small configs, shared with tests)

SRC = os.path.join(ROOT, "src")
ROOMY = "4GiB"  # never runs out: the control runs and the step-time comparison
FIT_CHECK_STEPS = 20
GARDEN_PYTHON = os.environ.get(
    "MEMFIT_GARDEN_PYTHON", os.path.join(ROOT, ".venv-garden", "bin", "python")
)  # the Model Garden's environment (`make` creates it)
GARDEN_TASK = "retinanet_resnetfpn_coco"
MASK_TASK = "maskrcnn_resnetfpn_coco"


@dataclass
class Family:
    """One detector family at one size: how the CLI names it and how the bench trains it.

    Attributes:
        key: short name (`--only`).
        title: the family as the table names it.
        size: the model and image size, in words.
        budget: the emulated budget of the batch search and the recovery.
        batch: batch size of the estimate and the measured steps.
        cli: MODEL and its options as `memfit measure` takes them.
        env: environment variables of every child (sizes, data paths).
        recovery: `(image_size, batch_size, batches)` shards fed in order; the last does not
            fit the budget unsplit.
        garden: a Model Garden task (runs in `GARDEN_PYTHON`).
        task: the Model Garden experiment (`garden:` name) of a garden family.
    """

    key: str
    title: str
    size: str
    budget: str
    batch: int
    cli: list[str]
    env: dict[str, str] = field(default_factory=dict)
    recovery: list[tuple[int, int, int]] = field(default_factory=list)
    garden: bool = False
    task: str = GARDEN_TASK


def families(quick: bool, data_dir: str) -> list[Family]:
    """The families at the quick (64-128 px) or the full (224-512 px) sizes."""
    r_size, r_big = (128, 256) if quick else (384, 512)
    d_size, d_queries = (64, 16) if quick else (320, 100)
    y_size, y_big = (128, 256) if quick else (320, 640)
    g_size, g_model = (128, 18) if quick else (384, 50)
    garden_sets = garden.retinanet_sets(f"{data_dir}/train-*", g_size, g_model)
    mask_sets = garden.mask_rcnn_sets(f"{data_dir}-masks/train-*", g_size, g_model)
    q = quick
    return [
        Family(
            "retinanet",
            "keras-hub RetinaNet",
            f"ResNet-10 FPN, {r_size} px",
            "600MiB" if q else "3GiB",
            4 if q else 8,
            ["bench.detectors:retinanet", "--data", "bench.detectors:retinanet_data"],
            {"RETINANET_SIZE": str(r_size)},
            # At 128 px under 600 MiB batch 22 fits: 4 images of 256 px (16 of 128) did too.
            [(r_size, 8 if q else 4, 2), (r_big, 8 if q else 4, 2)],
        ),
        Family(
            "dfine",
            "keras-hub D-FINE",
            f"HGNetV2-tiny, {d_size} px, {d_queries} queries",
            "100MiB" if q else "3GiB",
            4 if q else 8,
            ["mypkg.detectors:dfine", "--data", "mypkg.detectors:dfine_data"],
            {"DFINE_SIZE": str(d_size), "DFINE_QUERIES": str(d_queries)},
            # One image size per model (fixed anchors): the shard that does not fit is a
            # larger batch.
            [(d_size, 4, 2), (d_size, 64, 2)],
        ),
        Family(
            "yolo",
            "kyolo YOLOv8",
            f"YOLOv8-n, {y_size} px",
            "250MiB" if q else "3GiB",
            2 if q else 8,
            ["mypkg.detectors:yolo", "--data", "mypkg.detectors:yolo_data"],
            {"YOLO_SIZE": str(y_size)},
            [(y_size, 8, 2), (y_big, 8, 2)],
        ),
        Family(
            "garden",
            "Model Garden RetinaNet",
            f"ResNet-{g_model} FPN, {g_size} px",
            "600MiB" if q else "4GiB",
            2 if q else 8,
            [f"garden:{GARDEN_TASK}"] + [a for s in garden_sets for a in ("--set", s)],
            {"TF_CPP_MIN_LOG_LEVEL": "2"},
            # Its parser resizes every image to input_size: the step that does not fit is a
            # larger batch.
            [(g_size, 4, 2), (g_size, 24, 2)],
            garden=True,
        ),
        Family(
            "maskrcnn",
            "Model Garden Mask R-CNN",
            f"ResNet-{g_model} FPN, {g_size} px, 64-filter heads, 32 ROIs, 8 masks",
            "600MiB" if q else "6GiB",
            2 if q else 4,
            [f"garden:{MASK_TASK}"] + [a for s in mask_sets for a in ("--set", s)],
            {"TF_CPP_MIN_LOG_LEVEL": "2"},
            # Its samplers need a static batch: the larger batch splits into equal halves.
            [(g_size, 2, 2), (g_size, 16, 2)],
            garden=True,
            task=MASK_TASK,
        ),
    ]


# Factories the CLI and the children load (`bench.detectors:retinanet`).


def retinanet() -> Any:
    """CLI factory: keras-hub RetinaNet, ResNet-10, `RETINANET_SIZE` px (any size if unset)."""
    from memfit import zoo

    size = os.environ.get("RETINANET_SIZE")
    return zoo.retinanet(int(size) if size else None)


def retinanet_data() -> Any:
    """CLI dataset: 64 detection samples at `RETINANET_SIZE` px."""
    from memfit import zoo

    return zoo.detection_samples(64, int(os.environ.get("RETINANET_SIZE", "128")))


def _keras_model(key: str) -> Any:
    """The family's compiled Keras 3 model, taking any image size where the family does."""
    from mypkg import detectors

    if key == "retinanet":
        from memfit import zoo

        return zoo.retinanet(None)
    if key == "dfine":
        return detectors.dfine()
    return detectors.yolo_detector(None)


def _keras_samples(key: str, count: int, size: int, seed: int) -> Any:
    from mypkg import detectors

    from memfit import zoo

    if key == "retinanet":
        return zoo.detection_samples(count, size, seed=seed)
    if key == "dfine":
        return detectors.dfine_samples(count, size, seed=seed)
    return detectors.yolo_samples(count, size, seed=seed)


def _save_weights(weights: list[Any], path: str) -> None:
    import numpy as np

    np.savez(path, *[np.asarray(w) for w in weights])


# Child sides: each runs in a fresh process (run_in_child) under the budget it is given.


def keras_recovery_child(key: str, shards: list[list[int]], weights_path: str) -> dict[str, Any]:
    """`memfit.fit` over the family's shards, one epoch; the final weights saved to a file."""
    import keras

    import memfit

    keras.utils.set_random_seed(0)
    model = _keras_model(key)
    dataset = None
    for index, (size, batch, batches) in enumerate(shards):
        shard = _keras_samples(key, batch * batches, size, seed=index).batch(batch)
        dataset = shard if dataset is None else dataset.concatenate(shard)
    history = memfit.fit(model, dataset, epochs=1, verbose=0, shuffle=False)
    _save_weights(model.get_weights(), weights_path)
    summary = history.memfit.to_dict()
    return {
        "fed": sum(b for _, _, b in shards),
        "updates": int(model.optimizer.iterations.numpy()),
        "recoveries": len(summary["recoveries"]),
        "micro_batches": summary["micro_batches"],
    }


def keras_step_time_child(key: str, size: int, batch: int, warmup: int, steps: int) -> dict:
    """Keras' own train step against `GuardedStep` (K=1) on one model, interleaved."""
    import keras

    import memfit
    from bench.trials import _train_once

    keras.utils.set_random_seed(0)
    model = _keras_model(key)
    x, y = next(iter(_keras_samples(key, batch, size, seed=0).batch(batch)))
    guarded = memfit.GuardedStep(model, verbose=False)
    return _interleave(lambda: _train_once(model, x, y), lambda: guarded((x, y)), warmup, steps)


def _garden_task(overrides: list[str], task: str = GARDEN_TASK) -> Any:
    import tf_keras

    from memfit.backend.tf_garden import build_task

    tf_keras.utils.set_random_seed(0)
    return build_task(task, overrides)


def _garden_batches(built: Any, batch: int, batches: int) -> list[Any]:
    import copy

    config = copy.deepcopy(built.config.task.train_data)
    config.global_batch_size = int(batch)
    return list(built.task.build_inputs(config).take(batches))


def garden_recovery_child(
    overrides: list[str], shards: list[list[int]], weights_path: str, task: str = GARDEN_TASK
) -> dict[str, Any]:
    """`GuardedStep.from_task` over the shards' batches; the final weights saved to a file."""
    import memfit

    built = _garden_task(overrides, task)
    step = memfit.GuardedStep.from_task(built.task, built.model, built.optimizer, verbose=False)
    fed = 0
    for _, batch, batches in shards:
        for data in _garden_batches(built, batch, batches):
            step(data)
            fed += 1
    _save_weights(built.model.get_weights(), weights_path)
    summary = step.summary.to_dict()
    return {
        "fed": fed,
        "updates": int(built.optimizer.iterations.numpy()),
        "recoveries": len(summary["recoveries"]),
        "micro_batches": summary["micro_batches"],
    }


def garden_fit_steps_child(
    overrides: list[str], batch_size: int, steps: int, task: str = GARDEN_TASK
) -> dict[str, Any]:
    """`steps` steps of the task's own `train_step` (`tf.function`, as the Model Garden's
    trainer runs it) at `batch_size`, each on a new batch of its inputs: whether one ran out
    of memory."""
    import copy

    import tensorflow as tf

    built = _garden_task(overrides, task)
    config = copy.deepcopy(built.config.task.train_data)
    config.global_batch_size = int(batch_size)
    step = tf.function(built.step_fn)
    done = 0
    try:
        for data in built.task.build_inputs(config).take(steps):
            logs = step(data, built.optimizer)
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, logs)
            done += 1
    except tf.errors.ResourceExhaustedError as exc:
        return {"oom": True, "steps": done, "message": str(exc).strip().splitlines()[0][:200]}
    return {"oom": False, "steps": done}


def garden_step_time_child(
    overrides: list[str], batch: int, warmup: int, steps: int, task: str = GARDEN_TASK
) -> dict:
    """The task's own `train_step` (`tf.function`) against `GuardedStep.from_task`, K=1."""
    import tensorflow as tf

    import memfit

    built = _garden_task(overrides, task)
    data = _garden_batches(built, batch, 1)[0]
    plain = tf.function(built.step_fn)
    guarded = memfit.GuardedStep.from_task(
        built.task, built.model, built.optimizer, metrics=built.metrics, verbose=False
    )
    return _interleave(lambda: plain(data, built.optimizer), lambda: guarded(data), warmup, steps)


def _interleave(plain: Any, guarded: Any, warmup: int, steps: int) -> dict[str, Any]:
    """Time `plain` and `guarded` alternately; the first `warmup` of each are not counted."""
    import numpy as np

    def timed(step: Any) -> float:
        start = time.perf_counter()
        logs = step()
        # The step's result on the host: the time includes the whole step.
        for value in logs.values() if isinstance(logs, dict) else [logs]:
            if hasattr(value, "numpy"):
                np.asarray(value)
        return time.perf_counter() - start

    plain_s, guarded_s = [], []
    for i in range(warmup + steps):
        first, second = (plain, guarded) if i % 2 == 0 else (guarded, plain)
        a, b = timed(first), timed(second)
        p, g = (a, b) if i % 2 == 0 else (b, a)
        if i >= warmup:
            plain_s.append(p)
            guarded_s.append(g)
    return {"plain_seconds": plain_s, "guarded_seconds": guarded_s}


# Parent side.


def _env(family: Family) -> dict[str, str]:
    path = os.pathsep.join([SRC, TESTS, ROOT])
    return {**os.environ, "PYTHONPATH": path, **family.env}


def _python(family: Family) -> str:
    return GARDEN_PYTHON if family.garden else sys.executable


def _cli(family: Family, command: str, *args: str) -> tuple[dict[str, Any] | None, str]:
    """`memfit COMMAND MODEL ... --json` in a fresh process: its JSON, or its error line."""
    argv = [_python(family), "-m", "memfit", command, *family.cli, *args, "--json"]
    proc = subprocess.run(argv, env=_env(family), capture_output=True, text=True)
    if proc.returncode == 0:
        return json.loads(proc.stdout), ""
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("memfit: error")]
    return None, (lines[-1] if lines else proc.stderr.strip().splitlines()[-1])


def _child(family: Family, function: str, kwargs: dict[str, Any], budget: str) -> Any:
    """`run_in_child` with the family's interpreter (the garden's own for a Model Garden task)."""
    code = (
        "import json, sys\n"
        "from memfit.process.runner import run_in_child\n"
        "from memfit.budget.budget import Budget\n"
        "job = json.load(sys.stdin)\n"
        "result = run_in_child(job['function'], job['kwargs'], budget=Budget.from_size("
        "job['budget']), env={'PYTHONPATH': job['path']}, oom_grace=1e9)\n"
        "print(json.dumps(result))\n"
    )
    job = {
        "function": function,
        "kwargs": kwargs,
        "budget": budget,
        "path": _env(family)["PYTHONPATH"],
    }
    proc = subprocess.run(
        [_python(family), "-c", code],
        input=json.dumps(job),
        env=_env(family),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{function} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _overrides(family: Family) -> list[str]:
    return [family.cli[i + 1] for i, a in enumerate(family.cli) if a == "--set"]


def estimate_vs_measured(family: Family) -> dict[str, Any]:
    """Step 1: the estimate's likely peak and high bound against the highest measured step."""
    b = str(family.batch)
    # The bound of 5 steps, against the highest of 5 measured steps.
    args = ("-b", b, "--steps", "5", *(() if family.garden else ("--no-what-ifs",)))
    est, est_error = _cli(family, "estimate", *args)
    meas, meas_error = _cli(family, "measure", "-b", b, "--repeats", "5", "--memory", ROOMY)
    out: dict[str, Any] = {"batch": family.batch, "error": est_error or meas_error or None}
    if est and meas:
        measured = max(meas["peaks_bytes"])
        out.update(
            estimate_bytes=est["peak_bytes"],
            high_bytes=est["high_bytes"],
            measured_bytes=measured,
            measured_peaks_bytes=meas["peaks_bytes"],
            error_percent=100 * (est["peak_bytes"] - measured) / measured,
            within_high_bound=measured <= est["high_bytes"],
        )
    return out


def batch_and_fit(family: Family) -> dict[str, Any]:
    """Step 2: `memfit batch`'s answer, then 20 steps of plain `model.fit` at that size."""
    found, error = _cli(
        family, "batch", "--memory", family.budget, "--max-batch", "64", "--soak-steps", "5"
    )
    if found is None:
        return {"refused": error}
    size = int(found["batch_size"])
    out: dict[str, Any] = {"batch_size": size, "stopped_by": found.get("stopped_by")}
    if size < 1:
        return out
    if family.garden:
        check = _child(
            family,
            "bench.detectors:garden_fit_steps_child",
            {
                "overrides": _overrides(family),
                "batch_size": size,
                "steps": FIT_CHECK_STEPS,
                "task": family.task,
            },
            family.budget,
        )
        out["fit_oom"] = bool(check.get("oom") or check.get("hung_after_oom"))
        out["fit_steps"] = check.get("steps")
        return out
    spec, data = family.cli[0], family.cli[2]
    try:
        check = _child(
            family,
            FIT_STEPS,
            {
                "spec": spec,
                "batch_size": size,
                "steps": FIT_CHECK_STEPS,
                "input_shape": None,
                "data": data,
            },
            family.budget,
        )
        out["fit_oom"] = bool(check.get("oom") or check.get("hung_after_oom"))
    except RuntimeError as exc:
        out["fit_oom"], out["fit_error"] = True, str(exc).splitlines()[-1]
    return out


def recovery(family: Family, tmp: str) -> dict[str, Any]:
    """Step 3: the budgeted run with OOM recovery against a roomy run of the same job."""
    import numpy as np

    shards = [list(s) for s in family.recovery]
    function = "bench.detectors:" + (
        "garden_recovery_child" if family.garden else "keras_recovery_child"
    )
    runs = {}
    for name, budget in (("tight", family.budget), ("roomy", ROOMY)):
        path = os.path.join(tmp, f"{family.key}-{name}.npz")
        first = (
            {"overrides": _overrides(family), "task": family.task}
            if family.garden
            else {"key": family.key}
        )
        runs[name] = _child(
            family, function, {**first, "shards": shards, "weights_path": path}, budget
        )
        runs[name]["weights"] = path
    tight, roomy = (np.load(runs[n]["weights"]) for n in ("tight", "roomy"))
    # Over all weights at once (||tight - roomy|| / ||roomy||), as the tests compare runs: a
    # per-tensor maximum is ruled by a small bias or BatchNorm statistic a split moves.
    keys = [k for k in roomy.files if roomy[k].size]
    difference = float(
        np.sqrt(sum(np.sum((tight[k] - roomy[k]).astype(np.float64) ** 2) for k in keys))
        / max(np.sqrt(sum(np.sum(roomy[k].astype(np.float64) ** 2) for k in keys)), 1e-30)
    )
    return {
        "shards": shards,
        "fed": runs["tight"]["fed"],
        "updates": runs["tight"]["updates"],
        "recoveries": runs["tight"]["recoveries"],
        "micro_batches": runs["tight"]["micro_batches"],
        "roomy_updates": runs["roomy"]["updates"],
        "roomy_recoveries": runs["roomy"]["recoveries"],
        "relative_difference": difference,
    }


def step_time(family: Family, warmup: int, steps: int) -> dict[str, Any]:
    """Step 4: the guarded step over the family's plain step, roomy, same process."""
    size, batch, _ = family.recovery[0]
    if family.garden:
        function = "bench.detectors:garden_step_time_child"
        kwargs: dict[str, Any] = {"overrides": _overrides(family), "task": family.task}
    else:
        function = "bench.detectors:keras_step_time_child"
        kwargs = {"key": family.key, "size": size}
    result = _child(
        family, function, {**kwargs, "batch": batch, "warmup": warmup, "steps": steps}, ROOMY
    )
    plain = statistics.median(result["plain_seconds"])
    guarded = statistics.median(result["guarded_seconds"])
    return {
        **result,
        "batch": batch,
        "plain_median": plain,
        "guarded_median": guarded,
        "ratio": guarded / plain,
    }


def _write_garden_data(directory: str, size: int) -> None:
    """OD-API records for the Model Garden families: boxes in `directory`, the same with
    instance masks (Mask R-CNN's) in `directory-masks`."""
    code = (
        "from memfit.data.synth import write_dataset\n"
        f"write_dataset({directory!r}, count=64, shards=1, image_size=({size}, {size}), "
        "num_classes=5)\n"
        f"write_dataset({directory + '-masks'!r}, count=64, shards=1, "
        f"image_size=({size}, {size}), num_classes=5, masks=True)\n"
    )
    subprocess.run([GARDEN_PYTHON, "-c", code], env={**os.environ, "PYTHONPATH": SRC}, check=True)


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def table(report: dict[str, Any]) -> Table:
    """One row per family: every figure, budgets and sizes named."""
    t = Table(title="Detectors: estimate, batch, recovery and step time under an emulated budget")
    for column in (
        "family",
        "size",
        "budget",
        "estimate (high) vs measured",
        "error",
        "batch -> 20 fit steps",
        "recovery: updates/fed, rel. diff",
        "step: guarded / plain",
    ):
        t.add_column(column)
    for r in report["families"]:
        e, b, rec, s = (r.get(k) or {} for k in ("estimate", "batch", "recovery", "step_time"))
        if r.get("not_measured"):
            t.add_row(
                r["title"], r["size"], "-", f"not measured: {r['not_measured']}", "", "", "", ""
            )
            continue
        if "estimate_bytes" in e:
            est = (
                f"b{e['batch']}: {_mib(e['estimate_bytes'])} ({_mib(e['high_bytes'])}) vs "
                f"{_mib(e['measured_bytes'])}"
            )
            err = f"{e['error_percent']:+.1f}%"
        else:
            est, err = f"failed: {e.get('error') or r.get('estimate_error')}", "-"
        if "refused" in b:
            batch = f"n/a: refused ({b['refused'].removeprefix('memfit: error: ')[:60]})"
        elif "batch_size" in b:
            fits = "n/a" if "fit_oom" not in b else ("OOM" if b["fit_oom"] else "trains")
            batch = f"{b['batch_size']} -> {fits}"
        else:
            batch = f"failed: {r.get('batch_error', '-')}"
        if rec:
            recov = (
                f"{rec['updates']}/{rec['fed']} ({rec['recoveries']} OOM recovered), "
                f"{rec['relative_difference']:.1e}, {r.get('recovery_seconds', 0) / 60:.1f} min"
            )
        else:
            recov = f"failed: {r.get('recovery_error', '-')}"
        step = (
            f"{s['ratio']:.2f} ({s['guarded_median']:.2f} / {s['plain_median']:.2f} s)"
            if s
            else f"failed: {r.get('step_time_error', '-')}"
        )
        t.add_row(r["title"], r["size"], r["budget"], est, err, batch, recov, step)
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the smallest sizes (64-128 px)")
    parser.add_argument(
        "--only", help="comma-separated family keys (retinanet,dfine,yolo,garden,maskrcnn)"
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps after 2 of warm-up")
    parser.add_argument("--out", metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "machine": describe("CPU BFC capped at the budget, oneDNN off (memfit emulation)"),
        "quick": args.quick,
        "families": [],
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memfit-bench-detectors-") as tmp:
        data_dir = os.path.join(tmp, "od")
        chosen = families(args.quick, data_dir)
        if args.only:
            by_key = {f.key: f for f in chosen}
            chosen = [by_key[k] for k in args.only.split(",")]
        if any(f.garden for f in chosen):
            _write_garden_data(data_dir, 128 if args.quick else 384)
            report["garden_versions"] = _garden_versions()
        for family in chosen:
            console.rule(f"{family.title}, {family.size}, under {family.budget}")
            row: dict[str, Any] = {
                "family": asdict(family),
                "title": family.title,
                "size": family.size,
                "budget": family.budget,
            }
            for name, run in (
                ("estimate", lambda f=family: estimate_vs_measured(f)),
                ("batch", lambda f=family: batch_and_fit(f)),
                ("recovery", lambda f=family: recovery(f, tmp)),
                ("step_time", lambda f=family: step_time(f, 2, args.steps)),
            ):
                start = time.perf_counter()
                try:
                    row[name] = run()
                except Exception as exc:  # noqa: BLE001 - one part failing: say so in its cell
                    row[f"{name}_error"] = str(exc).strip().splitlines()[-1][:200]
                row[f"{name}_seconds"] = time.perf_counter() - start
                console.print(f"  {name}: {row.get(name) or row.get(f'{name}_error')}"[:400])
            report["families"].append(row)
            if args.out:
                with open(args.out, "w") as handle:
                    json.dump(report, handle, indent=2, default=str)
    report["seconds"] = time.perf_counter() - started
    Console().print(table(report))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=2, default=str)
        console.print(f"wrote {args.out}")
    return 0


def _garden_versions() -> dict[str, Any]:
    code = (
        "import json, tensorflow as tf, tf_keras, importlib.metadata as m\n"
        "print(json.dumps({'tensorflow': tf.__version__, 'tf_keras': tf_keras.__version__, "
        "'tf-models-official': m.version('tf-models-official')}))\n"
    )
    proc = subprocess.run([GARDEN_PYTHON, "-c", code], capture_output=True, text=True)
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}


if __name__ == "__main__":
    sys.exit(main())
