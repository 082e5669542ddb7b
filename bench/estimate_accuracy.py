"""Benchmark: memfit.estimate's predicted peak against the measured one, and two baselines.

For each model x batch size x optimizer (Adam; SGD with momentum 0.9), `--processes` (3) fresh
child processes under an emulated budget (CPU, BFC allocator, oneDNN off) each measure the step
as `memfit.measure` does (one warm-up, then the highest peak of 3 steps); the measured peak is
their median, because the executor's order, and so the peak, is fixed when a process
instantiates the step and can differ from one instantiation to the next (ResNet50 96 px
batch 2 Adam: 337 MiB in most, 345-475 MiB in some; see `memfit.estimate.simulate`). The
first of them then also predicts it three ways:

- memfit: `memfit.estimate` (traced step replayed through executor + BFC model);
- stackoverflow: the popular formula `4 bytes x (batch x sum of layer output elements +
  parameters)` (https://stackoverflow.com/q/43130435, the "rough estimate" answers);
- grappler: TensorFlow's own `Cluster.DeterminePeakMemoryUsage` on the same traced step graph
  (tensorflow/python/grappler/cluster.py, a virtual CPU cluster), plus the measured resident
  bytes (weights, optimizer state) that its graph does not hold.

Conditions (what the estimate predicts): TensorFlow's thread pools are pinned in every child
before it initialises, 1 inter-op thread and `--intra-op-threads` (default 2) intra-op threads,
so the executor runs ops in its single-thread order and the memory does not depend on how busy
the machine is; measuring and estimating read the same settings. Models: the keras.applications
below (weights=None, 10 classes) and two keras-hub models built from config (no download):
RetinaNet with a ResNet-10 encoder (`memfit.zoo.retinanet`, generated detection samples) and a
ViT-Tiny classifier with 8-pixel patches (`memfit.zoo.vit_classifier`).

    python -m bench.estimate_accuracy --quick            # 2 models, 96 px (about 15 minutes)
    python -m bench.estimate_accuracy --out out.json     # all 10 models, 96 px
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from helpers import run_isolated  # noqa: E402

console = Console()

MODELS = [
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
]
QUICK = ["MobileNetV2", "ResNet50"]

CHILD = """
import memfit, keras, numpy as np
from memfit.backend import tf as tfb
from memfit.workload import Workload
from memfit.measure import measure_workload, _build_optimizer
tf = tfb.import_tf()
if {inter}:
    tf.config.threading.set_inter_op_parallelism_threads({inter})
if {intra}:
    tf.config.threading.set_intra_op_parallelism_threads({intra})
name, size, batch, opt = {name!r}, {size}, {batch}, {opt!r}
optimizer = keras.optimizers.Adam() if opt == "adam" else keras.optimizers.SGD(momentum=0.9)
data = None
if name == "RetinaNet":
    from memfit import zoo
    model = zoo.retinanet(size, compile=False)
    model.compile(optimizer=optimizer)
    data = zoo.detection_samples(batch, size)
elif name == "ViT":
    from memfit import zoo
    model = zoo.vit_classifier(size, num_classes=10)
else:
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10)
# The detector compiled itself with its losses and our optimizer: keep that compile.
workload = Workload(model, optimizer=None if data is not None else optimizer, data=data)
_build_optimizer(model)
m = measure_workload(workload, batch, repeats=3, device="CPU:0", budget=None)
measured = {{"peak": m.peak_bytes, "peaks": m.peaks_bytes, "resident": m.resident_bytes}}
if {only_measure}:
    emit(measured)
    raise SystemExit(0)
