"""Demo: the whole memfit story on a real detector, as a user meets it.

`memfit demo` (and `make demo`) trains a keras-hub RetinaNet with a ResNet-10 encoder, built
from config with random weights, on a generated OD-API TFRecord dataset whose last shard holds
images at twice the resolution — the job that trained yesterday and dies today — under an
emulated card. Each step runs the `memfit` command or API a user would run, in its own process
(an emulated budget is set before TensorFlow starts), narrates what it shows, and checks it:
the demo exits non-zero when a step does not show what it claims.

The job's model and data are importable specs, so each command can be copied and rerun:
`memfit.demo:detector` (the RetinaNet, any input size) and `memfit.demo:samples` (the
dataset's samples, unbatched, at their own resolution; the directory comes from
`MEMFIT_DEMO_DATA`).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from memfit.errors import MemfitError

# Measured (CPU, TF 2.21, 2 threads): memfit.fit's step at batch 16 peaks near 400 MiB at
# 128 px and near 755-790 MiB at 256 px in 2 micro-batches; plain model.fit's unsplit 256 px
# step peaked at 1012 MiB in a fresh process (1199 MiB in a second fit), so a 1 GiB card
# would be a coin flip: 900 MiB keeps every step clear of its edge by 10% or more.
DEFAULT_MEMORY = "900MiB"
# The job: shards of SMALL x SMALL images, then one shard at LARGE x LARGE, batches of BATCH.
SMALL = 128
LARGE = 256
BATCH = 16
# The effective batch `memfit plan` is asked for: it does not fit unsplit.
TARGET_BATCH = BATCH
MAX_OBJECTS = 6
# Fresh processes whose median peak the estimate is compared with (one is the data check's).
MEASURED_PROCESSES = 3
DATA_ENV = "MEMFIT_DEMO_DATA"


@dataclass
class Settings:
    """What the demo runs at; `quick` is the shortened demo the tests run."""

    memory: str = DEFAULT_MEMORY
    out: str = "memfit-demo"
    quick: bool = False
    small_images: int = 32  # over the small shards
    large_images: int = 16  # in the last shard
    epochs: int = 1

    @classmethod
    def make(cls, memory: str | None, out: str | None, quick: bool) -> Settings:
        settings = cls(memory=memory or DEFAULT_MEMORY, out=out or "memfit-demo", quick=quick)
        if quick:
            settings.small_images, settings.large_images = BATCH, BATCH
        return settings


@dataclass
class StepResult:
    """One demo step: what it claims, whether the run showed it, and its figures."""

    name: str
    claim: str
    ok: bool
    seconds: float
    command: str
    details: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None


@dataclass
class DemoResult:
    """Every step's result, the report's path, and the verdict."""

    steps: list[StepResult]
    report_path: str | None
    memory: str
    seconds: float

    @property
    def ok(self) -> bool:
        """Whether every step showed what it claims."""
        return all(s.ok for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "ok": self.ok,
            "memory": self.memory,
            "report_path": self.report_path,
            "demo_seconds": round(self.seconds, 1),
            "steps": [asdict(s) for s in self.steps],
        }


# -- the job's model and data (specs for the commands) -----------------------------------------
def detector() -> Any:
    """The demo's detector: keras-hub RetinaNet, ResNet-10 encoder, any input size, Adam."""
    from memfit import zoo

    return zoo.retinanet(None)


def data_dir() -> str:
    """The demo dataset's directory (`MEMFIT_DEMO_DATA`)."""
    directory = os.environ.get(DATA_ENV)
    if not directory or not os.path.isdir(directory):
        raise MemfitError(
            f"{DATA_ENV} does not name the demo's dataset directory; run `memfit demo` first, "
            f"then set {DATA_ENV}=<its --out>/data"
        )
    return directory


def shard_files(directory: str) -> tuple[list[str], list[str]]:
    """The dataset's small-image shards and its large-image shard, in file order."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".tfrecord"))
    large = [os.path.join(directory, n) for n in names if n.startswith("new-")]
    small = [os.path.join(directory, n) for n in names if not n.startswith("new-")]
    return small, large


def samples() -> Any:
    """The dataset's samples, unbatched, each at its own resolution (for `--data`)."""
    return job_dataset(data_dir(), batch_size=1).unbatch()


