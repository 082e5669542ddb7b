"""Benchmark: memfit.estimate's predicted peak against the step as users run it, and two baselines.

Each case (model x size x batch x optimizer: Adam; SGD with momentum 0.9) is measured under
two threadings: `default`, TensorFlow's own thread pools as a user's process gets them (nothing
pinned), and `pinned`, 1 inter-op and 2 intra-op threads set before TensorFlow initialises (the
executor's single-thread order). Per case and threading, `--processes` (3) fresh child
processes under an emulated budget (CPU, BFC allocator, oneDNN off, 6 GiB) each measure the
step `model.fit` runs (`memfit.measure`'s default: Keras' own train function fed through a
`tf.data` iterator): one warm-up step, then the highest peak of `--steps` (5). The measured
peak is the highest of the processes (the run a user may get; the median is in the JSON): the
executor's order, and so the peak, is fixed when a process instantiates the step and differs
from one instantiation to the next. The first process also predicts, in the same threading:

- memfit: `memfit.estimate` (traced step replayed through executor + BFC model): its
  `peak_bytes`, and `high_bytes`, the high bound of its range, where the estimate has one;
- stackoverflow: the popular formula `4 bytes x (batch x sum of layer output elements +
  parameters)` (https://stackoverflow.com/q/43130435, the "rough estimate" answers);
- grappler: TensorFlow's own `Cluster.DeterminePeakMemoryUsage` on the same traced step graph
  (tensorflow/python/grappler/cluster.py, a virtual CPU cluster), plus the measured resident
  bytes (weights, optimizer state) that its graph does not hold.

Reported per case: the signed error (estimate - measured) / measured and whether the measured
peak lies in the range [peak_bytes, high_bytes]; per group and threading: median, p90 and max
of |error|, the share of cases the estimate is under the measured peak (unsafe), the share
with measured <= high_bytes (coverage) and the median of (high_bytes - measured) / measured.

Groups: `tuned-on`, the set the estimate was developed on (10 models at 96 px: the
keras.applications below, a keras-hub RetinaNet with a ResNet-10 encoder and a ViT-Tiny
classifier, both built from config), and `unseen`, families it was not: MobileNet (v1),
EfficientNetB3, RegNetX002 (`bench.models.regnetx002`: Keras 3 ships no RegNet),
InceptionResNetV2, DenseNet201 and the RetinaNet at two larger resolutions; and `holdout`,
families no change to the estimate was made by looking at (Xception, ResNet50V2,
EfficientNetV2B0, MobileNetV3Small and a U-Net segmenter, `bench.models.unet`); and `new`,
keras-hub families built from config to calibrate the bound on (`bench.calibration`: HGNetV2,
CSPNet, MiT, SegFormer, D-FINE; `bench.models.hub_model`). Each row names its family
(`FAMILY`) and the estimate's highest replayed and raced peaks. With `--jobs` above
1, processes run side by side: under default threading their thread pools then share the
cores, as on a busy machine.

    python -m bench.estimate_accuracy --quick                     # 2 models (< 10 minutes)
    python -m bench.estimate_accuracy --group unseen --optimizers adam --one-batch
    python -m bench.estimate_accuracy --out out.json              # both groups, both threadings
    python -m bench.estimate_accuracy --measure-only --out m.json # measure once ...
    python -m bench.estimate_accuracy --measured m.json           # ... estimate after each change

The measured peaks depend on TensorFlow and the machine, not on memfit's estimate: `--measured`
reuses an earlier run's (same selection of cases) and runs one estimating process per case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from helpers import run_isolated  # noqa: E402

from bench.machine import describe  # noqa: E402

# Wide enough for the per-case table when the output goes to a file.
console = Console(width=None if sys.stdout.isatty() else 220)


@dataclass(frozen=True)
class Spec:
    """One model of the benchmark: its image side, batch sizes and group."""

    model: str
    size: int
    batches: tuple[int, ...]
    group: str


TUNED_ON = [
    Spec(name, 96, (2, 4, 8), "tuned-on")
    for name in (
        "MobileNetV2",
        "ResNet50",
        "EfficientNetB0",
        "VGG16",
        "DenseNet121",
        "InceptionV3",
        "NASNetMobile",
        "ConvNeXtTiny",
        "RetinaNet",
        "ViT",
    )
]
# Sizes and batches so that one process (trace, warm-up, 5 steps, and the estimate in the
# first) takes well under a minute or two on 2 cores.
UNSEEN = [
    Spec("MobileNet", 128, (8, 16), "unseen"),
    Spec("EfficientNetB3", 96, (4, 8), "unseen"),
    Spec("RegNetX002", 128, (8, 16), "unseen"),
    Spec("InceptionResNetV2", 96, (4, 8), "unseen"),
    Spec("DenseNet201", 96, (4, 8), "unseen"),
    Spec("RetinaNet", 192, (2, 4), "unseen"),
    Spec("RetinaNet", 320, (2, 4), "unseen"),
]
# Checked once and never tuned on: no change to the estimate may be made by looking at them
# (a new family found wrong here goes to `unseen` once it is worked on, and a new holdout
# takes its place). A segmenter (`bench.models.unet`: transposed convolutions and skip
# concatenations) is among them.
HOLDOUT = [
    Spec("Xception", 96, (4, 8), "holdout"),
    Spec("ResNet50V2", 96, (4, 8), "holdout"),
    Spec("EfficientNetV2B0", 96, (4, 8), "holdout"),
    Spec("MobileNetV3Small", 128, (8, 16), "holdout"),
    Spec("UNet", 128, (4, 8), "holdout"),
]
# Families the replay had never seen when the bound was calibrated (`bench.calibration`):
# keras-hub backbones built from config (`bench.models.hub_model`), a segmenter and a
# DETR-family detector, at sizes where a step is quick on CPU.
NEW = [
    Spec("HGNetV2", 96, (4, 8), "new"),
    Spec("CSPNet", 96, (4, 8), "new"),
    Spec("MiT", 128, (4, 8), "new"),
    Spec("SegFormer", 128, (2, 4), "new"),
    Spec("DFine", 64, (2, 4), "new"),
]
# Each model's family, the unit `bench.calibration` holds out (never a case alone): versions
# and sizes of one design are one family (MobileNet v1-v3, EfficientNet B0/B3/V2, ResNet v1
# and v2, DenseNet 121/201, Inception v3 and Inception-ResNet). Xception, RegNet and ConvNeXt
# are their own (other blocks). A detector or segmenter is its own family though it shares an
# encoder's design with one: RetinaNet (a ResNet-10), D-FINE (a small HGNetV2), SegFormer
# (MiT-B0) and the U-Net.
FAMILY = {
    "MobileNet": "mobilenet",
    "MobileNetV2": "mobilenet",
    "MobileNetV3Small": "mobilenet",
    "EfficientNetB0": "efficientnet",
    "EfficientNetB3": "efficientnet",
    "EfficientNetV2B0": "efficientnet",
    "ResNet50": "resnet",
    "ResNet50V2": "resnet",
    "DenseNet121": "densenet",
    "DenseNet201": "densenet",
    "InceptionV3": "inception",
    "InceptionResNetV2": "inception",
    "Xception": "xception",
    "VGG16": "vgg",
    "NASNetMobile": "nasnet",
    "ConvNeXtTiny": "convnext",
    "RegNetX002": "regnet",
    "ViT": "vit",
    "RetinaNet": "retinanet",
    "UNet": "unet",
    "HGNetV2": "hgnetv2",
    "CSPNet": "cspnet",
    "MiT": "mit",
    "SegFormer": "segformer",
    "DFine": "dfine",
}
QUICK = [Spec("MobileNetV2", 96, (4,), "tuned-on"), Spec("MobileNet", 128, (8,), "unseen")]
THREADINGS = {"default": (0, 0), "pinned": (1, 2)}

CHILD = """
import memfit, keras, numpy as np
from memfit.backend import tf as tfb
from memfit.workload.workload import Workload
from memfit.measuring.measurer import measure_workload
tf = tfb.import_tf()
if {inter}:
    tf.config.threading.set_inter_op_parallelism_threads({inter})
