"""Benchmark: what memfit.Watch costs per training step (claim: at most 1% at its defaults).

ResNet50 and MobileNetV2 (keras.applications, weights=None) train on a repeated, prefetched
in-memory tf.data pipeline with plain `model.fit`, with and without `memfit.Watch` at its
defaults (memory statistics, input-wait timing, trace counting, loss detectors; no log
file). The two arms alternate round by round in the same process on the same model, after a
warm-up round of each (tracing), so drift of a noisy shared machine hits both alike. The
figures are ratios watch / plain: of the rounds' median step times, the median of the
paired rounds' ratios, and of the 25th percentile and minimum of single steps (timed by a
begin-only callback in both arms), which a busy shared machine disturbs least. On CPU,
TensorFlow runs on one intra- and one inter-op thread by default here (`--threads`): with
two cores' thread pools, step times on this kind of machine are bimodal (~820 or ~1365 ms
for the same ResNet50 step), which swamps a 1% difference.

Second, independent figure: Watch times its own work (every hook, and what it adds around
each step: the peak reset and the record), `Watch.summary()["watch_seconds"]`; its share of
the watched steps' time is the overhead with no noise from the rest of the machine. It does
not see one thing the A/B ratio does: Watch takes each batch eagerly instead of inside Keras'
compiled function (to time the input wait), which the paired ratio covers.

    python -m bench.watch_overhead            # 96x96, 6 rounds of 15 steps per arm
    python -m bench.watch_overhead --quick    # 4 rounds of 8 steps
    python -m bench.watch_overhead --out bench/results/watch_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.machine import describe

console = Console(stderr=True)


def _environment() -> dict[str, Any]:
    from memfit.backend import tf as tfb

    threads = {k: os.environ.get(k) for k in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}
    return {**describe(), "device": tfb.default_device(), "threads": threads}


def run_model(name: str, size: int, batch: int, rounds: int, steps: int) -> dict[str, Any]:
    """Alternate plain and watched `fit` rounds on one model; per-step seconds of each."""
    import keras
    import numpy as np
    import tensorflow as tf

    import memfit

    keras.utils.set_random_seed(0)
    build = getattr(keras.applications, name)
    model = build(weights=None, input_shape=(size, size, 3), classes=10)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (batch * 4, size, size, 3)).astype("float32")
    y = rng.integers(0, 10, batch * 4)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat().prefetch(2)

    class Clock(keras.callbacks.Callback):
        """Timestamps each batch's start: a begin hook only, so Keras' async dispatch stays."""

        def __init__(self) -> None:
            super().__init__()
            self.starts: list[float] = []

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.starts.append(time.perf_counter())

    steps_seen: dict[str, list[float]] = {"plain": [], "watch": []}
    own = {"watch_seconds": 0.0, "step_seconds": 0.0, "steps": 0}

    def one(arm: str, n: int) -> float:
        clock = Clock()
        watch = memfit.Watch(verbose=False) if arm == "watch" else None
        callbacks = [clock] if watch is None else [clock, watch]
        started = time.perf_counter()
        model.fit(data, epochs=1, steps_per_epoch=n, verbose=0, callbacks=callbacks)
        ended = time.perf_counter()
        if n > 3:
            steps_seen[arm] += [b - a for a, b in zip(clock.starts, clock.starts[1:], strict=False)]
            if watch is not None:
                summary = watch.summary()
                own["watch_seconds"] += summary["watch_seconds"]
                own["step_seconds"] += sum(s["step_seconds"] for s in watch.steps)
                own["steps"] += len(watch.steps)
        return (ended - started) / n

    one("plain", 3)  # tracing and allocator warm-up for both paths
    one("watch", 3)
    times: dict[str, list[float]] = {"plain": [], "watch": []}
    for r in range(rounds):
        order = ("plain", "watch") if r % 2 == 0 else ("watch", "plain")
        for arm in order:
            times[arm].append(one(arm, steps))
        console.print(
            f"  {name} round {r + 1}/{rounds}: plain {1000 * times['plain'][-1]:.1f} ms, "
            f"watch {1000 * times['watch'][-1]:.1f} ms"
        )
    ratios = [w / p for w, p in zip(times["watch"], times["plain"], strict=True)]
    plain, watch = statistics.median(times["plain"]), statistics.median(times["watch"])
    per_step = {arm: sorted(v) for arm, v in steps_seen.items()}
    quartile = {arm: v[len(v) // 4] for arm, v in per_step.items()}
    return {
        "model": name,
        "input_size": size,
        "batch_size": batch,
        "rounds": rounds,
        "steps_per_round": steps,
        "plain_step_seconds": plain,
        "watch_step_seconds": watch,
        "ratio": watch / plain,
        "ratio_paired_median": statistics.median(ratios),
        "ratio_p25": quartile["watch"] / quartile["plain"],
        "ratio_min": per_step["watch"][0] / per_step["plain"][0],
        "watch_own_seconds": own["watch_seconds"],
        "watch_own_fraction": own["watch_seconds"] / own["step_seconds"],
        "watch_own_seconds_per_step": own["watch_seconds"] / own["steps"],
        "step_min_seconds": {arm: v[0] for arm, v in per_step.items()},
        "step_p25_seconds": quartile,
        "round_ratios": ratios,
        "plain_rounds_seconds": times["plain"],
        "watch_rounds_seconds": times["watch"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--size", type=int, default=96, help="input height and width")
    parser.add_argument("--batch", type=int, default=None, help="default 8 on CPU, 32 on GPU")
    parser.add_argument("--models", default="ResNet50,MobileNetV2")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="TensorFlow intra- and inter-op threads on CPU (default 1: steadier step times; "
        "0 leaves TensorFlow's defaults)",
    )
    args = parser.parse_args(argv)
    if args.threads > 0:
        os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(args.threads))
        os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(args.threads))
    # Memory statistics on CPU need the BFC allocator: a roomy emulated budget (no OOM).
    os.environ.setdefault("MEMFIT_MEMORY", "16GiB")
    import memfit  # noqa: F401 - applies MEMFIT_MEMORY before TensorFlow initialises
    from memfit.backend import tf as tfb

    gpu = tfb.default_device().startswith("GPU")
    batch = args.batch or (32 if gpu else 8)
    rounds, steps = (4, 8) if args.quick else (6, 15)
    if gpu:
        steps *= 4
    env = _environment()
    results = []
    for name in args.models.split(","):
        console.print(f"[bold]{name}[/] {args.size}x{args.size}, batch {batch}")
        results.append(run_model(name.strip(), args.size, batch, rounds, steps))

    table = Table(
        show_lines=False, title=f"memfit.Watch overhead ({env['device']}, TF {env['tensorflow']})"
    )
    for col in (
        "model",
        "input",
        "batch",
        "plain ms/step",
        "watch ms/step",
        "ratio",
        "paired",
        "p25 step",
        "min step",
        "round ratios",
        "watch's own ms/step",
        "own share",
    ):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            r["model"],
            f"{r['input_size']}x{r['input_size']}",
            str(r["batch_size"]),
            f"{1000 * r['plain_step_seconds']:.1f}",
            f"{1000 * r['watch_step_seconds']:.1f}",
            f"{r['ratio']:.3f}",
            f"{r['ratio_paired_median']:.3f}",
            f"{r['ratio_p25']:.3f}",
            f"{r['ratio_min']:.3f}",
            f"{min(r['round_ratios']):.3f}-{max(r['round_ratios']):.3f}",
            f"{1000 * r['watch_own_seconds_per_step']:.2f}",
            f"{100 * r['watch_own_fraction']:.3f}%",
        )
    Console(width=160).print(table)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"environment": env, "results": results}, handle, indent=2)
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