def large_samples() -> Any:
    """The new shard's samples alone, unbatched, at their (twice as large) resolution."""
    return job_dataset(data_dir(), batch_size=1, which="large").unbatch()


def job_dataset(directory: str, batch_size: int = BATCH, which: str = "all") -> Any:
    """The training job's batches: the small shards, then the large shard.

    Args:
        directory: the demo dataset.
        batch_size: images per batch.
        which: `"all"` (native resolutions: yesterday's images, then today's at twice the
            size) or `"large"` (the new shard alone, at its fixed size).
    """
    from memfit.data import detection_pipeline

    small, large = shard_files(directory)
    parts = [large] if which == "large" else [small, large]
    size = (LARGE, LARGE) if which == "large" else None
    datasets = [
        detection_pipeline(
            files,
            size,
            batch_size,
            max_objects=MAX_OBJECTS,
            deterministic=True,
        )
        for files in parts
    ]
    dataset = datasets[0]
    for more in datasets[1:]:
        dataset = dataset.concatenate(more)
    return dataset


def write_data(directory: str, settings: Settings) -> dict[str, Any]:
    """Generate the dataset: small-image shards, then a shard at twice the resolution."""
    from memfit.data.synth import write_dataset

    small = write_dataset(
        directory,
        count=settings.small_images,
        shards=2,
        image_size=(SMALL, SMALL),
        max_objects=MAX_OBJECTS,
        prefix="train",
    )
    large = write_dataset(
        directory,
        count=settings.large_images,
        shards=1,
        image_size=(LARGE, LARGE),
        max_objects=MAX_OBJECTS,
        prefix="new",
        seed=1,
    )
    return {"small_shards": small, "large_shard": large}


# -- child side of the training steps ------------------------------------------------------------
def train_plain(directory: str, epochs: int) -> dict[str, Any]:
    """Child: plain `model.fit` on the job, then on the new shard alone; what each died of."""
    import tensorflow as tf

    out: dict[str, Any] = {}
    for name, which in (("job", "all"), ("new_shard", "large")):
        model = detector()
        try:
            model.fit(job_dataset(directory, which=which), epochs=epochs, verbose=0)
            out[name] = {"outcome": "completed"}
        except tf.errors.ResourceExhaustedError as exc:
            out[name] = {"outcome": "ResourceExhaustedError", "message": _first_line(exc)}
        except Exception as exc:  # what a user would see; the demo explains it
            out[name] = {"outcome": type(exc).__name__, "message": _first_line(exc)}
        del model
    return out


def train_memfit(directory: str, epochs: int, log_path: str, memory: str) -> dict[str, Any]:
    """Child: `memfit.fit` on the same job, watched; its summary and the Watch's findings."""
    import memfit

    model = detector()
    watch = memfit.Watch(
        log_path=log_path,
        name="RetinaNet (ResNet-10) on the demo dataset",
        config={"batch_size": BATCH, "memory": memory, "images": f"{SMALL}px then {LARGE}px"},
        verbose=False,
    )
    batches = sum(1 for _ in job_dataset(directory))
    history = memfit.fit(model, job_dataset(directory), epochs=epochs, callbacks=[watch], verbose=0)
    return {
        "epochs": len(history.history["loss"]),
        "loss": [float(v) for v in history.history["loss"]],
        "updates": int(model.optimizer.iterations.numpy()),
        "expected_updates": batches * epochs,
        "summary": history.memfit.to_dict(),
        "findings": [f.to_dict() for f in watch.findings],
    }


def _first_line(exc: BaseException) -> str:
    """One clean line of an error: the OOM's allocation, or the message without the graph
    traceback TensorFlow appends ("Detected at node ... defined at ... File ...")."""
    from memfit.backend import tf as tfb

    text = re.sub(r"\x1b\[[0-9;]*m", "", getattr(exc, "message", None) or str(exc))
    if tfb.is_oom(exc):
        text = tfb.oom_summary(exc)
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        lines = [line for line in lines if line.rstrip(":") != "Graph execution error"]
        text = lines[0] if lines else type(exc).__name__
        if text.startswith("Exception encountered when calling") and len(lines) > 1:
            text = f"{text.rstrip('.')}: {lines[1]}"  # Keras' layer name, then the error
    text = re.split(r"Detected at node|\s\[\[\{\{node|\. Hint:", text)[0]
    return " ".join(text.split()).rstrip(" .:")[:240]