if {intra}:
    tf.config.threading.set_intra_op_parallelism_threads({intra})
from bench.models import accuracy_model
name, size, batch, opt = {name!r}, {size}, {batch}, {opt!r}
optimizer = keras.optimizers.Adam() if opt == "adam" else keras.optimizers.SGD(momentum=0.9)
model, data = accuracy_model(name, size, batch, optimizer)
# The detector compiled itself with its losses and our optimizer: keep that compile.
workload = Workload(model, optimizer=None if data is not None else optimizer, data=data)
if {measure}:
    # The step model.fit runs (memfit.measure's default step): a warm-up, then {steps} steps.
    m = measure_workload(workload, batch, repeats={steps}, device="CPU:0", budget=None)
    measured = {{"peak": m.peak_bytes, "peaks": m.peaks_bytes, "resident": m.resident_bytes}}
else:
    # Estimate only (--measured): the peaks come from an earlier run's JSON.
    measured = {{"peak": None, "peaks": [], "resident": {resident}}}
if not {predict}:
    emit(measured)
    raise SystemExit(0)
resident = measured["resident"]
import time as _time
from memfit.estimation import bounds
# The bound before its allowance, so that bench.calibration can set the allowance offline:
# with none, the 5-step bound is max(highest replayed peak, raced peak).
allowance, bounds.ALLOWANCE = bounds.ALLOWANCE, 0.0
started = _time.perf_counter()
e = memfit.estimate(model, batch, data=data, steps=5)  # the bound of the 5 steps measured
bounds.ALLOWANCE = allowance
highest = max([e.order_peak_bytes or e.peak_bytes, *e.sample_peaks_bytes])
raw = e.step_high_bytes
raced = raw if raw is not None and raw > highest else 0
estimate_seconds = _time.perf_counter() - started
params = sum(int(np.prod(v.shape)) for v in model.weights)

