"""Benchmark: grappler under memfit's config against TensorFlow's default, node for node.

`memfit.estimate` runs grappler (`tf_grappler.grappler_graph`) on every traced step with a
config that leaves out passes which cannot change what it reads: each node's position, op
type and data inputs (`tf_grappler.grappler_config`). This checks that claim and prices it.
For each step (model, image side, batch; some with recompute, SGD or mixed precision) a
fresh child traces the training step as the estimate does, then runs grappler on the same
traced graph with TensorFlow's default config and with memfit's, alternating `--repeats`
times, and compares the nodes. `--set FIELD=VALUE` changes memfit's config first (a field of
TensorFlow's `RewriterConfig`, a value of its enums): the way to try another pass off.

    python -m bench.grappler_config --quick
    python -m bench.grappler_config --set remapping=OFF --models MobileNetV2
    python -m bench.grappler_config --set memory_optimization=NO_MEM_OPT --out out.json

A config may leave out only what changes no node on any step here; CPU-seconds are the
child's own (`time.process_time`), grappler's threads included.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from helpers import run_isolated  # noqa: E402

from bench.machine import describe  # noqa: E402

console = Console()

# (model, image side or sequence length, batch, variant): the steps `grappler_config` was
# checked on, and a few more kinds of graph (a dense MLP, a ViT, the detector).
CASES = [
    ("ResNet50", 224, 32, ""),
    ("ResNet50", 96, 4, "mixed_float16"),
    ("MobileNetV2", 96, 4, ""),
    ("MobileNetV2", 96, 16, "recompute"),
    ("MobileNetV2", 96, 4, "sgd"),
    ("EfficientNetB0", 96, 4, ""),
    ("DenseNet121", 64, 4, ""),
    ("InceptionV3", 96, 4, ""),
    ("VGG16", 96, 2, ""),
    ("NASNetMobile", 96, 4, ""),
    ("ConvNeXtTiny", 96, 2, ""),
    ("RNN", 20, 8, ""),
    ("RetinaNet", 192, 2, ""),
    ("RetinaNet", 192, 2, "recompute"),
    ("MLP", 64, 32, ""),
    ("ViT", 96, 4, ""),
]
QUICK = [("MobileNetV2", 96, 4, ""), ("RNN", 20, 8, "")]

CHILD = """
import sys, time, contextlib, keras
sys.path.insert(0, {root!r})
from memfit.backend import tf as tfb, tf_grappler, tf_trace
from memfit.workload.workload import Workload
from memfit.recomputation.remat import as_recompute
from bench.grappler_config import changed_config
tf = tfb.import_tf()
name, side, batch, variant = {case!r}
if variant == "mixed_float16":
    keras.mixed_precision.set_global_policy("mixed_float16")
optimizer = keras.optimizers.SGD(momentum=0.9) if variant == "sgd" else keras.optimizers.Adam()
data = None
if name == "MLP":
    layers = [keras.layers.Dense(256, activation="relu") for _ in range(2)]
    head = keras.layers.Dense(10, activation="softmax")
    model = keras.Sequential([keras.Input((side,)), *layers, head])
elif name == "RNN":
    model = keras.Sequential([
        keras.Input((side, 16)),
        keras.layers.LSTM(32, return_sequences=True),
        keras.layers.GRU(32),
        keras.layers.Dense(10, activation="softmax"),
    ])
else:
    from bench.models import accuracy_model
    model, data = accuracy_model(name, side, batch, optimizer)
workload = Workload(model, optimizer=None if data is not None else optimizer, data=data)
if workload.model.optimizer is not None and not workload.model.optimizer.built:
    workload.model.optimizer.build(workload.model.trainable_variables)
traced = {{}}
run_grappler = tf_grappler.grappler_graph

def keep(graph_def, fetches, controls=()):
    traced["args"] = (graph_def, list(fetches), list(controls))
    return {{}}  # the comparison below runs grappler on it

tf_trace.grappler_graph = keep
segments = as_recompute(workload.model, "sqrt") if variant == "recompute" else None
with segments if segments is not None else contextlib.nullcontext():
    tf_trace.start_trace(workload, batch).result()
