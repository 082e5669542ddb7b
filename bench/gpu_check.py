"""GPU check: memfit on a real NVIDIA GPU, side by side with the CPU emulation of the same budget.

On a machine with an NVIDIA GPU, in at most 8 minutes (`--deadline`):

1. `memfit.doctor()` (NVML: the GPU, its memory, driver);
2. a T4-sized logical device (`memfit.emulate(device="T4")`) and, on it, `memfit.measure` vs
   `memfit.estimate` for MobileNetV2, ResNet50 and EfficientNetB0 (weights=None, 128x128);
3. `memfit batch` (the CLI, in a subprocess) on MobileNetV2 under 1 GiB, and its answer
   trained 20 steps of plain `model.fit` in a fresh process (`bench.trials.fit_steps`);
4. one `memfit.fit` recovery under 256 MiB: a dataset whose second shard has 4x the
   resolution, where plain `model.fit` runs out of memory and `memfit.fit` goes on.

Every step runs twice, in child processes: on the GPU, and on the CPU with
`CUDA_VISIBLE_DEVICES=""` and `MEMFIT_MEMORY` set to the same budget (memfit's emulation);
the GPU side and the CPU side run at the same time. One table compares them. Without an
NVIDIA GPU the script says it found none and exits 0 (`--cpu-only` runs the CPU side alone,
to try the script on a machine without one).

    python -m bench.gpu_check --out gpu.json
    python -m bench.gpu_check --cpu-only --models MobileNetV2   # the CPU side, anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.machine import describe
from bench.models import box_dataset, detector_cnn
from bench.trials import FIT_STEPS, ROOT

console = Console(stderr=True)

CARD = "T4"
IMAGE = [128, 128, 3]
MODELS = {
    "MobileNetV2": ("keras.applications.MobileNetV2", 32),
    "ResNet50": ("keras.applications.ResNet50", 16),
    "EfficientNetB0": ("keras.applications.EfficientNetB0", 16),
}
BATCH_MODEL = "keras.applications.MobileNetV2"
BATCH_BUDGET = "1GiB"
CHECK_STEPS = 20
RECOVERY_BUDGET = "256MiB"
DEADLINE_SECONDS = 480.0
NO_GPU = "gpu_check: no NVIDIA GPU found"


# -- child side -------------------------------------------------------------------------------
def measure_side(card: str, models: dict[str, list[Any]]) -> dict[str, Any]:
    """Child: on a `card`-sized device, measure and estimate each model's step.

    The GPU side starts without a budget and calls `memfit.emulate(device=card)` (a logical
    GPU device of the card's usable size); the CPU side arrives with `MEMFIT_MEMORY` set to
    the same size, applied when memfit was imported.

    Args:
        card: a named card (`"T4"`), or a size (`"2GiB"`) for a try on a small machine.
        models: name -> `[MODEL spec, batch size]`, built at `IMAGE`.

    Returns:
        `device`, `budget` and, per model, `peak_bytes`, `peaks_bytes`, `step_seconds`,
        `estimate_bytes`, `estimate_seconds` (or `error`).

    Example:
        >>> spec = ["keras.applications.MobileNetV2", 32]
        >>> measure_side("T4", {"MobileNetV2": spec})  # doctest: +SKIP
    """
    import memfit
    from memfit.budget.budget import emulated_budget

    if emulated_budget() is not None:
        budget = emulated_budget()
    elif card in memfit.CARDS:
        budget = memfit.emulate(device=card)
    else:
        budget = memfit.emulate(card)
    out: dict[str, Any] = {"budget": budget.to_dict(), "models": {}}
    for name, (spec, batch_size) in models.items():
        row: dict[str, Any] = {"spec": spec, "batch_size": batch_size}
        try:
            model = memfit.load_model(spec, input_shape=IMAGE)
            measured = memfit.measure(
                model, batch_size, input_shape=IMAGE, options=memfit.Options(repeats=3)
            )
            row.update(
                device=measured.device,
                oom=measured.oom,
                peak_bytes=measured.peak_bytes,
                peaks_bytes=list(measured.peaks_bytes),
                step_seconds=measured.step_seconds,
            )
            out["device"] = measured.device
            start = time.perf_counter()
            predicted = memfit.estimate(spec, batch_size, input_shape=IMAGE)
            row["estimate_bytes"] = predicted.peak_bytes
            row["estimate_seconds"] = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - recorded in the table; the others go on
            row["error"] = f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:200]}"
        out["models"][name] = row
    return out


def _recovery_data() -> Any:
    """Yesterday's images (64x64), then today's at 4x the resolution (256x256), by 16."""
    return box_dataset((64, 256))


def recovery_side() -> dict[str, Any]:
    """Child: plain `model.fit` on the two-resolution dataset, then `memfit.fit` on it.

    Returns:
        `plain_fit` (`"completed"` or `"out of memory"`), and for `memfit.fit`: `epochs`,
        `updates`, `recoveries`, `micro_batches`, `loss`, `seconds` (or `error`).

    Example:
        >>> run_in_child("bench.gpu_check:recovery_side", {}, budget=budget)  # doctest: +SKIP
    """
    import memfit
    from memfit.backend import tf as tfb

    out: dict[str, Any] = {}
    try:
        detector_cnn().fit(_recovery_data(), epochs=1, verbose=0)
        out["plain_fit"] = "completed"
    except Exception as exc:  # noqa: BLE001 - only an OOM is the expected outcome
        if not tfb.is_oom(exc):
            raise
        out["plain_fit"] = "out of memory"
    start = time.perf_counter()
    history = memfit.fit(detector_cnn(), _recovery_data(), epochs=2, verbose=0)
    summary = history.memfit
    out.update(
        epochs=len(history.history["loss"]),
        updates=summary.updates,
        recoveries=len(summary.recoveries),
        micro_batches=dict(summary.micro_batches),
        loss=float(history.history["loss"][-1]),
        seconds=time.perf_counter() - start,
    )
    return out


# -- parent side ------------------------------------------------------------------------------
def _env(side: str) -> dict[str, str]:
    env = {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    if side == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _budget(card: str) -> Any:
    from memfit.budget.budget import Budget
    from memfit.budget.cards import CARDS

    return Budget.from_card(card) if card in CARDS else Budget.from_size(card)


def _error(exc: BaseException) -> dict[str, Any]:
    return {"error": f"{exc.__class__.__name__}: {str(exc).strip().splitlines()[-1][:240]}"}


def run_batch(side: str, timeout: float) -> dict[str, Any]:
    """`memfit batch` in a subprocess, then its answer trained `CHECK_STEPS` steps of
    `model.fit` in a fresh process under the same budget.

    Args:
        side: `"gpu"` or `"cpu"` (`CUDA_VISIBLE_DEVICES=""`).
        timeout: seconds for both together.

    Returns:
        The CLI's `batch_size`, its trials and wall time, its JSON keys that say how the
        answer was confirmed (when it has any), and `trains` (the check's outcome).
    """
    from memfit.budget.budget import Budget
    from memfit.process.runner import run_in_child

    started = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "memfit",
        "batch",
        BATCH_MODEL,
        "--input-shape",
        ",".join(map(str, IMAGE)),
        "--memory",
        BATCH_BUDGET,
        "--json",
    ]
    proc = subprocess.run(
        command,
        env={**os.environ, **_env(side), "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode not in (0, 1):
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"memfit batch exited {proc.returncode}: {tail[:240]}"}
    answer = json.loads(proc.stdout)
    out: dict[str, Any] = {
        "command": " ".join(command[2:]),
        "batch_size": answer.get("batch_size"),
        "trials": len(answer.get("trials", [])),
        "seconds": time.perf_counter() - started,
        "confirmation": {
            k: v for k, v in answer.items() if "confirm" in k or k in ("stopped_by", "soak_steps")
        },
    }
    if not answer.get("batch_size"):
        return out
    left = max(30.0, timeout - (time.perf_counter() - started))
    result = run_in_child(
        FIT_STEPS,
        {
            "spec": BATCH_MODEL,
            "batch_size": int(answer["batch_size"]),
            "steps": CHECK_STEPS,
            "input_shape": IMAGE,
            "data": None,
        },
        budget=Budget.from_size(BATCH_BUDGET),
        env=_env(side),
        timeout=left,
    )
    out["trains"] = not (result.get("oom") or result.get("hung_after_oom"))
    out["check_seconds"] = result.get("seconds")
    return out


def run_side(side: str, card: str, models: dict[str, list[Any]], deadline: float) -> dict[str, Any]:
    """Every step of the check on one side, each in a child process, before `deadline`."""
    from memfit.budget.budget import Budget
    from memfit.process.runner import run_in_child

    def left() -> float:
        return max(10.0, deadline - time.monotonic())

    out: dict[str, Any] = {}
    steps = {
        "measure": lambda: run_in_child(
            "bench.gpu_check:measure_side",
            {"card": card, "models": models},
            budget=_budget(card) if side == "cpu" else None,
            env=_env(side),
            timeout=left(),
        ),
        "recovery": lambda: run_in_child(
            "bench.gpu_check:recovery_side",
            {},
            budget=Budget.from_size(RECOVERY_BUDGET),
            env=_env(side),
            timeout=left(),
        ),
        # Last: the longest step (a search, then 20 steps of model.fit).
        "batch": lambda: run_batch(side, left()),
    }
    for name, step in steps.items():
        if time.monotonic() >= deadline:
            out[name] = {"error": "skipped: past the deadline"}
            continue
        start = time.perf_counter()
        try:
            out[name] = step()
        except Exception as exc:  # noqa: BLE001 - each step's failure is a result
            out[name] = _error(exc)
        out[name]["wall_seconds"] = time.perf_counter() - start
        console.print(f"  {side}: {name} done ({out[name]['wall_seconds']:.0f} s)")
    return out


def _mib(value: Any) -> str:
    return f"{value / 2**20:.0f} MiB" if isinstance(value, (int, float)) else "-"


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The comparison as (what, GPU, CPU emulation) rows.

    Example:
        >>> rows({"sides": {}, "doctor": {}})[0][0]
        'device'
    """
    sides = report.get("sides", {})
    gpu, cpu = sides.get("gpu", {}), sides.get("cpu", {})
    gpus = [d for d in report.get("doctor", {}).get("devices", []) if d.get("type") == "GPU"]
    out = [
        (
            "device",
            f"{gpus[0]['description']} ({_mib(gpus[0]['total_bytes'])})" if gpus else "-",
            str(report.get("machine", {}).get("processor", "-")),
        )
    ]

    def pick(side: dict[str, Any], *path: str) -> Any:
        value: Any = side
        for key in path:
            value = value.get(key, {}) if isinstance(value, dict) else {}
        return value if value != {} else None

    def error(side: dict[str, Any], step: str) -> str | None:
        return pick(side, step, "error")

    out.append(
        (
            f"budget ({report.get('card', CARD)})",
            _mib(pick(gpu, "measure", "budget", "usable_bytes")),
            _mib(pick(cpu, "measure", "budget", "usable_bytes")),
        )
    )
    for name in report.get("models", []):

        def cell(side: dict[str, Any], what: str, name: str = name) -> str:
            row = pick(side, "measure", "models", name) or {}
            if error(side, "measure") or row.get("error"):
                return str(error(side, "measure") or row["error"])[:60]
            if not row:
                return "-"
            if what == "peak":
                return "OOM" if row.get("oom") else _mib(row.get("peak_bytes"))
            if what == "estimate":
                peak, est = row.get("peak_bytes"), row.get("estimate_bytes")
                ratio = f" ({est / peak:.2f}x)" if peak and est else ""
                return _mib(est) + ratio
            seconds = row.get("step_seconds")
            return f"{seconds:.3f} s" if seconds else "-"

        batch = (pick(gpu, "measure", "models", name) or {}).get("batch_size") or pick(
            cpu, "measure", "models", name, "batch_size"
        )
        for what in ("peak", "estimate", "step"):
            label = {"peak": "measured peak", "estimate": "estimate (/ measured)"}.get(
                what, "step time"
            )
            out.append((f"{name} b{batch}: {label}", cell(gpu, what), cell(cpu, what)))

    def batch_cell(side: dict[str, Any]) -> str:
        b = side.get("batch", {})
        if b.get("error"):
            return str(b["error"])[:60]
        if not b:
            return "-"
        trains = {True: "trains", False: "OOM", None: "not checked"}[b.get("trains")]
        return f"{b.get('batch_size')}, {trains} ({b.get('seconds', 0):.0f} s)"

    out.append(
        (
            f"memfit batch under {BATCH_BUDGET}, {CHECK_STEPS}-step model.fit",
            batch_cell(gpu),
            batch_cell(cpu),
        )
    )

    def recovery_cell(side: dict[str, Any]) -> str:
        r = side.get("recovery", {})
        if r.get("error"):
            return str(r["error"])[:60]
        if not r:
            return "-"
        return (
            f"plain: {r.get('plain_fit')}; memfit.fit: {r.get('epochs')} epochs, "
            f"{r.get('recoveries')} recoveries, K {r.get('micro_batches')}"
        )

    out.append((f"recovery under {RECOVERY_BUDGET}", recovery_cell(gpu), recovery_cell(cpu)))
    return out


def table(report: dict[str, Any]) -> Table:
    """The comparison as a rich table (see `rows`)."""
    out = Table(title="memfit on the GPU vs the CPU emulation of the same budget")
    for column in ("check", "GPU", "CPU emulation"):
        out.add_column(column, justify="left")
    for row in rows(report):
        out.add_row(*row)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the GPU check (or say there is no GPU); print the table, write `--out` JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", metavar="PATH", help="write the results here as JSON")
    parser.add_argument(
        "--models", nargs="+", choices=list(MODELS), help="models to measure (default: all 3)"
    )
    parser.add_argument(
        "--card",
        default=CARD,
        help=f"card to emulate (default {CARD}), or a size such as 2GiB (a try on a small host)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEADLINE_SECONDS,
        metavar="S",
        help=f"seconds for the whole check (default {DEADLINE_SECONDS:.0f})",
    )
    parser.add_argument(
        "--cpu-only",
        action="store_true",
        help="run only the CPU side (works without a GPU, to try the script)",
    )
    args = parser.parse_args(argv)
    from memfit.budget.devices import nvml_gpus

    gpus, problem = nvml_gpus()
    if not gpus and not args.cpu_only:
        print(f"{NO_GPU} ({problem or 'NVML lists none'}); nothing to check on this machine.")
        return 0
    import memfit

    started = time.monotonic()
    deadline = started + args.deadline
    models = {name: list(MODELS[name]) for name in (args.models or MODELS)}
    report: dict[str, Any] = {
        "card": args.card,
        "models": list(models),
        "machine": describe("GPU: logical device of the card's size; CPU: memfit emulation"),
        "doctor": memfit.doctor().to_dict(),
        "sides": {},
    }
    sides = ["cpu"] if args.cpu_only else ["gpu", "cpu"]
    threads = [
        threading.Thread(
            target=lambda s=side: report["sides"].__setitem__(
                s, run_side(s, args.card, models, deadline)
            )
        )
        for side in sides
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report["seconds"] = time.monotonic() - started
    Console(width=160).print(table(report))
    console.print(f"total {report['seconds'] / 60:.1f} min")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=2, default=str)
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