def layer_outputs(model):
    total = 0
    for layer in model.layers:
        if getattr(layer, "layers", None):
            total += layer_outputs(layer)
            continue
        try:
            tensors = tf.nest.flatten(layer.output)
        except Exception:
            continue
        for t in tensors:
            total += int(np.prod([d for d in t.shape[1:] if d is not None]))
    return total

stackoverflow = 4 * (batch * layer_outputs(model) + params)
grappler = None
try:
    if not {grappler}:
        raise RuntimeError("not asked for (--no-grappler)")
    from memfit.backend import tf_trace
    from tensorflow.python.grappler import cluster as gcluster, item as gitem
    from tensorflow.core.protobuf import meta_graph_pb2, device_properties_pb2
    from tensorflow.core.framework import types_pb2
    specs = tf_trace.batch_specs(workload, batch)
    concrete = tf.function(model.train_step).get_concrete_function(specs)
    gd = concrete.graph.as_graph_def()
    device = "/job:localhost/replica:0/task:0/device:CPU:0"
    for node in gd.node:
        # Captured variables become variable handles, so grappler's virtual run can place them.
        if node.op == "Placeholder" and node.attr["dtype"].type == types_pb2.DT_RESOURCE:
            node.op = "VarHandleOp"
            node.attr["dtype"].type = types_pb2.DT_FLOAT
            node.attr["shape"].shape.unknown_rank = True
            node.attr["shared_name"].s = node.name.encode()
            node.attr["container"].s = b""
        node.device = device
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(gd)
    fetch = meta_graph_pb2.CollectionDef()
    for t in concrete.outputs:
        fetch.node_list.value.append(t.name)
    meta.collection_def["train_op"].CopyFrom(fetch)
    props = device_properties_pb2.DeviceProperties(type="CPU", memory_size=6 << 30, num_cores=2)
    named = device_properties_pb2.NamedDevice(name=device, properties=props)
    cl = gcluster.Cluster(devices=[named])
    report = cl.DeterminePeakMemoryUsage(gitem.Item(meta))
    grappler = int(max(v[0] for v in report.values()) + resident)
