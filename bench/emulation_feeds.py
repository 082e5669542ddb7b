"""Benchmark: what an emulated card counts of the input pipeline, feed by feed.

A GPU holds the batch a step reads; the input pipeline's buffers (shuffle, map, prefetch)
stay in host memory. On a CPU-emulated card every tensor TensorFlow allocates counts, so
`memfit.fit` runs a `tf.data` pipeline (and Keras' pipeline for arrays) on a local tf.data
service worker and copies the batch a step reads onto the card. This trains each model 3 +
`--steps` (20) steps with `memfit.fit` in a fresh process per feed, under one emulated card,
fed (a) NumPy arrays, (b) a `tf.data` pipeline with `shuffle(1000)` and
`prefetch(AUTOTUNE)` (for the detector: its TFRecord pipeline, `memfit.data.
detection_pipeline`, JPEG records at full size), (c) a Python generator, and the same
pipelines without the service (`data_service=None`: the buffers on the card, as before);
against the same steps fed one batch repeated. Reported: the highest step peak of the last
`--steps` steps and the median bytes in use between them, as ratio and difference to one batch.

    python -m bench.emulation_feeds --quick          # the small conv net only
    python -m bench.emulation_feeds --out feeds.json  # conv net, MobileNetV2, RetinaNet 512 px
    python -m bench.emulation_feeds --pinned --models convnet MobileNetV2   # one thread
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from helpers import run_isolated  # noqa: E402

from bench.machine import describe  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 200)
BUDGET = "6GiB"
FEEDS = ("one", "arrays", "tfdata", "generator", "arrays (no service)", "tfdata (no service)")


@dataclass(frozen=True)
class Case:
    """A model at an image size and batch."""

    model: str
    size: int
    batch: int


CASES = [Case("convnet", 96, 8), Case("MobileNetV2", 224, 8), Case("RetinaNet", 512, 2)]

CHILD = """
import memfit  # first: the emulated card, before TensorFlow
from bench.emulation_feeds import child
emit(child({model!r}, {size}, {batch}, {feed!r}, {steps}, {data!r}, {pinned!r}))
"""


def child(
    model_name: str, size: int, batch: int, feed: str, steps: int, data: str, pinned: bool = False
) -> dict:
    """In a fresh, emulated process: train 3 + `steps` steps fed by `feed`; what they held."""
    import keras
    import numpy as np
    import tensorflow as tf

    import memfit

    if pinned:  # one inter-op thread: every step runs its ops in one order, peaks repeat
        tf.config.threading.set_inter_op_parallelism_threads(1)
    from memfit import zoo

    keras.utils.set_random_seed(0)
    total = 3 + steps
    samples = total * batch  # the arrays: one epoch of exactly the steps measured
    detector = model_name == "RetinaNet"
    if detector:
        model = zoo.retinanet(None)
        images, targets = [], {"boxes": [], "labels": []}
        for image, target in zoo.detection_samples(samples, size).as_numpy_iterator():
            images.append(image)
            targets["boxes"].append(target["boxes"])
            targets["labels"].append(target["labels"])
        x = np.stack(images)
        y = {k: np.stack(v) for k, v in targets.items()}
    else:
        if model_name == "convnet":
            model = keras.Sequential([
                keras.Input((size, size, 3)),
                keras.layers.Conv2D(16, 3, activation="relu"),
                keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(10),
            ])
        else:
            model = keras.applications.MobileNetV2(
                input_shape=(size, size, 3), weights=None, classes=10
            )
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x = np.random.default_rng(0).random((samples, size, size, 3), dtype=np.float32)
        y = np.random.default_rng(1).integers(0, 10, samples)

    def take(i: int) -> Any:
        part = slice(i, i + batch)
        return x[part], (y[part] if not detector else {k: v[part] for k, v in y.items()})

    in_use: list[int] = []
    peaks: list[int] = []

    class Probe(keras.callbacks.Callback):
        def on_train_batch_end(self, index: int, logs: Any = None) -> None:
            step = self.model.train_function.guarded_step
            in_use.append(tf.config.experimental.get_memory_info("CPU:0")["current"])
            peaks.append(max(step._gradients_peak, step._update_peak))

    service = None if "no service" in feed else "auto"
    fit = dict(epochs=1, verbose=0, callbacks=[Probe()], data_service=service)
    started = time.perf_counter()
    if detector and feed == "generator":
        return {"skipped": "keras-hub's fit takes no generator"}
    if detector and feed == "one":
        # keras-hub's fit takes no generator: the one batch as a dataset, read from the
        # service so it is copied onto the card for each step, as a GPU copies it.
        one_batch = tf.data.Dataset.from_tensors(take(0)).repeat()
        memfit.fit(model, one_batch, steps_per_epoch=total, **dict(fit, data_service=1))
    elif feed == "one":
        def one() -> Any:
            while True:
                yield take(0)

        memfit.fit(model, one(), steps_per_epoch=total, **fit)
    elif feed == "generator":
        def random_batches() -> Any:
            rng = np.random.default_rng(2)
            while True:
                yield take(int(rng.integers(0, samples - batch + 1)))

        memfit.fit(model, random_batches(), steps_per_epoch=total, **fit)
    elif feed.startswith("arrays"):
        memfit.fit(model, x, y, batch_size=batch, **fit)
    else:
        if detector:
            dataset = memfit.data.detection_pipeline(
                data, size, batch, shuffle=1000, repeat=True, seed=0
            )
        else:
            dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000, seed=0)
            dataset = dataset.repeat().batch(batch).prefetch(tf.data.AUTOTUNE)
        memfit.fit(model, dataset, steps_per_epoch=total, **fit)
    return {
        "in_use": in_use[3:],
        "peaks": peaks[3:],
        "batch_bytes": int(sum(np.asarray(a).nbytes for a in tf.nest.flatten(take(0)))),
        "seconds": time.perf_counter() - started,
    }


def run_case(
    case: Case, feeds: tuple[str, ...], steps: int, data: str, pinned: bool = False
) -> dict[str, Any]:
    """Each feed of `case` in a fresh process under the emulated card."""
    env = {"MEMFIT_MEMORY": BUDGET, "PYTHONPATH": ROOT}
    rows = {}
    for feed in feeds:
        code = CHILD.format(model=case.model, size=case.size, batch=case.batch, feed=feed,
                            steps=steps, data=data, pinned=pinned)
        rows[feed] = run_isolated(code, env=env, timeout=3600)
        console.print(f"  {feed}: {rows[feed].get('skipped') or _summary(rows[feed])}")
    return {"case": asdict(case), "feeds": rows}


def _summary(run: dict[str, Any]) -> dict[str, float]:
    import statistics

    return {"peak_mib": max(run["peaks"]) / 2**20,
            "in_use_mib": statistics.median(run["in_use"]) / 2**20,
            "batch_mib": run["batch_bytes"] / 2**20, "seconds": run["seconds"]}


def table(cases: list[dict[str, Any]]) -> Table:
    """One row per model and feed: peak and bytes in use, against one batch repeated."""
    out = Table(title=f"Emulated card ({BUDGET}): what memfit.fit's steps hold, feed by feed")
    for column in ("model", "feed", "step peak (max)", "vs one batch", "in use between steps",
                   "vs one batch (batches)"):
        out.add_column(column)
    for row in cases:
        case = row["case"]
        one = _summary(row["feeds"]["one"])
        for feed, run in row["feeds"].items():
            if "skipped" in run:
                out.add_row(f"{case['model']} {case['size']} px b{case['batch']}", feed,
                            "-", "-", "-", run["skipped"])
                continue
            got = _summary(run)
            out.add_row(
                f"{case['model']} {case['size']} px b{case['batch']}",
                feed,
                f"{got['peak_mib']:.2f} MiB",
                f"{got['peak_mib'] / one['peak_mib'] - 1:+.1%}",
                f"{got['in_use_mib']:.2f} MiB",
                f"{(got['in_use_mib'] - one['in_use_mib']) / one['batch_mib']:+.2f}",
            )
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table, write `--out` JSON after each case."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small conv net only")
    parser.add_argument("--steps", type=int, default=20, help="steps measured (default 20)")
    parser.add_argument("--models", nargs="+", help="only these models (names in CASES)")
    parser.add_argument(
        "--pinned",
        action="store_true",
        help="one inter-op thread (default: TensorFlow's default threading, as users run)",
    )
    parser.add_argument("--out", metavar="PATH", help="write the results here as JSON")
    args = parser.parse_args(argv)
    cases = CASES[:1] if args.quick else CASES
    if args.models:
        cases = [c for c in CASES if c.model in args.models]
    report: dict[str, Any] = {
        "machine": describe(
            f"CPU BFC capped at {BUDGET} (memfit emulation), "
            + ("1 inter-op thread" if args.pinned else "default threads")
        ),
        "steps": args.steps,
        "pinned": args.pinned,
        "cases": [],
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as data:
        for case in cases:
            if case.model == "RetinaNet":
                from memfit.data.synth import write_dataset

                write_dataset(data, count=64, shards=2, image_size=(case.size, case.size),
                              num_classes=20)
            console.print(f"{case.model} {case.size} px b{case.batch}")
            report["cases"].append(run_case(case, FEEDS, args.steps, data, args.pinned))
            if args.out:
                with open(args.out, "w") as handle:
                    json.dump(report, handle, indent=2)
    report["seconds"] = time.perf_counter() - started
    console.print(table(report["cases"]))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
