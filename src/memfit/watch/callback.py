"""`memfit.Watch`: the Keras callback. Imports Keras; `memfit.watch` loads it on first use.

The callback holds a fit's state and wires Keras' hooks to the rest of the package: it
records each step (`sampling`, `input_timing`), derives its loss (`step_losses`), runs the
detectors (`fit_checks`) and writes what it sees (`log`, `header`, `tensorboard`, `console`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from memfit.backend import tf as tfb
from memfit.budget.budget import as_budget, emulated_budget
from memfit.errors import MemfitError
from memfit.watch.console import WatchConsole
from memfit.watch.emulated_input import batch_bytes, pipeline_warning
from memfit.watch.findings import WatchFinding
from memfit.watch.fit_checks import FitChecks, Thresholds
from memfit.watch.header import estimate_peak_bytes, is_tf_keras, run_header
from memfit.watch.input_timing import first_input_shape, oom_of, timed_train_function
from memfit.watch.log import LogWriter, number, summarize
from memfit.watch.oom_findings import (
    budget_left,
    estimated_fit,
    oom_finding,
    others_on_gpu,
    recovery_finding,
)
from memfit.watch.sampling import memory_sample, trace_count
from memfit.watch.step_losses import StepLosses
from memfit.watch.tensorboard import write_scalars

keras = tfb.import_keras()


def _own_time(method: Callable[..., Any]) -> Callable[..., Any]:
    """Count the time spent in a hook as Watch's own: its overhead on training."""

    @functools.wraps(method)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._add_own(time.perf_counter() - started)

    return timed


def _steps_per_execution(model: Any) -> int:
    """Batches per call of the train function: Keras 3's attribute, tf_keras' variable."""
    value = getattr(model, "steps_per_execution", None)
    if value is None:
        value = getattr(model, "_steps_per_execution", None)  # tf_keras: a tf.Variable
    try:
        return max(1, int(value)) if value is not None else 1
    except (TypeError, ValueError):
        return 1