except Exception as exc:
    print("grappler failed:", exc)
# The bound as shipped: the highest replayed peak plus the allowance, or the raced peak.
high = None if raw is None else max(int(highest * (1 + allowance)), raced)
emit({{**measured, "memfit": e.peak_bytes, "memfit_high": high,
       "memfit_highest": highest, "memfit_raced": raced, "allowance": allowance,
       "memfit_order": e.order_peak_bytes, "memfit_samples": e.sample_peaks_bytes,
       "stackoverflow": stackoverflow, "grappler": grappler,
       "estimate_seconds": estimate_seconds,
       "phase": e.peak_moment.get("phase"), "layer": e.peak_moment.get("layer"),
       "op": e.peak_moment.get("op"),
       "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
       "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()}})
"""


def cases_for(
    specs: list[Spec],
    optimizers: list[str],
    threadings: list[str],
    batches: list[int] | None = None,
    size: int | None = None,
) -> list[dict[str, Any]]:
    """The cases to run: every spec x batch x optimizer x threading (`batches`/`size` override).

    Example:
        >>> [c["threads"] for c in cases_for(QUICK[:1], ["adam"], ["default", "pinned"])]
        ['default', 'pinned']
    """
    return [
        {
            "group": spec.group,
            "family": FAMILY.get(spec.model, spec.model.lower()),
            "model": spec.model,
            "size": size or spec.size,
            "batch_size": batch,
            "optimizer": opt,
            "threads": threads,
        }
        for spec in specs
        for batch in (batches or spec.batches)
        for opt in optimizers
        for threads in threadings
    ]


def one_batch(specs: list[Spec], *, largest: bool = False) -> list[Spec]:
    """Each spec with one batch size: its smallest, or its largest.

    Example:
        >>> one_batch([Spec("ResNet50", 96, (2, 4, 8), "tuned-on")], largest=True)[0].batches
        (8,)
    """
    pick = max if largest else min
    return [replace(spec, batches=(pick(spec.batches),)) for spec in specs]


def case_key(case: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a case across runs: group, model, size, batch, optimizer, threading."""
    return tuple(case[k] for k in ("group", "model", "size", "batch_size", "optimizer", "threads"))


def measured_rows(path: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The measured rows of an earlier run's JSON (`--out`), by `case_key`.

    Raises:
        SystemExit: the file is missing or is not this benchmark's output.
    """
    try:
        with open(path) as handle:
            rows = json.load(handle)["rows"]
        return {case_key(row): row for row in rows}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"--measured {path}: not a bench.estimate_accuracy --out file ({exc})"
        ) from None


def error(predicted: int | None, measured: int) -> float | None:
    """Signed relative error (predicted - measured) / measured; None without a prediction."""
    return None if predicted is None else (predicted - measured) / measured


def in_range(low: int, high: int | None, measured: int) -> bool | None:
    """Whether `measured` lies in [low, high]; None when the estimate has no high bound."""
    return None if high is None else low <= measured <= high


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, p90 and max |error|, the unsafe share, coverage and high margin of `rows`.

    Example:
        >>> s = summarise([{"memfit_error": -0.1, "measured": 100, "memfit": 90,
        ...                 "memfit_high": 120, "stackoverflow_error": 0.5,
        ...                 "grappler_error": None}])
        >>> s["memfit"]["unsafe"], s["memfit"]["coverage"], s["memfit"]["high_margin_median"]
        (1.0, 1.0, 0.2)
    """
    summary: dict[str, Any] = {"cases": len(rows)}
    for method in ("memfit", "stackoverflow", "grappler"):
        errors = [r[f"{method}_error"] for r in rows if r[f"{method}_error"] is not None]
        if not errors:
            summary[method] = None
            continue
        size = [abs(e) for e in errors]
        summary[method] = {
            "n": len(errors),
            "median": statistics.median(size),
            "p90": _quantile(size, 0.9),
            "max": max(size),
            "worst_signed": max(errors, key=abs),
            "unsafe": sum(e < 0 for e in errors) / len(errors),
        }
    ranged = [r for r in rows if r.get("memfit_high") is not None]
    if summary["memfit"] is not None:
        summary["memfit"]["coverage"] = (
            sum(r["measured"] <= r["memfit_high"] for r in ranged) / len(ranged) if ranged else None
        )
        summary["memfit"]["in_range"] = (
            sum(bool(in_range(r["memfit"], r["memfit_high"], r["measured"])) for r in ranged)
            / len(ranged)
            if ranged
            else None
        )
        summary["memfit"]["high_margin_median"] = (
            statistics.median((r["memfit_high"] - r["measured"]) / r["measured"] for r in ranged)
            if ranged
            else None
        )
    return summary


def _pct(value: float | None, signed: bool = True) -> str:
    return "n/a" if value is None else (f"{value:+.1%}" if signed else f"{value:.1%}")


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f}"


def case_table(rows: list[dict[str, Any]], title: str) -> Table:
    """The per-case table: estimate, its high bound, the measured peaks and the errors."""
    table = Table(title=title)
    for column in (
        "group",
        "model",
        "px",
        "opt",
        "batch",
        "threads",
        "estimate MiB",
        "high MiB",
        "measured max MiB",
        "each process MiB",
        "error",
        "in range",
        "stackoverflow",
        "grappler",
        "peak moment",
    ):
        table.add_column(column, justify="left" if column in ("group", "model") else "right")
    for row in rows:
        ranged = in_range(row["memfit"], row["memfit_high"], row["measured"])
        table.add_row(
            row["group"],
            row["model"],
            str(row["size"]),
            row["optimizer"],
            str(row["batch_size"]),
            row["threads"],
            _mib(row["memfit"]),
            _mib(row["memfit_high"]),
            _mib(row["measured"]),
            ", ".join(f"{p / 2**20:.0f}" for p in row["measured_each"]),
            _pct(row["memfit_error"]),
            "n/a" if ranged is None else ("yes" if ranged else "no"),
            _pct(row["stackoverflow_error"]),
            _pct(row["grappler_error"]),
            f"{row.get('phase')}, {row.get('layer') or row.get('op')}",
        )
    return table


def summary_table(summaries: dict[str, dict[str, Any]]) -> Table:
    """One line per group and threading: memfit's figures and the baselines' medians."""
    table = Table(title="memfit.estimate against the measured max (|error| unless signed)")
    for column in (
        "group / threads",
        "cases",
        "median",
        "p90",
        "max (signed)",
        "unsafe",
        "coverage",
        "in range",
        "high margin",
        "stackoverflow median",
        "grappler median",
    ):
        table.add_column(column, justify="left" if column == "group / threads" else "right")
    for key, s in summaries.items():
        m = s["memfit"]
        if m is None:
            continue
        table.add_row(
            key,
            str(s["cases"]),
            _pct(m["median"], False),
            _pct(m["p90"], False),
            _pct(m["worst_signed"]),
            _pct(m["unsafe"], False),
            _pct(m["coverage"], False),
            _pct(m["in_range"], False),
            _pct(m["high_margin_median"]),
            _pct(s["stackoverflow"] and s["stackoverflow"]["median"], False),
            _pct(s["grappler"] and s["grappler"]["median"], False),
        )
    return table


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; print the tables; write JSON with `--out`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="MobileNetV2 and MobileNet, Adam.")
    parser.add_argument(
        "--group",
        choices=("tuned-on", "unseen", "holdout", "new", "all"),
        default="all",
        help="tuned-on: the 10 models the estimate was developed on; unseen: the new families; "
        "holdout: families never tuned on (checked, not worked on); new: keras-hub families "
        "added to calibrate the bound (bench.calibration).",
    )
    parser.add_argument(
        "--models",
        nargs="*",
        help="Only these models (keras.applications names, RetinaNet, ViT, RegNetX002, UNet, "
        "HGNetV2, CSPNet, MiT, SegFormer, DFine).",
    )
    parser.add_argument("--size", type=int, help="Image side in pixels (default: per model).")
    parser.add_argument("--batches", help="Comma-separated batch sizes (default: per model).")
    parser.add_argument(
        "--one-batch", action="store_true", help="Only each model's smallest batch size."
    )
    parser.add_argument(
        "--largest-batch", action="store_true", help="Only each model's largest batch size."
    )
    parser.add_argument(
        "--optimizers",
        help="Comma-separated: adam, sgd (default both; with --quick, adam).",
    )
    parser.add_argument(
        "--threads",
        choices=("default", "pinned", "both"),
        default="both",
        help="default: TensorFlow's own thread pools; pinned: 1 inter-op, 2 intra-op threads.",
    )
    parser.add_argument("--jobs", type=int, default=2, help="Child processes at once.")
    parser.add_argument(
        "--processes",
        type=int,
        default=3,
        help="Fresh processes per case and threading; the measured peak is their highest.",
    )
    parser.add_argument(
        "--steps", type=int, default=5, help="Measured steps after the warm-up (default 5)."
    )
    parser.add_argument(
        "--no-grappler",
        dest="grappler",
        action="store_false",
        help="Leave out the grappler baseline (a second trace in each predicting process).",
    )
    parser.add_argument(
        "--measure-only",
        action="store_true",
        help="Measure the cases and predict nothing (their JSON feeds --measured later).",
    )
    parser.add_argument(
        "--measured",
        metavar="JSON",
        help="Take the measured peaks from an earlier run's --out and only estimate again: "
        "one process per case (the peaks depend on TensorFlow, not on memfit's estimate).",
    )
    parser.add_argument("--out", help="Write results as JSON here.")
    args = parser.parse_args(argv)
    if args.measure_only and args.measured:
        parser.error("--measure-only and --measured exclude each other")

    specs = QUICK if args.quick else TUNED_ON + UNSEEN + HOLDOUT + NEW
    if args.group != "all":
        specs = [s for s in specs if s.group == args.group]
    if args.models:
        specs = [s for s in specs if s.model in args.models]
    optimizers = [
        o.strip() for o in (args.optimizers or ("adam" if args.quick else "adam,sgd")).split(",")
    ]
    if not specs or any(o not in ("adam", "sgd") for o in optimizers):
        parser.error("no model selected, or an optimizer other than adam and sgd")
    threadings = ["default", "pinned"] if args.threads == "both" else [args.threads]
    batches = [int(b) for b in args.batches.split(",")] if args.batches else None
    if args.one_batch and args.largest_batch:
        parser.error("--one-batch and --largest-batch exclude each other")
    if args.one_batch or args.largest_batch:
        specs = one_batch(specs, largest=args.largest_batch)
    cases = cases_for(specs, optimizers, threadings, batches, args.size)
    earlier: dict[tuple[Any, ...], dict[str, Any]] = {}
    if args.measured:
        earlier = measured_rows(args.measured)
        missing = [c for c in cases if case_key(c) not in earlier]
        if missing:
            console.print(f"{len(missing)} cases are not in {args.measured}: left out")
        cases = [c for c in cases if case_key(c) in earlier]
        if not cases:
            parser.error(f"none of the selected cases is in {args.measured}")
    processes = 1 if args.measured else max(1, args.processes)
    jobs = [(index, p) for index in range(len(cases)) for p in range(processes)]
    # Children import bench.models: the repository root goes on their path, ahead of the
    # inherited one (which names the memfit sources to run, if set).
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env = {"MEMFIT_MEMORY": "6GiB", "PYTHONPATH": path}
    started = time.perf_counter()
    load_before = os.getloadavg()
    done: list[int] = [0]
    console.print(
        f"{len(cases)} cases x {processes} processes = {len(jobs)} processes, {args.jobs} at once"
    )

    def run(job: tuple[int, int]) -> dict[str, Any] | None:
        index, process = job
        case = cases[index]
        inter, intra = THREADINGS[case["threads"]]
        before = earlier.get(case_key(case))
        code = CHILD.format(
            name=case["model"],
            size=case["size"],
            batch=case["batch_size"],
            opt=case["optimizer"],
            inter=inter,
            intra=intra,
            steps=args.steps,
            measure=before is None,
            resident=before["resident"] if before else None,
            predict=process == 0 and not args.measure_only,
            grappler=args.grappler,
        )
        label = (
            f"{case['model']} {case['size']}px b{case['batch_size']} {case['optimizer']} "
            f"{case['threads']} #{process + 1}"
        )
        began = time.perf_counter()
        try:
            result = run_isolated(code, env, 1800)
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            console.print(f"{label}: [red]failed[/] {str(exc)[-300:]}")
            result = None
        done[0] += 1
        seconds = time.perf_counter() - began
        if result is not None:
            result["seconds"] = seconds
            extra = ""
            if "memfit" in result:
                extra = (
                    f", estimate {_mib(result['memfit'])} MiB (high "
                    f"{_mib(result['memfit_high'])}) in {result['estimate_seconds']:.0f} s"
                )
            measured_text = (
                "measured earlier"
                if result["peak"] is None
                else f"{_mib(result['peak'])} MiB measured"
            )
            console.print(
                f"[{done[0]}/{len(jobs)}] {label}: {measured_text}{extra} "
                f"({seconds:.0f} s; {time.perf_counter() - started:.0f} s in all)"
            )
        return result

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(run, jobs))

    rows = []
    for index, case in enumerate(cases):
        runs = results[index * processes : (index + 1) * processes]
        first = runs[0]
        if first is None or any(r is None for r in runs):
            continue
        before = earlier.get(case_key(case))
        each = before["measured_each"] if before else [r["peak"] for r in runs]
        measured = max(each)
        row = {
            **case,
            "measured": measured,
            "measured_median": sorted(each)[(len(each) - 1) // 2],
            "measured_each": each,
            "peaks": before["peaks"] if before else [p for r in runs for p in r["peaks"]],
            "process_seconds": [r["seconds"] for r in runs],
            **{k: v for k, v in first.items() if k not in ("peak", "peaks", "seconds")},
            "measured_in": args.measured or "this run",
        }
        if "memfit" not in first:  # --measure-only
            rows.append(row)
            continue
        for method in ("memfit", "stackoverflow", "grappler"):
            row[f"{method}_error"] = error(first[method], measured)
        row["memfit_error_vs_median"] = error(first["memfit"], row["measured_median"])
        row["in_range"] = in_range(first["memfit"], first["memfit_high"], measured)
        rows.append(row)

    if args.measure_only:
        console.print(f"measured {len(rows)} of {len(cases)} cases; estimate with --measured")
    else:
        title = "Predicted vs measured peak (CPU, BFC, highest of processes)"
        console.print(case_table(rows, title))
    summaries = {}
    for group in ("tuned-on", "unseen", "holdout", "new"):
        for threads in threadings:
            selected = [
                r for r in rows if r["group"] == group and r["threads"] == threads and "memfit" in r
            ]
            if selected:
                summaries[f"{group} / {threads}"] = summarise(selected)
    if summaries:
        console.print(summary_table(summaries))
    failed = len(cases) - len(rows)
    if failed:
        console.print(f"[red]{failed} of {len(cases)} cases failed[/] (left out of the tables)")
    result = {
        "rows": rows,
        "summary": summaries,
        "failed_cases": failed,
        "machine": {
            **describe("CPU BFC (MEMFIT_MEMORY=6GiB in each child, one region), oneDNN off"),
            "threads": {k: {"inter_op": v[0], "intra_op": v[1]} for k, v in THREADINGS.items()},
            "jobs": args.jobs,
            "processes_per_case": processes,
            "measured_steps": args.steps,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "seconds": time.perf_counter() - started,
        "command": " ".join(["python -m bench.estimate_accuracy", *(argv or sys.argv[1:])]),
    }
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
