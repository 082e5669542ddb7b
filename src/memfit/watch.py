"""Watch: a Keras callback that watches training and says what is wrong, why, and what to do.

Per step it records the device's current and peak memory, the step time, the time spent
waiting for the next batch, the loss and how often the train function was traced. Detectors
look at these series and turn what they see into findings, each with a cause and a fix:

- `memory_growth`: memory left over after each step keeps rising (a leak), with the likely
  cause: the train function retracing, or tensors kept alive by Python; across fits in one
  process: models built or fitted again and again;
- `retracing`: the train function keeps being traced again (slow, and memory for each graph);
- `near_budget`: the step's peak leaves less than a threshold of the budget free, with the
  batch size that would not fit;
- `input_bound`: a large share of each step is spent waiting for the input pipeline;
- `divergence`: the loss spikes, climbs, or does not move; `non_finite_loss`: it is NaN/Inf;
- `oom` / `oom_recovery`: an out-of-memory error, and each one `memfit.fit` recovered from.

How input wait is measured: Keras (TensorFlow backend) reads the next batch *inside* its
compiled train function (`iterator.get_next()` in `multi_step_on_iterator`), so nothing in
the callback hooks can see it. While training, `Watch` wraps `model.train_function`: it takes
the next batch itself (`next(iterator)`, timed: that is the wait), then runs Keras' own
compiled step on it (the path Keras takes for Python iterators). This needs
`steps_per_execution=1` and one replica; otherwise input wait is not measured.

Data flows fit -> watch: with `memfit.fit`, the GuardedStep fit installs is read for its
recoveries, traces and peaks (`train_function.guarded_step`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.backend import tf as tfb
from memfit.budget import as_budget, emulated_budget
from memfit.errors import MemfitError
from memfit.sizes import format_size

LOG_FORMAT = 1
# Waiting less than this per step is not worth a finding (taking a batch eagerly costs
# ~0.3-1 ms of Python even from a prefetched pipeline).
MIN_INPUT_WAIT_SECONDS = 0.005

# Finding kinds, in the order a report lists them.
KINDS = (
    "oom",
    "oom_recovery",
    "memory_growth",
    "retracing",
    "near_budget",
    "input_bound",
    "divergence",
    "non_finite_loss",
)

_PIPELINE_FIX = (
    "parallelise and overlap the input pipeline: `.map(f, num_parallel_calls=tf.data.AUTOTUNE)`, "
    "end it with `.prefetch(tf.data.AUTOTUNE)`, `.cache()` after expensive deterministic "
    "steps (decode, resize) when the data fits in RAM or on local disk, and read many files "
    "at once with `interleave(..., num_parallel_calls=tf.data.AUTOTUNE)`; move Python code "
    "(`py_function`, `numpy_function`, generators) into TensorFlow ops"
)

_LR_FIX = (
    "lower the learning rate (try 3-10x lower), add a warm-up (e.g. "
    "`keras.optimizers.schedules.CosineDecay(lr, decay_steps, warmup_target=lr, "
    "warmup_steps=...)` starting from a small value) and a decay schedule, and clip gradients "
    "(`clipnorm=1.0` on the optimizer)"
)

# Process-wide: the memory left in use when each fit began (repeated fits / model builds).
_FIT_STARTS: list[int] = []


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


@dataclass
class WatchFinding:
    """Something `Watch` saw: what, when, why, what to do, and the numbers behind it.

    Attributes:
        kind: one of `memory_growth`, `retracing`, `near_budget`, `input_bound`,
            `divergence`, `non_finite_loss`, `oom`, `oom_recovery`.
        step: the training step (counted from 0 over the whole run) where it first held.
        epoch: the epoch (from 0).
        message: what was seen, with numbers.
        cause: the likely cause.
        fix: what to do.
        evidence: the numbers (`_bytes`, `_seconds`, fractions, counts).
        severity: `"warning"` or `"problem"`.

    Example:
        ```python
        for finding in watch.findings:
            print(finding.kind, finding.step, finding.fix)
        ```
    """

    kind: str
    step: int
    epoch: int | None
    message: str
    cause: str
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)
    severity: str = "warning"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.kind} at step {self.step}: {self.message}"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return math.nan
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class _Floors:
    """Window minima of the memory left in use after each step (what a leak raises).

    A window's minimum drops the noise of batches in flight; windows are merged in pairs
    past `limit`, so a long run costs bounded memory and time.
    """

    def __init__(self, window: int = 4, limit: int = 400) -> None:
        self.window = window
        self.limit = limit
        self.values: list[int] = []
        self.steps: list[int] = []
        self.traces: list[int] = []
        self._current: int | None = None
        self._count = 0

    def add(self, step: int, current: int, traces: int) -> bool:
        """Add one step; True when a window closed."""
        self._current = current if self._current is None else min(self._current, current)
        self._count += 1
        if self._count < self.window:
            return False
        self.values.append(self._current)
        self.steps.append(step)
        self.traces.append(traces)
        self._current, self._count = None, 0
        if len(self.values) > self.limit:
            self.values = [
                min(a, b) for a, b in zip(self.values[::2], self.values[1::2], strict=False)
            ]
            self.steps = self.steps[1::2]
            self.traces = self.traces[1::2]
            self.window *= 2
        return True


class _WatchBase:
    """A Keras callback: per-step memory, time, input wait and loss; findings with a fix.

    Use it with `model.fit(..., callbacks=[memfit.Watch()])` or in `memfit.fit`'s `callbacks`.
    Each finding is printed once, when it first holds, and kept in `watch.findings`. With
    `log_path` every step goes to a JSON-lines log that `memfit report` turns into one HTML
    page; with `log_dir` memory, step time and input wait also go to TensorBoard.

    Overhead: a few microseconds of allocator statistics per step, plus taking the next
    batch eagerly (see the module docstring); nothing waits for the device that Keras does
    not wait for already (`async_safe`: Keras may run `on_train_batch_end` in a thread).

    Args:
        log_path: write the JSON-lines log here (a header, one line per step, findings).
        log_dir: write TensorBoard scalars (`memfit/...`) into this directory.
        budget: the memory budget to judge headroom against (a `Budget`, a size, a card
            name); default: the emulated budget, else the GPU's TensorFlow limit.
        name: the run's name in the log and report (default: the model's name).
        config: extra run configuration for the log (e.g. `{"remat": "none"}`).
        estimate: an estimated peak to compare with the measured one: bytes, or any object
            with `peak_bytes` (an estimate or a `memfit.Measurement`).
        verbose: print findings (and a summary at the end) on the terminal.
        measure_input: wrap the train function to time the input wait (see above).
        warmup_steps: steps ignored by the detectors at the start (tracing, allocator warm-up).
        headroom: `near_budget` when the peak leaves less than this share of the budget.
        input_bound_fraction: `input_bound` when waiting takes at least this share of a step
            (and at least 5 ms a step).
        growth_bytes: `memory_growth` needs at least this rise of the memory left in use...
        growth_fraction: ... and at least this share of what was in use after warm-up.
        spike_factor: `divergence` when a loss exceeds this many times the recent median.
        plateau_steps: `divergence` (plateau) when after this many steps the loss has not
            fallen below 97% of where it started.

    Example:
        ```python
        watch = memfit.Watch(log_path="run.jsonl")
        model.fit(train_ds, epochs=5, callbacks=[watch])
        for finding in watch.findings:
            print(finding.kind, finding.cause, finding.fix)
        # then: memfit report run.jsonl --out report.html
        ```
    """

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
        warmup_steps: int = 5,
        headroom: float = 0.1,
        input_bound_fraction: float = 0.25,
        growth_bytes: int = 1024 * 1024,
        growth_fraction: float = 0.05,
        spike_factor: float = 3.0,
        plateau_steps: int = 200,
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
        self.estimate_bytes = _estimate_bytes(estimate)
        self.verbose = verbose
        self.measure_input = measure_input
        self.warmup_steps = max(0, int(warmup_steps))
        self.headroom = float(headroom)
        self.input_bound_fraction = float(input_bound_fraction)
        self.growth_bytes = int(growth_bytes)
        self.growth_fraction = float(growth_fraction)
        self.spike_factor = float(spike_factor)
        self.plateau_steps = int(plateau_steps)
        # Keras may call on_train_batch_end from a thread pool (values already fetched there).
        self.async_safe = True

        self.findings: list[WatchFinding] = []
        self.steps: list[dict[str, Any]] = []
        self._lock = threading.RLock()
        self._fired: set[str] = set()
        # Keras logs the epoch's running mean of the loss; per-step losses are derived from it
        # in step order (on_train_batch_end may run in a thread pool, out of order).
        self._pending: dict[int, tuple[int, int, float]] = {}  # step -> (epoch, batch, mean)
        self._last_mean: tuple[int, int, float] | None = None
        self._losses: dict[int, float] = {}  # step -> that step's own loss
        self._loss_history: list[float] = []
        self._spe = 1
        self._global = 0
        self._epoch = 0
        self._epoch_base = 0
        self._started = 0.0
        self._last_end: float | None = None
        self._device = "CPU:0"
        self._stats = False
        self._budget_bytes: int | None = None
        self._functions: list[Any] = []
        self._guarded: Any = None
        self._recoveries_seen = 0
        self._original: Any = None
        self._wrapped = False
        self._floors = _Floors()
        self._traces_at_warmup: int | None = None
        self._file: Any = None
        self._written = 0
        self._tb_written = 0
        self._writer: Any = None
        self._begun = False
        self._fallback_begin: float | None = None
        self._console: Any = None
        self._own_seconds = 0.0

    def _add_own(self, seconds: float) -> None:
        with self._lock:
            self._own_seconds += seconds

    # -- Keras hooks --------------------------------------------------------------------------
    @_own_time
    def on_train_begin(self, logs: Any = None) -> None:
        model = self.model
        self._device = tfb.default_device()
        info = tfb.memory_info(self._device)
        self._stats = info is not None
        budget = self.budget or emulated_budget()
        self._budget_bytes = budget.usable_bytes if budget is not None else None
        if self._budget_bytes is None and self._device.startswith("GPU"):
            self._budget_bytes = tfb.device_memory_limit(self._device)
        fn = model.train_function
        self._guarded = getattr(fn, "guarded_step", None)
        self._functions = tfb.traced_functions(fn) if self._guarded is None else []
        self._recoveries_seen = len(self._guarded.summary.recoveries) if self._guarded else 0
        if not self._begun:
            self._started = time.perf_counter()
        self._last_end = None
        single = getattr(model.distribute_strategy, "num_replicas_in_sync", 1) == 1
        spe = int(getattr(model, "steps_per_execution", 1) or 1)
        self._spe = spe
        self._wrapped = bool(self.measure_input and fn is not None and spe == 1 and single)
        if self._wrapped:
            self._original = fn
            model.train_function = self._timed(fn)
        if self.log_path is not None and self._file is None:
            directory = os.path.dirname(os.path.abspath(self.log_path))
            if not os.path.isdir(directory):
                raise MemfitError(
                    f"cannot write the watch log {self.log_path}: folder {directory} does not "
                    f"exist; create it or choose another log_path"
                )
            self._file = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115
        if not self._begun:
            self._write(self._header(model, spe))
        self._begun = True
        if self.log_dir is not None and self._writer is None:
            self._writer = tfb.ScalarWriter(self.log_dir)
        if info is not None:
            self._check_repeated_fits(int(info["current"]))

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
            self._pending[self._epoch_base + int(batch)] = (self._epoch, int(batch), value)
            self._process_losses(final=False)

    def _process_losses(self, final: bool) -> None:
        """Turn running means into per-step losses, in step order, and check them."""
        for step in sorted(self._pending):
            epoch, batch, mean = self._pending[step]
            last = self._last_mean
            if last is not None and last[0] == epoch:
                expected = last[1] + self._spe
            else:
                expected = self._spe - 1  # the first batch (group) of an epoch
            if batch != expected and not final:
                return  # an earlier step's logs have not arrived yet
            del self._pending[step]
            if last is not None and last[0] == epoch and batch > last[1]:
                loss = ((batch + 1) * mean - (last[1] + 1) * last[2]) / (batch - last[1])
            else:
                loss = mean if batch == expected else math.nan
            if not math.isfinite(mean):
                loss = mean
            self._last_mean = (epoch, batch, mean)
            self._losses[step] = loss
            self._check_loss(step, loss, epoch)

    @_own_time
    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if not self._wrapped and self._fallback_begin is not None:
            self._record(time.perf_counter() - self._fallback_begin, None, None)
            self._fallback_begin = None
        epoch_logs = {k: _number(v) for k, v in (logs or {}).items()}
        with self._lock:  # Keras has run every on_train_batch_end of the epoch by now
            self._process_losses(final=True)
        self._flush(final=False)
        self._write(
            {"type": "epoch", "epoch": int(epoch), "step": self._global, "logs": epoch_logs}
        )
        self._write_tensorboard()
        if self._file is not None:
            self._file.flush()

    @_own_time
    def on_train_end(self, logs: Any = None) -> None:
        self._unwrap()
        with self._lock:
            self._process_losses(final=True)
        self._close()
        if self.verbose:
            self._print_summary()

    # -- the step wrapper ---------------------------------------------------------------------
    def _timed(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        watch = self

        def train_function(iterator: Any) -> Any:
            started = time.perf_counter()
            data = next(iterator)  # StopIteration ends the epoch, as in Keras' own function
            ready = time.perf_counter()
            if watch._stats:
                tfb.reset_peak(watch._device)
            step_started = time.perf_counter()
            try:
                outputs = original(iter([data]))
            except BaseException as exc:
                watch._unwrap()
                if tfb.is_oom(exc):
                    watch._on_oom(exc, data)
                raise
            ended = time.perf_counter()
            since = watch._last_end if watch._last_end is not None else started
            watch._last_end = ended
            watch._record(ended - since, ready - started, data)
            watch._add_own(step_started - ready + time.perf_counter() - ended)
            return outputs

        train_function.guarded_step = getattr(original, "guarded_step", None)  # type: ignore[attr-defined]
        return train_function

    def _unwrap(self) -> None:
        if self._wrapped and self._original is not None and self.model is not None:
            self.model.train_function = self._original
        self._wrapped = False
        self._original = None

    # -- recording ----------------------------------------------------------------------------
    def _record(self, step_seconds: float, wait: float | None, data: Any) -> None:
        step = self._global
        self._global += 1
        current = peak = None
        if self._stats:
            info = tfb.memory_info(self._device)
            if info is not None:
                current, peak = info["current"], info["peak"]
                guarded_peak = getattr(self._guarded, "last_peak_bytes", None)
                if guarded_peak is not None:
                    peak = max(guarded_peak, current)
        traces = (
            self._guarded.trace_count
            if self._guarded is not None
            else tfb.tracing_count(self._functions)
            if self._functions
            else None
        )
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
            "batch_size": _batch_size(data) if data is not None and step < 2 else None,
        }
        if record["batch_size"] is None and self.steps:
            record["batch_size"] = self.steps[-1]["batch_size"]
        with self._lock:
            self.steps.append(record)
        if step == self.warmup_steps:
            self._traces_at_warmup = traces
        if self._guarded is not None:
            self._check_recoveries(step)
        if step >= self.warmup_steps:
            self._check_memory(step, record)
            if wait is not None and step % 5 == 0:
                self._check_input(step)
        if len(self.steps) - self._written >= 64:
            self._flush(final=False)

    # -- detectors ----------------------------------------------------------------------------
    def _check_memory(self, step: int, record: dict[str, Any]) -> None:
        traces = record["traces"]
        if traces is not None and self._traces_at_warmup is not None:
            retraces = traces - self._traces_at_warmup
            if retraces >= 5 and "retracing" not in self._fired:
                self._found(
                    "retracing",
                    step,
                    f"the train function was traced again {retraces} times after warm-up "
                    f"(in {step - self.warmup_steps} steps)",
                    cause=_retrace_cause(self._guarded is not None),
                    fix=_retrace_fix(self._guarded is not None),
                    evidence={
                        "traces": traces,
                        "retraces_after_warmup": retraces,
                        "steps_after_warmup": step - self.warmup_steps,
                    },
                )
        current, peak = record["memory_current_bytes"], record["memory_peak_bytes"]
        if current is None:
            return
        if self._floors.add(step, current, traces or 0) and "memory_growth" not in self._fired:
            self._check_growth(step)
        if peak is not None and self._budget_bytes and "near_budget" not in self._fired:
            self._check_budget(step, peak, record["batch_size"])

    def _check_growth(self, step: int) -> None:
        floors = self._floors
        n = len(floors.values)
        for start in (0, n // 2):
            values = floors.values[start:]
            if len(values) < 6:
                continue
            third = len(values) // 3
            parts = [values[:third], values[third : 2 * third], values[2 * third :]]
            m1, m2, m3 = (_median(p) for p in parts)
            rise = m3 - m1
            if rise < max(self.growth_bytes, self.growth_fraction * m1):
                continue
            if m2 - m1 < 0.2 * rise or m3 - m2 < 0.2 * rise:
                continue  # one jump (a cache, a new function), not a steady rise
            steps_up = [b - a for a, b in zip(values, values[1:], strict=False)]
            if max(steps_up) > 0.5 * rise or sum(d > 0.05 * rise for d in steps_up) < 3:
                continue  # most of the rise in one jump (validation's first run, a cache)
            steps = floors.steps[start:]
            centre1 = _median([float(s) for s in steps[:third]])
            centre3 = _median([float(s) for s in steps[2 * third :]])
            per_step = rise / max(1.0, centre3 - centre1)
            traces = floors.traces[start:]
            retraced = traces[-1] - traces[0]
            evidence: dict[str, Any] = {
                "growth_bytes_per_step": int(per_step),
                "rise_bytes": int(rise),
                "from_bytes": int(m1),
                "to_bytes": int(m3),
                "steps": int(steps[-1] - steps[0]),
                "retraces": int(retraced),
            }
            message = (
                f"memory left in use after each step grew by {format_size(int(rise))} "
                f"({format_size(int(m1))} -> {format_size(int(m3))}), about "
                f"{format_size(int(per_step))} per step"
            )
            if self._budget_bytes:
                left = self._budget_bytes - max(
                    s["memory_peak_bytes"] or 0 for s in self.steps[-5:]
                )
                steps_left = max(0, int(left / per_step))
                evidence["steps_to_budget"] = steps_left
                message += f"; at this rate the budget is used up in about {steps_left} steps"
            if retraced >= 2:
                cause = (
                    f"the train function was traced {retraced} more times while memory grew: "
                    + _retrace_cause(self._guarded is not None)
                )
                fix = _retrace_fix(self._guarded is not None)
                evidence["cause"] = "retracing"
            else:
                cause = (
                    "memory grows while the train function is not retraced: Python keeps "
                    "tensors alive from step to step, e.g. a callback or loop appending model "
                    "outputs, losses or gradients (tensors) to a list, or a metric accumulated "
                    "as a tensor"
                )
                fix = (
                    "keep Python numbers (`float(t)`, `t.numpy()`) or running aggregates "
                    "instead of tensors, clear such lists every epoch, or use keras.metrics; "
                    "check custom callbacks first"
                )
                evidence["cause"] = "python_references"
            self._found("memory_growth", step, message, cause, fix, evidence, "problem")
            return

    def _check_budget(self, step: int, peak: int, batch_size: int | None) -> None:
        budget = self._budget_bytes
        assert budget
        if peak < (1 - self.headroom) * budget:
            return
        floor = min(s["memory_current_bytes"] or peak for s in self.steps[-10:])
        evidence: dict[str, Any] = {
            "peak_bytes": int(peak),
            "budget_bytes": int(budget),
            "headroom_fraction": round(1 - peak / budget, 4),
            "batch_size": batch_size,
        }
        message = (
            f"the step's peak {format_size(peak)} leaves {100 * (1 - peak / budget):.1f}% of "
            f"the budget {format_size(budget)} free"
            if peak < budget
            else f"the step's peak {format_size(peak)} is above the budget {format_size(budget)}"
        )
        if batch_size and peak > floor:
            per_sample = (peak - floor) / batch_size
            oom_batch = int((budget - floor) / per_sample) + 1
            evidence["per_sample_bytes"] = int(per_sample)
            evidence["oom_batch_size"] = oom_batch
            message += f"; a batch of about {oom_batch} (or larger inputs) would not fit"
        self._found(
            "near_budget",
            step,
            message,
            cause=(
                "activations for this batch and input size nearly fill the device; a larger "
                "batch, larger inputs (a later shard of bigger images) or memory fragmentation "
                "will run out of memory"
            ),
            fix=(
                "train with memfit.fit (it splits a batch that does not fit into micro-batches "
                "and keeps the effective batch), or lower the batch (`memfit batch` finds the "
                "largest that fits), or use mixed precision"
            ),
            evidence=evidence,
        )

    def _check_input(self, step: int) -> None:
        if "input_bound" in self._fired:
            return
        recent = [
            s
            for s in self.steps[-60:]
            if s["step"] >= self.warmup_steps and s["input_wait_seconds"] is not None
        ]
        # Steps that traced are slow for another reason.
        recent = [
            s
            for i, s in enumerate(recent)
            if i == 0 or s["traces"] is None or s["traces"] == recent[i - 1]["traces"]
        ]
        if len(recent) < 20:
            return
        wait = sum(s["input_wait_seconds"] for s in recent)
        total = sum(s["step_seconds"] for s in recent)
        if total <= 0:
            return
        fraction = wait / total
        mean_wait = wait / len(recent)
        if fraction < self.input_bound_fraction or mean_wait < MIN_INPUT_WAIT_SECONDS:
            return
        self._found(
            "input_bound",
            step,
            f"{100 * fraction:.0f}% of each step is spent waiting for the next batch "
            f"({1000 * mean_wait:.1f} ms of {1000 * total / len(recent):.1f} ms); the device "
            f"idles meanwhile",
            cause=(
                "the input pipeline produces batches slower than the model consumes them: a "
                "`map` without `num_parallel_calls`, no `prefetch`, Python in the pipeline, "
                "or data read from slow storage on every epoch"
            ),
            fix=_PIPELINE_FIX,
            evidence={
                "input_wait_fraction": round(fraction, 4),
                "input_wait_seconds": round(mean_wait, 6),
                "step_seconds": round(total / len(recent), 6),
                "steps": len(recent),
            },
        )

    def _check_loss(self, step: int, loss: float, epoch: int) -> None:
        history = self._loss_history
        if not math.isfinite(loss):
            if "non_finite_loss" not in self._fired:
                last = history[-1] if history else None
                self._found(
                    "non_finite_loss",
                    step,
                    f"the loss is {loss}"
                    + (f" (the last finite loss was {last:.4g})" if last is not None else ""),
                    cause=(
                        "the weights or activations overflowed: a learning rate too high for "
                        "the model, no warm-up, exploding gradients, or invalid inputs/labels "
                        "(NaN in the data, a log of 0)"
                    ),
                    fix=_LR_FIX + "; check the data for NaN/Inf",
                    evidence={"loss": str(loss), "last_finite_loss": last, **self._lr()},
                    severity="problem",
                    epoch=epoch,
                )
            return
        history.append(loss)
        if "divergence" in self._fired or len(history) < 2:
            return
        base = _median(history[:3]) if len(history) > 3 else history[0]
        recent = _median(history[-21:-1])
        pattern = None
        if loss > self.spike_factor * recent and loss > 1.5 * base and loss > 1e-6:
            pattern = "spike"
            message = (
                f"the loss jumped to {loss:.4g}, {loss / recent:.1f}x its recent median "
                f"{recent:.4g} (it started at {base:.4g})"
            )
        elif len(history) >= 20:
            last10, prev10 = _median(history[-10:]), _median(history[-20:-10])
            if last10 > 1.5 * prev10 and last10 > 1.2 * base:
                pattern = "increase"
                message = (
                    f"the loss is climbing: median {prev10:.4g} -> {last10:.4g} over the last "
                    f"20 steps (it started at {base:.4g})"
                )
            elif len(history) >= self.plateau_steps and _median(history[-50:]) >= 0.97 * base:
                pattern = "plateau"
                message = (
                    f"the loss has not fallen in {len(history)} steps: median of the last 50 "
                    f"is {_median(history[-50:]):.4g}, it started at {base:.4g}"
                )
        if pattern is None:
            return
        cause = {
            "spike": "updates too large for the loss surface: the learning rate is too high "
            "(or was not warmed up), or a bad batch produced huge gradients",
            "increase": "the optimizer is overshooting: the learning rate is too high for "
            "this model and batch",
            "plateau": "the model is not learning: a learning rate far too high (bouncing) or "
            "too low, dead activations after a blow-up, or labels that do not match the loss",
        }[pattern]
        fix = (
            _LR_FIX
            if pattern != "plateau"
            else (
                "try learning rates 10x lower and 10x higher on a short run, add a warm-up, and "
                "check that labels match the loss (e.g. sparse vs one-hot, from_logits)"
            )
        )
        self._found(
            "divergence",
            step,
            message,
            cause,
            fix,
            {
                "pattern": pattern,
                "loss": loss,
                "start_loss": base,
                "recent_median_loss": recent,
                **self._lr(),
            },
            "problem",
            epoch=epoch,
        )

    def _check_recoveries(self, step: int) -> None:
        recoveries = self._guarded.summary.recoveries
        for recovery in recoveries[self._recoveries_seen :]:
            self._found(
                "oom_recovery",
                step,
                f"memfit.fit recovered from an out-of-memory error: {recovery}",
                cause=(
                    f"the {recovery.phase} of a step with {recovery.old_micro_batches} "
                    f"micro-batch(es) needed more memory than the device had"
                ),
                fix=(
                    f"nothing is lost; to skip the retry, start with micro_batches="
                    f"{recovery.new_micro_batches} (or a `memfit plan`), or use smaller inputs"
                ),
                evidence={
                    "update": recovery.update,
                    "phase": recovery.phase,
                    "old_micro_batches": recovery.old_micro_batches,
                    "new_micro_batches": recovery.new_micro_batches,
                    "peak_bytes": recovery.peak_bytes,
                    "recovery_seconds": round(recovery.seconds, 4),
                },
                once=False,
                quiet=bool(getattr(self._guarded, "verbose", False)),
            )
        self._recoveries_seen = len(recoveries)

    def _on_oom(self, exc: BaseException, data: Any) -> None:
        info = tfb.memory_info(self._device) if self._stats else None
        batch = _batch_size(data)
        self._found(
            "oom",
            self._global,
            f"the step ran out of memory ({tfb.oom_summary(exc)})",
            cause="the step at this batch and input size needs more memory than the device has",
            fix=(
                "train with memfit.fit (it splits the batch into micro-batches on OOM without "
                "losing progress), find the largest batch that fits with `memfit batch`, or use "
                "mixed precision or smaller inputs"
            ),
            evidence={
                "peak_bytes": info["peak"] if info else None,
                "budget_bytes": self._budget_bytes,
                "batch_size": batch,
            },
            severity="problem",
        )
        self._flush(final=True)
        self._close()

    def _check_repeated_fits(self, current: int) -> None:
        _FIT_STARTS.append(current)
        starts = _FIT_STARTS[-4:]
        if len(starts) < 3 or "memory_growth" in self._fired:
            return
        rises = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        total = starts[-1] - starts[0]
        if min(rises) <= 0 or total < max(self.growth_bytes, self.growth_fraction * starts[0]):
            return
        self._found(
            "memory_growth",
            self._global,
            f"memory in use when fit starts rose over the last {len(starts)} fits in this "
            f"process: {' -> '.join(format_size(s) for s in starts)}",
            cause=(
                "models are built or fitted again and again in one process, and the old ones "
                "(their weights, optimizer state and traced functions) are still referenced"
            ),
            fix=(
                "drop references to old models and call `keras.backend.clear_session()` and "
                "`gc.collect()` between builds, or run each trial in its own process"
            ),
            evidence={"fit_start_bytes": starts, "rise_bytes": total, "cause": "repeated_fit"},
            severity="problem",
        )

    # -- findings and output ------------------------------------------------------------------
    def _found(
        self,
        kind: str,
        step: int,
        message: str,
        cause: str,
        fix: str,
        evidence: dict[str, Any],
        severity: str = "warning",
        *,
        epoch: int | None = None,
        once: bool = True,
        quiet: bool = False,
    ) -> None:
        with self._lock:
            if once and kind in self._fired:
                return
            self._fired.add(kind)
            finding = WatchFinding(
                kind=kind,
                step=step,
                epoch=self._epoch if epoch is None else epoch,
                message=message,
                cause=cause,
                fix=fix,
                evidence=evidence,
                severity=severity,
            )
            self.findings.append(finding)
            self._write({"type": "finding", **finding.to_dict()})
            if self.verbose and not quiet:
                self._print_finding(finding)

    def _lr(self) -> dict[str, Any]:
        try:
            return {"learning_rate": float(self.model.optimizer.learning_rate)}
        except Exception:  # noqa: BLE001 - a schedule or a missing optimizer: no number
            return {}

    def _header(self, model: Any, spe: int) -> dict[str, Any]:
        keras = tfb.import_keras()
        versions = tfb.versions()
        params = getattr(self, "params", None) or {}
        try:
            policy = keras.mixed_precision.dtype_policy().name
        except Exception:  # noqa: BLE001
            policy = None
        optimizer = getattr(model, "optimizer", None)
        config: dict[str, Any] = {
            "epochs": params.get("epochs"),
            "steps_per_epoch": params.get("steps"),
            "steps_per_execution": spe,
            "precision": policy,
            "optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "micro_batches": getattr(self._guarded, "micro_batches", None),
            "memfit_fit": self._guarded is not None,
            "parameters": int(model.count_params()) if model.built else None,
        }
        config.update(self._lr())
        config.update(self.config)
        budget = self.budget or emulated_budget()
        return {
            "type": "header",
            "format": LOG_FORMAT,
            "tool": "memfit.watch",
            "name": self.name or getattr(model, "name", None) or "run",
            "model": getattr(model, "name", None),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "device": self._device,
            "memory_stats": self._stats,
            "budget_bytes": self._budget_bytes,
            "budget_name": str(budget) if budget is not None else None,
            "estimate_peak_bytes": self.estimate_bytes,
            "input_wait_measured": self._wrapped,
            "tensorflow": versions.get("tensorflow"),
            "keras": versions.get("keras"),
            "config": config,
        }

    def _write(self, data: dict[str, Any]) -> None:
        if self._file is None:
            return
        with self._lock:
            self._file.write(json.dumps(data, default=_json_default) + "\n")

    def _flush(self, final: bool) -> None:
        """Write step lines whose loss has arrived (all of them when `final`)."""
        if self._file is None:
            self._written = len(self.steps)
            return
        with self._lock:
            end = len(self.steps)
            while self._written < end:
                record = self.steps[self._written]
                loss = self._losses.get(record["step"])
                if loss is None and not final and end - self._written < 64:
                    break
                line = {**record, "loss": None if loss is None else _number(loss)}
                self._file.write(json.dumps(line, default=_json_default) + "\n")
                self._written += 1

    def _write_tensorboard(self) -> None:
        if self._writer is None:
            return
        with self._lock:
            records = self.steps[self._tb_written :]
            self._tb_written = len(self.steps)
        series: dict[str, tuple[list[int], list[float]]] = {}

        def add(key: str, step: int, value: Any) -> None:
            if value is not None and math.isfinite(value):
                steps, values = series.setdefault(f"memfit/{key}", ([], []))
                steps.append(step)
                values.append(float(value))

        for r in records:
            for key in (
                "memory_current_bytes",
                "memory_peak_bytes",
                "step_seconds",
                "input_wait_seconds",
            ):
                add(key, r["step"], r.get(key))
            add("loss", r["step"], self._losses.get(r["step"]))
        for tag, (steps, values) in series.items():
            self._writer.write(tag, steps, values)
        self._writer.flush()

    def _close(self) -> None:
        self._flush(final=True)
        self._write_tensorboard()
        if self._file is not None:
            summary = self.summary()
            self._write({"type": "end", **summary})
            self._file.close()
            self._file = None

    def summary(self) -> dict[str, Any]:
        """Totals of the run so far: steps, time, input wait, peak memory, findings.

        `watch_seconds` is the time spent in Watch's own code (its hooks and the work it adds
        around each step), and `watch_overhead_fraction` that time as a share of the steps'.
        """
        with self._lock:
            steps = list(self.steps)
        timed = [s for s in steps[self.warmup_steps :] if s["step_seconds"]] or steps
        total = sum(s["step_seconds"] for s in timed)
        waits = [s["input_wait_seconds"] for s in timed if s["input_wait_seconds"] is not None]
        peaks = [s["memory_peak_bytes"] for s in steps if s["memory_peak_bytes"] is not None]
        trained = sum(s["step_seconds"] for s in steps)
        return {
            "steps": len(steps),
            "seconds": round(time.perf_counter() - self._started, 3) if self._begun else 0.0,
            "watch_seconds": round(self._own_seconds, 6),
            "watch_overhead_fraction": (
                round(self._own_seconds / trained, 6) if steps and trained else None
            ),
            "mean_step_seconds": round(total / len(timed), 6) if timed else None,
            "input_wait_fraction": round(sum(waits) / total, 4) if waits and total else None,
            "peak_bytes": max(peaks) if peaks else None,
            "micro_batches": dict(self._guarded.summary.micro_batches) if self._guarded else None,
            "findings": len(self.findings),
        }

    def _console_(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)
        return self._console

    def _print_finding(self, finding: WatchFinding) -> None:
        from rich.markup import escape

        style = "bold red" if finding.severity == "problem" else "bold yellow"
        self._console_().print(
            f"\n[{style}]memfit watch: {escape(finding.kind)}[/] at step {finding.step}: "
            f"{escape(finding.message)}\n  [bold]cause:[/] {escape(finding.cause)}\n"
            f"  [bold]fix:[/] {escape(finding.fix)}"
        )

    def _print_summary(self) -> None:
        s = self.summary()
        parts = [f"{s['steps']} steps"]
        if s["mean_step_seconds"]:
            parts.append(f"{1000 * s['mean_step_seconds']:.1f} ms/step")
        if s["input_wait_fraction"] is not None:
            parts.append(f"input wait {100 * s['input_wait_fraction']:.0f}%")
        if s["peak_bytes"]:
            parts.append(f"peak {format_size(s['peak_bytes'])}")
        if s["watch_overhead_fraction"] is not None:
            parts.append(f"watch's own time {100 * s['watch_overhead_fraction']:.2f}%")
        kinds = ", ".join(sorted({f.kind for f in self.findings})) or "none"
        style = "green" if not self.findings else "yellow"
        self._console_().print(
            f"[{style}]memfit watch:[/] {'; '.join(parts)}; findings: {kinds}"
            + (f" (log: {self.log_path})" if self.log_path else "")
        )


_WATCH_CLASS: type | None = None


def watch_class() -> type:
    """`memfit.Watch`: built on first use, so `import memfit` does not import Keras."""
    global _WATCH_CLASS
    if _WATCH_CLASS is None:
        keras = tfb.import_keras()
        _WATCH_CLASS = type(
            "Watch",
            (_WatchBase, keras.callbacks.Callback),
            {"__doc__": _WatchBase.__doc__, "__module__": __name__, "__qualname__": "Watch"},
        )
    return _WATCH_CLASS


def __getattr__(name: str) -> Any:
    if name == "Watch":
        return watch_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _retrace_cause(guarded: bool) -> str:
    if guarded:
        return (
            "memfit.fit traces its step for each new input shape exactly, and batches keep "
            "arriving with new shapes (each traced function keeps its graph and buffers)"
        )
    return (
        "tf.function traces again for each new input signature: batches with varying shapes "
        "(variable image sizes or sequence lengths, a last smaller batch), Python numbers "
        "passed as arguments, or the model recompiled / train_function reset"
    )


def _retrace_fix(guarded: bool) -> str:
    return (
        "give batches a few fixed shapes: resize or pad to size buckets "
        "(`padded_batch`, `tf.data.experimental.bucket_by_sequence_length`), batch with "
        "`drop_remainder=True`, pass tensors rather than Python numbers, and do not compile "
        "or reset the train function inside the loop"
    )


def _batch_size(data: Any) -> int | None:
    tf = tfb.import_tf()
    for leaf in tf.nest.flatten(data):
        values = getattr(leaf, "values", None)
        if isinstance(values, tuple) and values:
            leaf = values[0]
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) and shape[0] is not None:
            return int(shape[0])
    return None


def _estimate_bytes(estimate: Any) -> int | None:
    if estimate is None:
        return None
    value = getattr(estimate, "peak_bytes", estimate)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise MemfitError(
            f"estimate must be a number of bytes or have peak_bytes, got {estimate!r}"
        )
    return int(value)


def _number(value: Any) -> Any:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else str(number)


def _json_default(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