class Watch(keras.callbacks.Callback):
    """A Keras callback: per-step memory, time, input wait and loss; findings with a fix.

    Use it with `model.fit(..., callbacks=[memfit.Watch()])` or in `memfit.fit`'s `callbacks`;
    it also works in tf_keras' (Keras 2, the Model Garden's) `model.fit`, and in a custom
    training loop that makes the calls Keras makes (see "Custom loops" below).
    Each finding is printed once, when it first holds, and kept in `watch.findings`. With
    `log_path` every step goes to a JSON-lines log that `memfit report` turns into one HTML
    page; with `log_dir` memory, step time and input wait also go to TensorBoard. One `Watch`
    may watch several fits: each is a run of its own (detectors start afresh, step numbers
    from 0) and is appended to the log after its own header.

    Findings: `memory_growth` (a leak, with its cause: retracing or tensors kept by Python;
    across fits: models built again and again), `retracing`, `near_budget` (the peak nearly
    fills the budget, or the memory trend reaches it: in about how many steps), `thrashing`
    (steps at the budget's edge run slower), `input_bound`, `divergence` (explosion, a spike
    that stays, a climb, a plateau; judged against the loss's own noise), `non_finite_loss`,
    `oom` and `oom_recovery` (what changed from the steps before: input size, batch size,
    memory in use, budget, or nothing; the fix in numbers: largest batch, image side, K).

    Overhead: a few microseconds of allocator statistics per step, plus taking the next
    batch eagerly (see `memfit.watch.input_timing`); nothing waits for the device that Keras
    does not wait for already (`async_safe`: Keras may run `on_train_batch_end` in a thread).

    Under tf_keras, and in a custom loop, the train function is not wrapped: a step's time
    runs from one `on_train_batch_begin` to the next (the input wait included, not
    measured apart) and its peak memory from its `on_train_batch_begin` on.

    Custom loops: call `watch.set_model(model)`, then `on_train_begin()`; per epoch
    `on_epoch_begin(epoch)`, per step `on_train_batch_begin(batch)` before the step and
    `on_train_batch_end(batch, {"loss": mean})` after it, with `mean` the epoch's running
    mean of the loss so far (as Keras logs it: a `keras.metrics.Mean`), then
    `on_epoch_end(epoch)`; at the end `on_train_end()`, which writes the log's summary.

    Args:
        log_path: write the JSON-lines log here (a header per fit, one line per step,
            findings).
        log_dir: write TensorBoard scalars (`memfit/...`) into this directory.
        budget: the memory budget to judge headroom against (a `Budget`, a size, a card
            name); default: the emulated budget, else the GPU's TensorFlow limit.
        name: the run's name in the log and report (default: the model's name).
        config: extra run configuration for the log (e.g. `{"remat": "none"}`).
        estimate: an estimated peak to compare with the measured one: bytes, or any object
            with `peak_bytes` (an estimate or a `memfit.Measurement`).
        verbose: print findings (and a summary at the end) on the terminal.
        measure_input: wrap the train function to time the input wait (see above).
        warmup_steps: steps ignored by the memory and input detectors at the start
            (tracing, allocator warm-up).
        headroom: `near_budget` when the peak leaves less than this share of the budget.
        input_bound_fraction: `input_bound` when waiting takes at least this share of a step
            (and at least 5 ms a step).
        growth_bytes: `memory_growth` needs at least this rise of the memory left in use...
        growth_fraction: ... and at least this share of what was in use after warm-up.
        spike_factor: `divergence` (spike) needs a loss this many times the recent median,
            that stays up.
        plateau_steps: `divergence` (plateau) when after this many steps the loss has not
            fallen below 97% of where it started.
        oom_estimate: when the first step runs out of memory (no step before to scale
            from), estimate the largest batch that fits for the `oom` finding's fix
            (`memfit.estimation.largest_batch`: a trace and replay of the step, seconds to a
            minute, after the fit has ended; nothing is allocated).

    Attributes:
        findings: every `WatchFinding` so far, over all fits (each with its fit's `run`).
        steps: the step records of the current (or last) fit, as written to the log.
        runs: how many fits this `Watch` has watched.

    Example:
        ```python
        watch = memfit.Watch(log_path="run.jsonl")
        model.fit(train_ds, epochs=5, callbacks=[watch])
        for finding in watch.findings:
            print(finding.kind, finding.cause, finding.fix)
        # then: memfit report run.jsonl --out report.html
        ```
    """

    # tf_keras' CallbackList asks each callback, before fit starts, whether it takes tensors
    # in its logs and which batch hooks it implements; Keras 3's Callback has neither.
    _supports_tf_logs = False

    def __init__(
        self,
        log_path: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        budget: Any = None,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        estimate: Any = None,
        verbose: bool = True,
        measure_input: bool = True,
        warmup_steps: int = Thresholds.warmup_steps,
        headroom: float = Thresholds.headroom,
        input_bound_fraction: float = Thresholds.input_bound_fraction,
        growth_bytes: int = Thresholds.growth_bytes,
        growth_fraction: float = Thresholds.growth_fraction,
        spike_factor: float = Thresholds.spike_factor,
        plateau_steps: int = Thresholds.plateau_steps,
        oom_estimate: bool = True,
    ) -> None:
        super().__init__()
        if config is not None and not isinstance(config, dict):
            raise MemfitError(f"config must be a dict, got {type(config).__name__}")
        for value, label in (
            (headroom, "headroom"),
            (input_bound_fraction, "input_bound_fraction"),
        ):
            if not 0 < float(value) < 1:
                raise MemfitError(f"{label} must be between 0 and 1, got {value!r}")
        self.log_path = os.fspath(log_path) if log_path is not None else None
        self.log_dir = os.fspath(log_dir) if log_dir is not None else None
        self.budget = as_budget(budget)
        self.name = name
        self.config = dict(config or {})
        self.estimate_bytes = estimate_peak_bytes(estimate)
        self.verbose = verbose
        self.measure_input = measure_input
        self.oom_estimate = oom_estimate
        self.thresholds = Thresholds(
            warmup_steps=max(0, int(warmup_steps)),
            headroom=float(headroom),
            input_bound_fraction=float(input_bound_fraction),
            growth_bytes=int(growth_bytes),
            growth_fraction=float(growth_fraction),
            spike_factor=float(spike_factor),
            plateau_steps=int(plateau_steps),
        )
        self.warmup_steps = self.thresholds.warmup_steps
        # Keras may call on_train_batch_end from a thread pool (values already fetched there).
        self.async_safe = True

        self.findings: list[WatchFinding] = []
        self.runs = 0  # fits begun
        self._lock = threading.RLock()
        self._console = WatchConsole()
        self._log: LogWriter | None = None
        self._writer: Any = None
        self._device = "CPU:0"
        self._stats = False
        self._budget_bytes: int | None = None
        self._new_run()

    def _new_run(self) -> None:
        """Per-fit state: series, detectors, counters."""
        self.steps: list[dict[str, Any]] = []
        self._checks = FitChecks(self._report, self.thresholds)
        # Keras logs the epoch's running mean of the loss; per-step losses are derived from it
        # in step order (on_train_batch_end may run in a thread pool, out of order).
        self._losses = StepLosses()
        self._global = 0
        self._epoch = 0
        self._epoch_base = 0
        self._started = time.perf_counter()
        self._last_end: float | None = None
        self._functions: list[Any] = []
        self._guarded: Any = None
        self._recoveries_seen = 0
        self._original: Any = None
        self._wrapped = False
        self._written = 0
        self._tb_written = 0
        self._fallback_begin: float | None = None
        self._own_seconds = 0.0
        self._start_budget_bytes: int | None = None
        self._others_at_start: int | None = None

    def _add_own(self, seconds: float) -> None:
        with self._lock:
            self._own_seconds += seconds

    # -- tf_keras' questions (Keras 3 never asks them) -----------------------------------------
    def _implements_train_batch_hooks(self) -> bool:
        return True

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False

    # -- Keras hooks --------------------------------------------------------------------------
    @_own_time
    def on_train_begin(self, logs: Any = None) -> None:
        if self.runs:
            self._new_run()
        model = self.model
        self._device = tfb.default_device()
        info = tfb.memory_info(self._device)
        self._stats = info is not None
        budget = self.budget or emulated_budget()
        self._budget_bytes = budget.usable_bytes if budget is not None else None
        if self._budget_bytes is None and self._device.startswith("GPU"):
            self._budget_bytes = tfb.device_memory_limit(self._device)
        self._start_budget_bytes = self._budget_bytes
        self._others_at_start = others_on_gpu(self._device)
        if self.log_path is not None and self._log is None:
            # Before the train function is wrapped: a log that cannot be written stops here.
            self._log = LogWriter(self.log_path, append=self.runs > 0)
        fn = model.train_function
        self._guarded = getattr(fn, "guarded_step", None)
        self._functions = tfb.traced_functions(fn) if self._guarded is None else []
        self._recoveries_seen = len(self._guarded.summary.recoveries) if self._guarded else 0
        single = getattr(model.distribute_strategy, "num_replicas_in_sync", 1) == 1
        spe = _steps_per_execution(model)
        self._losses.steps_per_execution = spe
        # tf_keras' train function is one tf.function that reads the iterator inside: fed a
        # Python iterator it would trace again every step, so its steps are timed by hooks.
        wrappable = fn is not None and spe == 1 and single and not is_tf_keras(model)
        self._wrapped = bool(self.measure_input and wrappable)
        if self._wrapped:
            self._original = fn
            model.train_function = timed_train_function(
                fn, self._on_step, self._on_step_error, self._before_step
            )
        self._write(
            run_header(
                model,
                params=self.params or {},
                run=self.runs,
                device=self._device,
                memory_stats=self._stats,
                budget=self.budget or emulated_budget(),
                budget_bytes=self._budget_bytes,
                name=self.name,
                estimate_peak_bytes=self.estimate_bytes,
                input_wait_measured=self._wrapped,
                warmup_steps=self.warmup_steps,
                steps_per_execution=spe,
                guarded=self._guarded,
                config={**self._lr(), **self.config},
            )
        )
        self.runs += 1
        if self.log_dir is not None and self._writer is None:
            self._writer = tfb.ScalarWriter(self.log_dir)
        if info is not None:
            self._checks.fit_started(int(info["current"]), self._global)

    @_own_time
    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = int(epoch)
        self._epoch_base = self._global
        self._last_end = None
        self._fallback_begin = None

    @_own_time
    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._wrapped:
            return
        # Without the wrapper: step time from one batch's start to the next, no input wait.
        now = time.perf_counter()
        if self._fallback_begin is not None:
            self._record(now - self._fallback_begin, None, None)
        self._fallback_begin = now
        if self._stats:
            tfb.reset_peak(self._device)

    @_own_time
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        try:
            value = float(loss)
        except (TypeError, ValueError):
            return
        with self._lock:
            self._losses.add(self._epoch_base + int(batch), self._epoch, int(batch), value)
            self._process_losses(final=False)

    def _process_losses(self, final: bool) -> None:
        """Turn running means into per-step losses, in step order, and check them."""
        for step, loss, epoch in self._losses.process(final):
            # The learning rate is read only for a finding: it costs a device read.
            self._checks.after_loss(step, loss, epoch, evidence=self._lr)

    @_own_time
    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if not self._wrapped and self._fallback_begin is not None:
            self._record(time.perf_counter() - self._fallback_begin, None, None)
            self._fallback_begin = None
        epoch_logs = {k: number(v) for k, v in (logs or {}).items()}
        with self._lock:  # Keras has run every on_train_batch_end of the epoch by now
            self._process_losses(final=True)
        self._flush(final=False)
        self._write(
            {"type": "epoch", "epoch": int(epoch), "step": self._global, "logs": epoch_logs}
        )
        self._write_tensorboard()
        if self._log is not None:
            self._log.flush()

    @_own_time
    def on_train_end(self, logs: Any = None) -> None:
        self._unwrap()
        with self._lock:
            self._process_losses(final=True)
        self._close()
        if self.verbose:
            self._console.summary(self.summary(), self.findings, self.log_path)

    # -- the step wrapper's callbacks -----------------------------------------------------------
    def _before_step(self) -> None:
        started = time.perf_counter()
        if self._stats:
            tfb.reset_peak(self._device)
        self._add_own(time.perf_counter() - started)

    def _on_step(self, started: float, ready: float, ended: float, data: Any) -> None:
        since = self._last_end if self._last_end is not None else started
        self._last_end = ended
        self._record(ended - since, ready - started, data)
        self._add_own(time.perf_counter() - ended)

    def _on_step_error(self, exc: BaseException, data: Any) -> None:
        self._unwrap()
        oom = oom_of(exc)
        if oom is not None:
            self._on_oom(oom, data)

    def _unwrap(self) -> None:
        if self._wrapped and self._original is not None and self.model is not None:
            self.model.train_function = self._original
        self._wrapped = False
        self._original = None

    # -- recording ----------------------------------------------------------------------------
    def _record(self, step_seconds: float, wait: float | None, data: Any) -> None:
        step = self._global
        self._global += 1
        current, peak = memory_sample(self._device, self._guarded) if self._stats else (None, None)
        traces = trace_count(self._guarded, self._functions)
        shape = first_input_shape(data) if data is not None else None
        if shape is None and self.steps:
            shape = self.steps[-1]["input_shape"]
        record = {
            "type": "step",
            "step": step,
            "epoch": self._epoch,
            "time_seconds": round(time.perf_counter() - self._started, 6),
            "step_seconds": round(step_seconds, 6),
            "input_wait_seconds": None if wait is None else round(wait, 6),
            "memory_current_bytes": current,
            "memory_peak_bytes": peak,
            "traces": traces,
            "batch_size": shape[0] if shape else None,
            "input_shape": shape,
        }
        with self._lock:
            self.steps.append(record)
        if self._guarded is not None:
            self._check_recoveries(step)
        self._checks.after_step(
            self.steps,
            record,
            budget_bytes=self._budget_bytes,
            guarded=self._guarded is not None,
            params=self.params,
        )
        if step == self.warmup_steps and self._guarded is None and current is not None:
            self._warn_pipeline(current, data)
        if len(self.steps) - self._written >= 64:
            self._flush(final=False)

    def _warn_pipeline(self, current: int, data: Any) -> None:
        """Plain `model.fit` on a CPU-emulated card: say once what its pipeline holds there."""
        batch = batch_bytes(data) if data is not None else None
        line = pipeline_warning(self.model, current, batch)
        if line is not None and self.verbose:
            print(f"memfit: warning: {line}", file=sys.stderr, flush=True)

    def _check_recoveries(self, step: int) -> None:
        recoveries = self._guarded.summary.recoveries
        for recovery in recoveries[self._recoveries_seen :]:
            finding = recovery_finding(
                recovery,
                self.steps[:-1],
                step,
                budget_bytes=self._budget_bytes,
                start_budget_bytes=self._start_budget_bytes,
                fitted_micro_batches=recoveries[-1].new_micro_batches,
            )
            self._report(finding, once=False, quiet=bool(getattr(self._guarded, "verbose", False)))
        self._recoveries_seen = len(recoveries)

    def _on_oom(self, exc: BaseException, data: Any) -> None:
        info = tfb.memory_info(self._device) if self._stats else None
        shape = first_input_shape(data)
        budget = budget_left(self._budget_bytes, self._device, self._others_at_start)
        estimated = None
        if (
            self.oom_estimate
            and not self.steps
            and self._guarded is None
            and budget
            and shape
            and isinstance(shape[0], int)
            and not is_tf_keras(self.model)
        ):
            with self._console.working(
                "the first step ran out of memory: estimating the largest batch that fits",
                self.verbose,
            ) as show:
                estimated = estimated_fit(self.model, data, shape[0], budget, show)
        finding = oom_finding(
            exc,
            self.steps,
            self._global,
            input_shape=shape,
            budget_bytes=budget,
            start_budget_bytes=self._start_budget_bytes,
            guarded=self._guarded is not None,
            peak_bytes=info["peak"] if info else None,
            estimated=estimated,
        )
        self._report(finding)
        self._flush(final=True)
        self._close()

    # -- findings and output ------------------------------------------------------------------
    def _report(
        self, finding: WatchFinding | None, *, once: bool = True, quiet: bool = False
    ) -> None:
        """Keep, log and print a finding: the first of its kind in this fit, unless not `once`.

        The finding's epoch, when it has none, is the current one; its run is this fit.
        """
        if finding is None:
            return
        with self._lock:
            if once and finding.kind in self._checks.fired:
                return
            self._checks.fired.add(finding.kind)
            finding = dataclasses.replace(
                finding,
                epoch=self._epoch if finding.epoch is None else finding.epoch,
                run=max(0, self.runs - 1),
            )
            self.findings.append(finding)
            self._write({"type": "finding", **finding.to_dict()})
            if self.verbose and not quiet:
                self._console.finding(finding)

    def _lr(self) -> dict[str, Any]:
        try:
            return {"learning_rate": float(self.model.optimizer.learning_rate)}
        except Exception:  # noqa: BLE001 - a schedule or a missing optimizer: no number
            return {}

    def _write(self, data: dict[str, Any]) -> None:
        if self._log is None:
            return
        with self._lock:
            self._log.write(data)

    def _flush(self, final: bool) -> None:
        """Write step lines whose loss has arrived (all of them when `final`)."""
        if self._log is None:
            self._written = len(self.steps)
            return
        with self._lock:
            self._written = self._log.write_steps(
                self.steps, self._written, self._losses.get, final=final
            )

    def _write_tensorboard(self) -> None:
        if self._writer is None:
            return
        with self._lock:
            records = self.steps[self._tb_written :]
            self._tb_written = len(self.steps)
        write_scalars(self._writer, records, self._losses.get)

    def _close(self) -> None:
        self._flush(final=True)
        self._write_tensorboard()
        if self._log is not None:
            self._write({"type": "end", **self.summary()})
            self._log.close()
            self._log = None

    def flush(self) -> None:
        """Write the step lines whose loss has arrived, and flush the log file.

        For a copy of the log that is up to date mid-epoch (Watch itself flushes at each
        epoch's end): `memfit.fit(..., backup_dir=...)` calls it before a checkpoint.
        """
        self._flush(final=False)
        if self._log is not None:
            self._log.flush()

    def summary(self) -> dict[str, Any]:
        """Totals of the current (or last) fit: steps, time, input wait, peak, findings.

        `watch_seconds` is the time spent in Watch's own code (its hooks and the work it adds
        around each step), and `watch_overhead_fraction` that time as a share of the steps'.
        """
        with self._lock:
            steps = list(self.steps)
        trained = sum(s["step_seconds"] for s in steps)
        run = max(0, self.runs - 1)
        return {
            **summarize(steps, self.warmup_steps),
            "run": run,
            "seconds": round(time.perf_counter() - self._started, 3) if self.runs else 0.0,
            "watch_seconds": round(self._own_seconds, 6),
            "watch_overhead_fraction": (
                round(self._own_seconds / trained, 6) if steps and trained else None
            ),
            "micro_batches": dict(self._guarded.summary.micro_batches) if self._guarded else None,
            "findings": sum(f.run == run for f in self.findings),
        }
