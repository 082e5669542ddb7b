"""Benchmark: how much the fixes `memfit data audit` suggests speed a naive detection pipeline.

The naive pipeline (examples/data_pipelines.py: serial interleave, one-at-a-time parse, images
decoded and resized after batching, no cache, no prefetch) and the fixed one
(`memfit.data.detection_pipeline`: parallel reads and decode, cache, prefetch) read the same
synthetic OD-API TFRecords into the same batches. Each is timed over whole epochs, in
alternation, in one run; the figure is the ratio of samples per second (fixed / naive),
median over repetitions. "fixed, no cache" shows what parallelism and prefetch alone give.

    python -m bench.data_audit               # 256 images, 3 epochs, 3 repetitions
    python -m bench.data_audit --quick       # 96 images, 2 epochs, 2 repetitions
    python -m bench.data_audit --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.machine import describe

console = Console(stderr=True)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _epochs_rate(make: Any, epochs: int) -> dict[str, float]:
    """Samples per second over `epochs` passes of a freshly built pipeline (all epochs)."""
    dataset = make()
    samples = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for images, _targets in dataset:
            samples += int(images.shape[0])
    seconds = time.perf_counter() - start
    return {"samples": samples, "seconds": seconds, "samples_per_second": samples / seconds}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller dataset, fewer repeats")
    parser.add_argument("--out", help="write the results as JSON to this file")
    args = parser.parse_args(argv)
    count, epochs, repeats = (96, 2, 2) if args.quick else (256, 3, 3)

    sys.path.insert(0, ROOT)

    import memfit.data
    from examples import data_pipelines as pipelines

    folder = tempfile.mkdtemp(prefix="memfit-bench-data-")
    console.rule(f"Data pipeline: {count} synthetic JPEGs (240-480 px), {epochs} epochs")
    files = memfit.data.write_dataset(
        folder, count=count, shards=4, image_size=(240, 480, 240, 480), max_objects=8
    )
    batch = pipelines.BATCH_SIZE
    variants = {
        "naive": lambda: pipelines.naive(files, batch),
        "fixed, no cache": lambda: pipelines.fixed(files, batch, cache=False),
        "fixed": lambda: pipelines.fixed(files, batch),
    }
    audits = {name: memfit.data.audit(make(), steps=0).kinds() for name, make in variants.items()}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    _epochs_rate(variants["fixed"], 1)  # warm the file cache and TensorFlow's kernels
    for repeat in range(repeats):
        for name, make in variants.items():
            runs[name].append(_epochs_rate(make, epochs))
            console.print(
                f"  repeat {repeat + 1}/{repeats} {name:<16} "
                f"{runs[name][-1]['samples_per_second']:.1f} samples/s"
            )
    rates = {n: statistics.median(r["samples_per_second"] for r in v) for n, v in runs.items()}
    ratios = {n: rates[n] / rates["naive"] for n in variants}

    table = Table(
        title=f"{count} images, batch {batch}, {epochs} epochs per run, median of {repeats}"
    )
    for column in ("pipeline", "samples/s", "x naive", "audit findings"):
        table.add_column(
            column, justify="left" if column in ("pipeline", "audit findings") else "right"
        )
    for name in variants:
        table.add_row(
            name, f"{rates[name]:.1f}", f"{ratios[name]:.2f}", ", ".join(audits[name]) or "none"
        )
    console.print(table)
    console.print(
        f"[bold]fixed / naive = {ratios['fixed']:.2f}x[/] "
        f"(no cache: {ratios['fixed, no cache']:.2f}x)"
    )
    result = {
        "benchmark": "data_audit",
        "quick": args.quick,
        "images": count,
        "epochs": epochs,
        "repeats": repeats,
        "batch_size": batch,
        "samples_per_second": rates,
        "ratio_to_naive": ratios,
        "runs": runs,
        "findings": audits,
        "machine": describe(),
    }
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