# -- the driver -----------------------------------------------------------------------------------
class Demo:
    """Runs the steps in order, narrating; a failed claim is recorded and the demo goes on."""

    def __init__(self, settings: Settings, console: Console | None = None) -> None:
        self.settings = settings
        self.console = console or Console(stderr=True, highlight=False)
        self.steps: list[StepResult] = []
        self.out = os.path.abspath(settings.out)
        self.data = os.path.join(self.out, "data")
        self.log_path = os.path.join(self.out, "run.jsonl")
        self.report_path: str | None = None
        self.measured_peak: int | None = None  # the data check's measurement of the step
        # Two threads whatever the machine: CPU kernels take scratch memory per thread, so
        # the figures (and which step runs out of memory) would move with the core count.
        self.child_env = {
            DATA_ENV: self.data,
            "TF_NUM_INTRAOP_THREADS": "2",
            "TF_NUM_INTEROP_THREADS": "2",
        }
        # Each command starts as a user's would: no emulation inherited from this process
        # (its budget, allocator limit and mode); a command that emulates says so itself.
        self.env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("MEMFIT_", "TF_CPU_BFC", "TF_CPU_ALLOCATOR"))
        }
        self.env.update(self.child_env, TF_CPP_MIN_LOG_LEVEL="2")

    # helpers
    def memfit(self, *args: str, timeout: float = 900) -> tuple[int, Any, str]:
        """Run `memfit ARGS --json` as a user would; (exit code, parsed JSON, stderr)."""
        command = [sys.executable, "-m", "memfit", *args, "--json"]
        proc = subprocess.run(
            command, capture_output=True, text=True, env=self.env, timeout=timeout, check=False
        )
        try:
            data = json.loads(proc.stdout) if proc.stdout.strip() else None
        except json.JSONDecodeError:
            data = None
        lines = proc.stderr.strip().splitlines()
        return proc.returncode, data, lines[-1] if lines else f"exit {proc.returncode}"

    def step(
        self, name: str, claim: str, command: str, body: Callable[[], tuple[bool, dict[str, Any]]]
    ) -> StepResult:
        index = len(self.steps) + 1
        self.console.rule(f"[bold]{index}. {name}")
        self.console.print(f"[dim]$ {escape(command)}[/]")
        started = time.perf_counter()
        problem = None
        with self.console.status(f"{name}...", spinner="dots"):
            try:
                ok, details = body()
            except subprocess.TimeoutExpired as exc:
                ok, details, problem = False, {}, f"timed out after {exc.timeout:.0f} s"
            except MemfitError as exc:
                ok, details, problem = False, {}, str(exc)
        seconds = time.perf_counter() - started
        if not ok and problem is None:
            problem = details.pop("problem", "the run did not show what this step claims")
        result = StepResult(name, claim, ok, seconds, command, details, problem)
        self.steps.append(result)
        mark = "[green]shown[/]" if ok else "[bold red]NOT shown[/]"
        self.console.print(f"{mark}: {escape(claim)} [dim]({seconds:.0f} s)[/]")
        if problem:
            self.console.print(f"[red]{escape(problem)}[/]")
        return result

    def say(self, text: str) -> None:
        self.console.print(escape(text))

    # steps
    def run(self) -> DemoResult:
        s = self.settings
        started = time.perf_counter()
        os.makedirs(self.out, exist_ok=True)
        self.console.print(
            Panel(
                f"A keras-hub RetinaNet (ResNet-10 encoder, built from config, random weights) "
                f"trains on detection data: {s.small_images} images of {SMALL}x{SMALL}, then "
                f"a new shard of {s.large_images} at {LARGE}x{LARGE}. Batch {BATCH}, on an "
                f"emulated card of {s.memory} (CPU, TensorFlow's BFC allocator capped; real "
                f"out-of-memory errors).",
                title="memfit demo",
            )
        )
        model, data, large = (
            "memfit.demo:detector",
            "memfit.demo:samples",
            "memfit.demo:large_samples",
        )
        self.step(
            "doctor: is this machine ready?",
            f"doctor sees the emulated {s.memory} card and its budget",
            f"memfit doctor --memory {s.memory}",
            lambda: self._doctor(),
        )
        self.step(
            "data check: is the data what the model expects?",
            "data check finds the new high-resolution shard and says what it does to memory",
            f"memfit data check {self.data}/*.tfrecord --model {model} --batch-size {BATCH}",
            lambda: self._data_check(model),
        )
        self.step(
            "estimate and measure: what does a step cost?",
            "the estimate, made without running, is within 15% of the step's measured peak "
            f"(the median of {MEASURED_PROCESSES} fresh processes)",
            f"memfit estimate {model} --data {large} --batch-size {BATCH}  and  "
            f"memfit measure {model} --data {large} --batch-size {BATCH} --repeats 2",
            lambda: self._estimate(model, large),
        )
        if not s.quick:
            self.step(
                "batch: the largest batch that fits",
                "the search finds the largest batch on the dataset's largest images",
                f"memfit batch {model} --data {data} --memory {s.memory} --margin 0",
                lambda: self._batch(model, data),
            )
            self.step(
                "plan: a target batch that does not fit unsplit",
                f"plan splits a batch of {TARGET_BATCH} into micro-batches that fit",
                f"memfit plan {model} --data {large} --batch-size {TARGET_BATCH} "
                f"--memory {s.memory} --precision float32 --remat none",
                lambda: self._plan(model, large),
            )
        self.step(
            "plain model.fit under the same card",
            "plain model.fit cannot finish the job: the new shard's batches run out of memory",
            "model.fit(job)  and  model.fit(new_shard)",
            self._plain_fit,
        )
        self.step(
            "memfit.fit on the same job",
            "memfit.fit completes every epoch with the same number of updates, recovering "
            "on the new shard",
            "memfit.fit(model, job, callbacks=[memfit.Watch(log_path=...)])",
            self._memfit_fit,
        )
        self.step(
            "report: what happened, as a page",
            "the report is written, with the memory timeline, budget line and recovery",
            f"memfit report {self.log_path}",
            self._report,
        )
        result = DemoResult(self.steps, self.report_path, s.memory, time.perf_counter() - started)
        self._summary(result)
        return result

    def _doctor(self) -> tuple[bool, dict[str, Any]]:
        code, data, stderr = self.memfit("doctor", "--memory", self.settings.memory)
        if data is None:
            return False, {"problem": f"doctor failed: {stderr}"}
        budget = data.get("emulated_budget") or data.get("budget") or {}
        usable = budget.get("usable_bytes")
        self.say(f"budget: {_size(usable)} ({budget.get('name', '?')}); doctor exit {code}")
        for f in data.get("findings", [])[:4]:
            self.say(f"  {f.get('level', '')}: {f.get('message', '')}")
        from memfit.sizes import parse_size

        ok = usable == parse_size(self.settings.memory)
        return ok, {"budget_bytes": usable, "exit_code": code}

    def _data_check(self, model: str) -> tuple[bool, dict[str, Any]]:
        files = write_data(self.data, self.settings)
        self.say(
            f"wrote {len(files['small_shards']) + len(files['large_shard'])} shards to {self.data}"
        )
        paths = sorted(os.path.join(self.data, n) for n in os.listdir(self.data))
        code, data, stderr = self.memfit(
            "data", "check", *paths, "--model", model, "--batch-size", str(BATCH)
        )
        if data is None:
            return False, {"problem": f"data check failed: {stderr}"}
        self.say(
            f"{data['records']} records, {data['valid_records']} valid, {data['errors']} "
            f"errors, {data['warnings']} warnings; resolutions (W x H: images) "
            f"{data['resolutions']}"
        )
        largest = data["largest"][0] if data.get("largest") else {}
        memory = data.get("memory") or {}
        if memory.get("message"):
            self.say(memory["message"])
        if memory.get("mode") == "measured" and not memory.get("oom"):
            self.measured_peak = memory.get("peak_bytes")
        found_large = bool(largest) and (largest.get("height"), largest.get("width")) == (
            LARGE,
            LARGE,
        )
        shard = os.path.basename(str(largest.get("file", "")))
        if found_large:
            self.say(f"largest images: {LARGE}x{LARGE}, in {shard}")
        ok = found_large and shard.startswith("new-") and bool(memory)
        return ok, {
            "records": data["records"],
            "largest": largest,
            "memory": memory,
            "exit_code": code,
        }

    def _estimate(self, model: str, data: str) -> tuple[bool, dict[str, Any]]:
        # A measured peak is fixed per process, not per model (the executor's order of ops
        # changes from one process to the next; see docs/estimate.md, "What it predicts"):
        # the estimate is compared with the median of MEASURED_PROCESSES fresh processes, as
        # the accuracy benchmark does. The data check measured the step once already (a fresh
        # child, same model, batch and image size); `memfit measure` measures the rest.
        code, out, stderr = self.memfit(
            "estimate", model, "--data", data, "--batch-size", str(BATCH), "--no-what-ifs"
        )
        if out is None:
            return False, {"problem": f"estimate failed: {stderr}"}
        predicted = out.get("peak_bytes")
        peaks = [self.measured_peak] if self.measured_peak else []
        while len(peaks) < MEASURED_PROCESSES:
            code, step, stderr = self.memfit(
                "measure", model, "--data", data, "--batch-size", str(BATCH), "--repeats", "2"
            )
            if step is None or step.get("oom") or not step.get("peak_bytes"):
                what = (step or {}).get("oom_message") or stderr
                return False, {"problem": f"measure failed (exit {code}): {what}"}
            peaks.append(int(step["peak_bytes"]))
        measured = int(statistics.median(peaks))
        error = (predicted - measured) / measured if predicted and measured else None
        self.say(
            f"batch {BATCH} of the new {LARGE}x{LARGE} images: predicted {_size(predicted)} "
            f"without running it; measured {_size(measured)}, the median of "
            f"{', '.join(_size(p) for p in peaks)} in {len(peaks)} fresh processes (the data "
            f"check's and `memfit measure`'s)"
            + (f" (error {error:+.1%})" if error is not None else "")
        )
        parts = [(k, v) for k, v in (out.get("breakdown") or {}).items() if isinstance(v, int)]
        for part, value in sorted(parts, key=lambda kv: -kv[1])[:4]:
            self.say(f"  {part.removesuffix('_bytes').replace('_', ' ')}: {_size(value)}")
        ok = error is not None and abs(error) <= 0.15
        return ok, {
            "peak_bytes": predicted,
            "measured_peak_bytes": measured,
            "measured_peaks_bytes": peaks,
            "error": error,
        }

    def _batch(self, model: str, data: str) -> tuple[bool, dict[str, Any]]:
        code, out, stderr = self.memfit(
            "batch", model, "--data", data, "--memory", self.settings.memory, "--margin", "0"
        )
        if out is None:
            return False, {"problem": f"batch failed: {stderr}"}
        size = out.get("batch_size", 0)
        self.say(
            f"largest batch: {size} (peak {_size(out.get('peak_bytes'))}; {len(out['trials'])} "
            f"trials in {out.get('search_seconds', 0):.0f} s; measured on the largest samples: "
            f"{out.get('worst_case_samples')})"
        )
        if size and size < BATCH:
            self.say(f"so batch {BATCH} does not fit on the new shard: that is today's crash")
        ok = code == 0 and size >= 1 and bool(out.get("worst_case_samples"))
        return ok, {"batch_size": size, "trials": len(out["trials"])}

    def _plan(self, model: str, data: str) -> tuple[bool, dict[str, Any]]:
        code, out, stderr = self.memfit(
            "plan",
            model,
            "--data",
            data,
            "--batch-size",
            str(TARGET_BATCH),
            "--memory",
            self.settings.memory,
            "--precision",
            "float32",
            "--remat",
            "none",
        )
        if out is None:
            return False, {"problem": f"plan failed: {stderr}"}
        k, micro = out.get("accumulation_steps"), out.get("micro_batch_size")
        self.say(
            f"batch {TARGET_BATCH}: {k} micro-batches of {micro}, {out.get('precision')}, "
            f"peak {_size(out.get('peak_bytes'))}"
        )
        ok = code == 0 and bool(out.get("fits")) and isinstance(k, int) and k > 1
        return ok, {"accumulation_steps": k, "micro_batch_size": micro}

    def _plain_fit(self) -> tuple[bool, dict[str, Any]]:
        from memfit.budget import Budget
        from memfit.isolate import run_in_child

        out = run_in_child(
            "memfit.demo:train_plain",
            {"directory": self.data, "epochs": self.settings.epochs},
            budget=Budget.from_size(self.settings.memory),
            env=self.child_env,
            oom_grace=1e9,  # OOMs are what this step shows
        )
        job, new = out["job"], out["new_shard"]
        self.say(f"model.fit(job): {job['outcome']}" + _message(job))
        if job["outcome"] == "TypeError":
            self.say(
                "  (Keras traces the train step once with the batch shape relaxed to None when "
                "shapes vary; keras-hub's anchor generator needs static sizes, so plain fit "
                "cannot even start on mixed resolutions)"
            )
        self.say(f"model.fit(new shard alone, {LARGE}x{LARGE}): {new['outcome']}" + _message(new))
        ok = job["outcome"] != "completed" and new["outcome"] == "ResourceExhaustedError"
        return ok, out

    def _memfit_fit(self) -> tuple[bool, dict[str, Any]]:
        from memfit.budget import Budget
        from memfit.isolate import run_in_child

        if os.path.exists(self.log_path):
            os.remove(self.log_path)
        out = run_in_child(
            "memfit.demo:train_memfit",
            {
                "directory": self.data,
                "epochs": self.settings.epochs,
                "log_path": self.log_path,
                "memory": self.settings.memory,
            },
            budget=Budget.from_size(self.settings.memory),
            env=self.child_env,
            oom_grace=1e9,  # memfit.fit recovers from these
        )
        summary = out["summary"]
        self.say(
            f"{out['epochs']} epoch(s), {out['updates']} updates (the job has "
            f"{out['expected_updates']}), loss {out['loss'][-1]:.3f}"
        )
        for r in summary["recoveries"]:
            self.say(
                f"  recovered: update {r['update'] + 1}, {r['phase']} out of memory on "
                f"{'x'.join(map(str, r['input_shapes'][0]))} -> K {r['old_micro_batches']} -> "
                f"{r['new_micro_batches']} micro-batches ({r['seconds']:.1f} s)"
            )
        self.say(f"  micro-batches per input shape: {summary['micro_batches']}")
        ok = (
            out["epochs"] == self.settings.epochs
            and out["updates"] == out["expected_updates"]
            and len(summary["recoveries"]) >= 1
        )
        return ok, out

    def _report(self) -> tuple[bool, dict[str, Any]]:
        html = os.path.join(self.out, "report.html")
        code, out, stderr = self.memfit("report", self.log_path, "--out", html)
        if out is None or not os.path.exists(html):
            return False, {"problem": f"report failed: {stderr}"}
        self.report_path = out.get("html_path", html)
        with open(self.report_path, encoding="utf-8") as handle:
            text = handle.read()
        self.say(f"report: {self.report_path}")
        for f in out.get("findings", [])[:5]:
            self.say(f"  {f.get('kind')}: {f.get('message')}")
        ok = "<svg" in text and "recover" in text.lower() and "budget" in text.lower()
        return ok, {"html_path": self.report_path, "bytes": len(text)}

    def _summary(self, result: DemoResult) -> None:
        self.console.rule("[bold]summary")
        for index, s in enumerate(result.steps, 1):
            mark = "[green]ok[/]  " if s.ok else "[bold red]FAIL[/]"
            self.console.print(f"{mark} {index}. {escape(s.claim)} [dim]({s.seconds:.0f} s)[/]")
        verdict = "every step showed what it claims" if result.ok else "some steps failed"
        self.console.print(
            f"[bold]{verdict}[/] in {result.seconds / 60:.1f} min"
            + (f"; report: {result.report_path}" if result.report_path else "")
        )


def run_demo(
    memory: str | None = None,
    out: str | None = None,
    quick: bool = False,
    console: Console | None = None,
) -> DemoResult:
    """Run the demo; see the module docstring.

    Args:
        memory: the emulated card (default 900 MiB).
        out: directory for the dataset, the Watch log and the HTML report.
        quick: the shortened demo (smaller dataset; no batch search or plan).
        console: where narration goes (default: stderr).

    Returns:
        A `DemoResult`; `ok` is False when any step did not show what it claims.

    Example:
        ```python
        result = memfit.demo.run_demo(out="/tmp/memfit-demo")
        print(result.ok, result.report_path)
        ```
    """
    from memfit.sizes import parse_size

    parse_size(memory or DEFAULT_MEMORY)  # a bad size fails here, in one line
    return Demo(Settings.make(memory, out, quick), console).run()


def _message(outcome: dict[str, Any]) -> str:
    return f" — {outcome['message'][:160]}" if outcome.get("message") else ""


def _size(value: Any) -> str:
    from memfit.sizes import format_size

    return format_size(int(value)) if isinstance(value, (int, float)) else "?"