graph_def, fetches, controls = traced["args"]
ours = tf_grappler.grappler_config
configs = {{
    "default": tf.compat.v1.ConfigProto,  # TensorFlow's own
    "memfit": lambda: changed_config({settings!r}, ours),
}}
nodes, seconds = {{}}, {{"default": [], "memfit": []}}
for _ in range({repeats}):
    for label, config in configs.items():
        tf_grappler.grappler_config = config
        started = time.process_time()
        found = run_grappler(graph_def, fetches, controls)
        seconds[label].append(round(time.process_time() - started, 3))
        nodes[label] = {{n: [node.rank, node.type, node.inputs] for n, node in found.items()}}
default, memfit = nodes["default"], nodes["memfit"]
differ = sorted(n for n in set(default) | set(memfit) if default.get(n) != memfit.get(n))
moved = [n for n in differ if n in default and n in memfit and default[n][1:] == memfit[n][1:]]
emit({{
    "nodes": len(default),
    "same": bool(default) and not differ,  # no nodes: grappler failed
    "differ": len(differ),
    "moved_only": len(moved),
    "examples": differ[:3],
    "default_cpu_s": seconds["default"],
    "memfit_cpu_s": seconds["memfit"],
}})
"""


def parse_settings(items: list[str]) -> dict[str, str]:
    """`FIELD=VALUE` strings as a dict, with one clear error for a malformed one.

    Example:
        >>> parse_settings(["remapping=OFF"])
        {'remapping': 'OFF'}
    """
    settings = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep or not field or not value:
            raise SystemExit(f"--set takes FIELD=VALUE (a RewriterConfig field), got {item!r}")
        settings[field] = value
    return settings


def changed_config(settings: dict[str, str], base: Any = None) -> Any:
    """memfit's grappler config with `settings` applied to its rewrite options.

    A value is a name of one of `RewriterConfig`'s enums (`OFF`, `NO_MEM_OPT`, ...), else
    `true`/`false`, else a whole number. `base` makes the config to change (default:
    `tf_grappler.grappler_config`).

    Example:
        >>> config = changed_config({"remapping": "OFF"})
        >>> config.graph_options.rewrite_options.remapping
        2
    """
    from tensorflow.core.protobuf import rewriter_config_pb2

    from memfit.backend.tf_grappler import grappler_config

    config = (base or grappler_config)()
    rewrite = config.graph_options.rewrite_options
    for field, text in settings.items():
        if not hasattr(rewrite, field):
            raise ValueError(f"RewriterConfig has no field {field!r}")
        value: Any
        if hasattr(rewriter_config_pb2.RewriterConfig, text):
            value = getattr(rewriter_config_pb2.RewriterConfig, text)
        elif text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            value = int(text)
        setattr(rewrite, field, value)
    return config


def run_case(case: tuple[str, int, int, str], settings: dict[str, str], repeats: int) -> dict:
    """One step's comparison, in a fresh child process."""
    code = CHILD.format(root=ROOT, case=case, settings=settings, repeats=repeats)
    result = run_isolated(code, timeout=1800)
    name, side, batch, variant = case
    return {"model": name, "side": side, "batch": batch, "variant": variant, **result}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print its table; `--out` writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 small steps")
    parser.add_argument("--models", nargs="*", help="only these models")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="change memfit's config"
    )
    parser.add_argument("--repeats", type=int, default=2, help="grappler runs per config")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    settings = parse_settings(args.set)
    changed_config(settings)  # a bad field or value fails here, before any child
    cases = QUICK if args.quick else CASES
    if args.models:
        cases = [c for c in cases if c[0] in args.models]
    started = time.perf_counter()
    results = []
    for case in cases:
        console.print(f"{case[0]} {case[1]} b{case[2]} {case[3]} ...")
        results.append(run_case(case, settings, args.repeats))
    title = "grappler: memfit's config" + (f" with {args.set}" if args.set else "")
    table = Table(title=f"{title} against TensorFlow's default")
    for column in ("step", "nodes", "same nodes", "differ (moved only)", "CPU-s default", "memfit"):
        table.add_column(column)
    for r in results:
        table.add_row(
            f"{r['model']} {r['side']} b{r['batch']} {r['variant']}".strip(),
            str(r["nodes"]),
            "yes" if r["same"] else "NO",
            f"{r['differ']} ({r['moved_only']})",
            f"{_mean(r['default_cpu_s']):.2f}",
            f"{_mean(r['memfit_cpu_s']):.2f}",
        )
    console.print(table)
    console.print(f"{len(results)} steps in {time.perf_counter() - started:.0f} s")
    if args.out:
        with open(args.out, "w") as handle:
            report = {"machine": describe(), "settings": settings, "results": results}
            json.dump(report, handle, indent=1)
    return 0 if all(r["same"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