resident = m.resident_bytes
e = memfit.estimate(model, batch, data=data)
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
emit({{**measured, "memfit": e.peak_bytes, "stackoverflow": stackoverflow, "grappler": grappler,
       "phase": e.peak_moment.get("phase"), "layer": e.peak_moment.get("layer"),
       "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
       "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()}})
"""


def _error(predicted: int | None, measured: int) -> float | None:
    return None if predicted is None else (predicted - measured) / measured


def _stats(errors: list[float]) -> dict[str, float | None]:
    values = sorted(abs(e) for e in errors)
    if not values:
        return {"median": None, "p90": None, "max": None}
    p90 = values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]
    return {"median": statistics.median(values), "p90": p90, "max": values[-1]}


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; print the table; write JSON with `--out`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 models at 96 px.")
    parser.add_argument("--models", nargs="*", help="keras.applications names, RetinaNet or ViT.")
    parser.add_argument("--size", type=int, default=96, help="Image side in pixels.")
    parser.add_argument("--batches", default="2,4,8", help="Comma-separated batch sizes.")
    parser.add_argument(
        "--inter-op-threads",
        type=int,
        default=1,
        help="TensorFlow inter-op threads in each child (default 1: the executor's "
        "single-thread order, which memfit predicts; 0: TensorFlow's default).",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=2,
        help="TensorFlow intra-op threads in each child (default 2; 0: TensorFlow's default).",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="Child processes at once (memory does not depend on it: threads are pinned).",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=3,
        help="Fresh processes that measure each case; the measured peak is their median "
        "(default 3).",
    )
    parser.add_argument("--out", help="Write results as JSON here.")
    args = parser.parse_args(argv)
    models = args.models or (QUICK if args.quick else MODELS)
    size = args.size
    batches = [int(b) for b in args.batches.split(",")]
    started = time.perf_counter()
    cases = [(name, opt, batch) for name in models for opt in ("adam", "sgd") for batch in batches]

    def run(case: tuple[str, str, int]) -> dict[str, Any] | None:
        name, opt, batch = case
        settings = dict(
            name=name,
            size=size,
            batch=batch,
            opt=opt,
            inter=args.inter_op_threads,
            intra=args.intra_op_threads,
        )
        env = {"MEMFIT_MEMORY": "6GiB"}
        try:
            # Each fresh process instantiates the step anew, and the executor's order (so
            # the peak) can differ between instantiations: the median of several processes.
            # The first process also predicts (after measuring: predicting allocates none of
            # the step's tensors).
            r = run_isolated(CHILD.format(only_measure=False, **settings), env, 1800)
            runs = [r] + [
                run_isolated(CHILD.format(only_measure=True, **settings), env, 1800)
                for _ in range(max(1, args.processes) - 1)
            ]
            measured = sorted(run["peak"] for run in runs)[(len(runs) - 1) // 2]
            resident = runs[0]["resident"]
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            console.print(f"{name} {size}px batch {batch} {opt}: [red]failed[/] {str(exc)[-300:]}")
            return None
        row = {
            "model": name,
            "size": size,
            "batch_size": batch,
            "optimizer": opt,
            "measured": measured,
            "measured_each": [run["peak"] for run in runs],
            **{k: v for k, v in r.items() if k not in ("peak", "peaks")},
            "peaks": [p for run in runs for p in run["peaks"]],
            "resident": resident,
        }
        for method in ("memfit", "stackoverflow", "grappler"):
            row[f"{method}_error"] = _error(r[method], measured)
        console.print(
            f"{name} {size}px batch {batch} {opt}: measured {measured / 2**20:.1f} MiB, "
            f"memfit {row['memfit_error']:+.1%}"
        )
        return row

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = [row for row in pool.map(run, cases) if row is not None]
    table = Table(title=f"Predicted vs measured peak (CPU, BFC, {size}px)")
    for column in (
        "model",
        "opt",
        "batch",
        "measured MiB",
        "spread MiB",
        "memfit",
        "stackoverflow",
        "grappler",
    ):
        table.add_column(column, justify="right" if column != "model" else "left")
    for row in rows:
        spread = (max(row["peaks"]) - min(row["peaks"])) / 2**20

        def pct(value: float | None) -> str:
            return "n/a" if value is None else f"{value:+.1%}"

        table.add_row(
            row["model"],
            row["optimizer"],
            str(row["batch_size"]),
            f"{row['measured'] / 2**20:.1f}",
            f"{spread:.1f}",
            pct(row["memfit_error"]),
            pct(row["stackoverflow_error"]),
            pct(row["grappler_error"]),
        )
    console.print(table)
    summary = {}
    for method in ("memfit", "stackoverflow", "grappler"):
        errors = [r[f"{method}_error"] for r in rows if r[f"{method}_error"] is not None]
        summary[method] = _stats(errors)
        s = summary[method]
        if s["median"] is not None:
            console.print(
                f"{method:>14}: median {s['median']:.1%}  p90 {s['p90']:.1%}  "
                f"max {s['max']:.1%}  (|error|, n={len(errors)})"
            )
    per_model_better = {}
    for name in models:
        mine = [abs(r["memfit_error"]) for r in rows if r["model"] == name]
        others = {
            m: [
                abs(r[f"{m}_error"])
                for r in rows
                if r["model"] == name and r[f"{m}_error"] is not None
            ]
            for m in ("stackoverflow", "grappler")
        }
        if mine:
            per_model_better[name] = {
                m: (statistics.median(mine) < statistics.median(v)) if v else None
                for m, v in others.items()
            }
    console.print(f"memfit better than the baseline (median per model): {per_model_better}")
    import tensorflow as tf

    result = {
        "rows": rows,
        "summary": summary,
        "better_per_model": per_model_better,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "tensorflow": tf.__version__,
            "allocator": "CPU BFC (TF_CPU_ALLOCATOR_USE_BFC), oneDNN off, 6 GiB cap",
            "inter_op_threads": args.inter_op_threads,
            "intra_op_threads": args.intra_op_threads,
            "jobs": args.jobs,
            "processes_per_case": args.processes,
            "affinity_cpus": len(os.sched_getaffinity(0)),
        },
        "seconds": time.perf_counter() - started,
        "command": " ".join(["python -m bench.estimate_accuracy", *(argv or sys.argv[1:])]),
    }
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
