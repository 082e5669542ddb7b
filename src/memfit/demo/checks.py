"""The demo's steps: each runs what a user would run, narrates it and checks its claim.

`StepChecks` is mixed into `memfit.demo.runner.Demo`, which runs the steps in order; each
`check_*` method returns whether the run showed what the step claims, and its figures (with a
`problem` when it did not).
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console
from rich.markup import escape

from memfit.budget.budget import Budget
from memfit.demo.job import BATCH, LARGE, MEASURED_STEPS, TARGET_BATCH, Settings, write_data
from memfit.demo.render import outcome_text, size_text
from memfit.demo.training import train_memfit, train_plain
from memfit.process.runner import run_in_child
from memfit.sizes import parse_size


class StepChecks:
    """The body of each demo step; needs a runner that sets these and runs `memfit` commands."""

    settings: Settings
    console: Console
    out: str
    data: str
    log_path: str
    report_path: str | None
    measured_peak: int | None
    child_env: dict[str, str]

    def memfit(self, *args: str, timeout: float = 900) -> tuple[int, Any, str]:
        """Run `memfit ARGS --json` as a user would; (exit code, parsed JSON, stderr)."""
        raise NotImplementedError

    def say(self, text: str) -> None:
        """Narrate one line."""
        self.console.print(escape(text))

    def check_doctor(self) -> tuple[bool, dict[str, Any]]:
        code, data, stderr = self.memfit("doctor", "--memory", self.settings.memory)
        if data is None:
            return False, {"problem": f"doctor failed: {stderr}"}
        budget = data.get("emulated_budget") or data.get("budget") or {}
        usable = budget.get("usable_bytes")
        self.say(f"budget: {size_text(usable)} ({budget.get('name', '?')}); doctor exit {code}")
        for f in data.get("findings", [])[:4]:
            self.say(f"  {f.get('level', '')}: {f.get('message', '')}")

        ok = usable == parse_size(self.settings.memory)
        return ok, {"budget_bytes": usable, "exit_code": code}

    def check_data_check(self, model: str) -> tuple[bool, dict[str, Any]]:
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

    def check_estimate(self, model: str, data: str) -> tuple[bool, dict[str, Any]]:
        # A measured peak is fixed per process, not per model (the executor's order of ops
        # changes from one process to the next; see docs/estimate.md, "What it predicts"):
        # the estimate, a run's highest step, is compared with the highest of
        # `measured_processes` fresh processes, as the accuracy benchmark does. The data check
        # measured the step once already (a fresh child, same model, batch and image size);
        # `memfit measure` measures the rest.
        code, out, stderr = self.memfit(
            "estimate", model, "--data", data, "--batch-size", str(BATCH), "--no-what-ifs"
        )
        if out is None:
            return False, {"problem": f"estimate failed: {stderr}"}
        predicted = out.get("peak_bytes")
        peaks = [self.measured_peak] if self.measured_peak else []
        while len(peaks) < self.settings.measured_processes:
            code, step, stderr = self.memfit(
                "measure",
                model,
                "--data",
                data,
                "--batch-size",
                str(BATCH),
                "--repeats",
                str(MEASURED_STEPS),
            )
            if step is None or step.get("oom") or not step.get("peak_bytes"):
                what = (step or {}).get("oom_message") or stderr
                return False, {"problem": f"measure failed (exit {code}): {what}"}
            peaks.append(int(step["peak_bytes"]))
        measured = max(peaks)
        error = (predicted - measured) / measured if predicted and measured else None
        self.say(
            f"batch {BATCH} of the new {LARGE}x{LARGE} images: predicted "
            f"{size_text(predicted)} without running it; measured {size_text(measured)}, the "
            f"highest of {', '.join(size_text(p) for p in peaks)} in {len(peaks)} fresh "
            f"processes (the data check's and `memfit measure`'s)"
            + (f" (error {error:+.1%})" if error is not None else "")
        )
        parts = [(k, v) for k, v in (out.get("breakdown") or {}).items() if isinstance(v, int)]
        for part, value in sorted(parts, key=lambda kv: -kv[1])[:4]:
            self.say(f"  {part.removesuffix('_bytes').replace('_', ' ')}: {size_text(value)}")
        ok = error is not None and abs(error) <= 0.15
        return ok, {
            "peak_bytes": predicted,
            "measured_peak_bytes": measured,
            "measured_peaks_bytes": peaks,
            "error": error,
        }

    def check_batch(self, model: str, data: str) -> tuple[bool, dict[str, Any]]:
        code, out, stderr = self.memfit(
            "batch", model, "--data", data, "--memory", self.settings.memory, "--margin", "0"
        )
        if out is None:
            return False, {"problem": f"batch failed: {stderr}"}
        size = out.get("batch_size", 0)
        self.say(
            f"largest batch: {size} (peak {size_text(out.get('peak_bytes'))}; "
            f"{len(out['trials'])} trials in {out.get('search_seconds', 0):.0f} s; measured on "
            f"the largest samples: {out.get('worst_case_samples')})"
        )
        if size and size < BATCH:
            self.say(f"so batch {BATCH} does not fit on the new shard: that is today's crash")
        ok = code == 0 and size >= 1 and bool(out.get("worst_case_samples"))
        return ok, {"batch_size": size, "trials": len(out["trials"])}

    def check_plan(self, model: str, data: str) -> tuple[bool, dict[str, Any]]:
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
            f"peak {size_text(out.get('peak_bytes'))}"
        )
        ok = code == 0 and bool(out.get("fits")) and isinstance(k, int) and k > 1
        return ok, {"accumulation_steps": k, "micro_batch_size": micro}

    def check_plain_fit(self) -> tuple[bool, dict[str, Any]]:
        out = run_in_child(
            train_plain,
            {"directory": self.data, "epochs": self.settings.epochs},
            budget=Budget.from_size(self.settings.memory),
            env=self.child_env,
            oom_grace=1e9,  # OOMs are what this step shows
        )
        job, new = out["job"], out["new_shard"]
        self.say(f"model.fit(job): {job['outcome']}" + outcome_text(job))
        if job["outcome"] == "TypeError":
            self.say(
                "  (Keras traces the train step once with the batch shape relaxed to None when "
                "shapes vary; keras-hub's anchor generator needs static sizes, so plain fit "
                "cannot even start on mixed resolutions)"
            )
        self.say(
            f"model.fit(new shard alone, {LARGE}x{LARGE}): {new['outcome']}" + outcome_text(new)
        )
        ok = job["outcome"] != "completed" and new["outcome"] == "ResourceExhaustedError"
        return ok, out

    def check_memfit_fit(self) -> tuple[bool, dict[str, Any]]:
        if os.path.exists(self.log_path):
            os.remove(self.log_path)
        out = run_in_child(
            train_memfit,
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

    def check_report(self) -> tuple[bool, dict[str, Any]]:
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
