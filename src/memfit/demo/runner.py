"""The demo's runner: runs each step in order as a user would, narrating; `run_demo`.

A failed claim is recorded and the demo goes on; the summary says which steps showed what
they claim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from memfit.demo.checks import StepChecks
from memfit.demo.job import (
    BATCH,
    DATA_ENV,
    DEFAULT_MEMORY,
    MEASURED_STEPS,
    TARGET_BATCH,
    Settings,
)
from memfit.demo.render import intro, step_header, step_outcome, summary
from memfit.demo.results import DemoResult, StepResult
from memfit.errors import MemfitError
from memfit.sizes import parse_size


class Demo(StepChecks):
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
        step_header(self.console, len(self.steps) + 1, name, command)
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
        step_outcome(self.console, result)
        return result

    # steps
    def run(self) -> DemoResult:
        s = self.settings
        started = time.perf_counter()
        os.makedirs(self.out, exist_ok=True)
        intro(self.console, s)
        model, data, large = (
            "memfit.demo:detector",
            "memfit.demo:samples",
            "memfit.demo:large_samples",
        )
        self.step(
            "doctor: is this machine ready?",
            f"doctor sees the emulated {s.memory} card and its budget",
            f"memfit doctor --memory {s.memory}",
            lambda: self.check_doctor(),
        )
        self.step(
            "data check: is the data what the model expects?",
            "data check finds the new high-resolution shard and says what it does to memory",
            f"memfit data check {self.data}/*.tfrecord --model {model} --batch-size {BATCH}",
            lambda: self.check_data_check(model),
        )
        self.step(
            "estimate and measure: what does a step cost?",
            "the estimate, made without running, is within 15% of the step's measured peak "
            f"(the highest of {s.measured_processes} fresh processes)",
            f"memfit estimate {model} --data {large} --batch-size {BATCH}  and  "
            f"memfit measure {model} --data {large} --batch-size {BATCH} "
            f"--repeats {MEASURED_STEPS}",
            lambda: self.check_estimate(model, large),
        )
        if not s.quick:
            self.step(
                "batch: the largest batch that fits",
                "the search finds the largest batch on the dataset's largest images",
                f"memfit batch {model} --data {data} --memory {s.memory} --margin 0",
                lambda: self.check_batch(model, data),
            )
            self.step(
                "plan: a target batch that does not fit unsplit",
                f"plan splits a batch of {TARGET_BATCH} into micro-batches that fit",
                f"memfit plan {model} --data {large} --batch-size {TARGET_BATCH} "
                f"--memory {s.memory} --precision float32 --remat none",
                lambda: self.check_plan(model, large),
            )
        self.step(
            "plain model.fit under the same card",
            "plain model.fit cannot finish the job: the new shard's batches run out of memory",
            "model.fit(job)  and  model.fit(new_shard)",
            self.check_plain_fit,
        )
        self.step(
            "memfit.fit on the same job",
            "memfit.fit completes every epoch with the same number of updates, recovering "
            "on the new shard",
            "memfit.fit(model, job, callbacks=[memfit.Watch(log_path=...)])",
            self.check_memfit_fit,
        )
        self.step(
            "report: what happened, as a page",
            "the report is written, with the memory timeline, budget line and recovery",
            f"memfit report {self.log_path}",
            self.check_report,
        )
        result = DemoResult(self.steps, self.report_path, s.memory, time.perf_counter() - started)
        summary(self.console, result)
        return result


def run_demo(
    memory: str | None = None,
    out: str | None = None,
    quick: bool = False,
    console: Console | None = None,
) -> DemoResult:
    """Run the demo; see `memfit.demo`.

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

    parse_size(memory or DEFAULT_MEMORY)  # a bad size fails here, in one line
    return Demo(Settings.make(memory, out, quick), console).run()
