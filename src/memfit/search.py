"""Search: the largest batch size that fits a budget, found from measurements."""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.backend import tf as tfb
from memfit.budget import Budget, as_budget, emulated_budget
from memfit.errors import MemfitError, WorkloadError
from memfit.measure import Measurement, measure_workload
from memfit.sizes import format_size
from memfit.workload import InputShape, Workload

DEFAULT_MARGIN = 0.05
# Without a cap, the search stops doubling here.
DEFAULT_MAX_BATCH = 65536
PROBE_BATCH = 4
# How far short of a long extrapolation's prediction the search aims (see _next_guess).
FAR_SHORTFALL = 0.08
# Trials measured with one shared, relaxed trace (see Workload.train_function).
CALIBRATION_TRIALS = 3
# After a predicted size fails, the next try is this share below it (then bisection).
NEAR_MISS = 0.03


@dataclass
class Trial:
    """One measured batch size in a search."""

    batch_size: int
    oom: bool
    peak_bytes: int | None
    seconds: float
    predicted_peak_bytes: int | None = None
    fits: bool = False


@dataclass
class BatchSearchResult:
    """The largest batch that fits, and how it was found.

    Attributes:
        batch_size: the largest batch whose measured peak stays within the budget less the
            margin; 0 when even batch 1 does not fit.
        margin: share of the budget kept free (0.05: the peak stays below 95% of it).
        peak_bytes: measured peak at `batch_size` (at batch 1 when nothing fits).
        budget: the budget searched against.
        trials: every measured size in order, with peak or OOM and time.
        limit_bytes: `budget * (1 - margin)`, the most a fitting peak may reach.
        failing_batch_size: the smallest size seen failing (OOM or over the limit), if any.
        stopped_by: why the search ended: `"bracket"` (a passing and a failing size next to
            each other or within the margin), `"max_batch"`, `"dataset_size"`, `"nothing_fits"`.
        worst_case_samples: trials used the dataset's largest samples.
        largest_sample: shapes of that largest sample, when a dataset was given.
    """

    batch_size: int
    margin: float
    peak_bytes: int | None
    budget: Budget
    trials: list[Trial] = field(default_factory=list)
    limit_bytes: int = 0
    failing_batch_size: int | None = None
    stopped_by: str = "bracket"
    worst_case_samples: bool = False
    largest_sample: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def headroom_bytes(self) -> int | None:
        """Budget left above the peak at `batch_size`."""
        if self.peak_bytes is None or self.batch_size == 0:
            return None
        return self.budget.usable_bytes - self.peak_bytes

    @property
    def fits(self) -> bool:
        """Whether any batch size fits."""
        return self.batch_size > 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (sizes in bytes, times in seconds)."""
        return {
            "batch_size": self.batch_size,
            "margin": self.margin,
            "peak_bytes": self.peak_bytes,
            "headroom_bytes": self.headroom_bytes,
            "limit_bytes": self.limit_bytes,
            "budget": self.budget.to_dict(),
            "failing_batch_size": self.failing_batch_size,
            "stopped_by": self.stopped_by,
            "worst_case_samples": self.worst_case_samples,
            "largest_sample": self.largest_sample,
            "trials": [asdict(t) for t in self.trials],
            "search_seconds": self.seconds,
        }

    def summary(self) -> str:
        """One or two sentences for people."""
        if not self.fits:
            return (
                f"even batch size 1 does not fit: it needs {_at_least(self)} and the budget "
                f"is {format_size(self.budget.usable_bytes)} ({self.budget.name}). Run "
                f"`memfit plan` to see what would make it fit (mixed precision, recompute, "
                f"a smaller input)."
            )
        text = (
            f"largest batch: {self.batch_size} (peak {format_size(self.peak_bytes)}, "
            f"{format_size(self.headroom_bytes)} headroom in "
            f"{format_size(self.budget.usable_bytes)} with a {self.margin:.0%} margin; "
            f"{len(self.trials)} trials)"
        )
        if self.worst_case_samples:
            text += "; measured on the dataset's largest samples, so it holds for all of them"
        return text


def _at_least(result: BatchSearchResult) -> str:
    first = result.trials[0] if result.trials else None
    if first is None or first.peak_bytes is None:
        return "more than the budget"
    return ("more than " if first.oom else "") + format_size(first.peak_bytes)


def find_batch_size(
    model: Any,
    budget: Budget | str | int | None = None,
    *,
    max_batch: int | None = None,
    margin: float = DEFAULT_MARGIN,
    data: Any = None,
    input_shape: InputShape | None = None,
    optimizer: Any = None,
    loss: Any = None,
    isolated: bool = False,
    on_trial: Callable[[Trial], None] | None = None,
) -> BatchSearchResult:
    """Find the largest batch size whose training step fits the budget, from measurements.

    Peaks measured at batch 1 and 4 give the step's fixed and per-sample memory; the search
    predicts the limit from them and measures a little short of it (a long extrapolation
    multiplies the allocator's jitter), then narrows a bracket — the largest size that fits
    and the smallest that does not — re-predicting from the smallest and largest fitting
    sizes (just below a prediction that failed, else doubling or bisection), until the two
    are one apart or within the margin. An OOM or a peak above the prediction simply narrows
    the bracket, so peaks that are not linear in the batch size (kernels and workspaces
    change with size) still give the right answer. The first three trials only calibrate and
    share one trace with a relaxed batch dimension; the trials that decide the answer are
    traced for their exact shape, as `memfit.fit` runs them, each (isolated) in a fresh
    process.

    The model is never trained: each trial restores every variable bit for bit (see
    `memfit.measure`); with `isolated=True` the trials run in a child process and the model
    in this process is not touched at all. Prefer `isolated=True`: after an OOM the allocator
    of the process that had it is fragmented, and sizes near the limit fail there that fit a
    fresh process (measured: MobileNetV2 found 31 in-process against 34 isolated, of a true
    35); the isolated search replaces its child after every OOM.

    Args:
        model: a compiled Keras model, or a MODEL string with `isolated=True`.
        budget: the budget to fit (`Budget`, size, or card name). In-process: default the
            emulated budget; it must not exceed what the device really gives. Isolated: each
            trial's child emulates it.
        max_batch: never try more than this.
        margin: share of the budget kept free, 0 <= margin < 1 (default 0.05).
        data: a `tf.data.Dataset` of unbatched `(x, y)` samples (`package.module:dataset_fn`
            with `isolated=True`); trials then use its largest samples, and the dataset's
            size caps the batch.
        input_shape: shape of one sample for models with undefined input dimensions.
        optimizer: optimizer to compile with (default: the model's own, else Adam).
        loss: loss to compile with (default: the model's own).
        isolated: run the trials in a child process that builds the model once and measures
            size after size, replaced by a fresh one after every OOM (safer: an OOM cannot
            disturb the next trial, and a step that fails slowly is stopped).
        on_trial: called with each `Trial` as it completes (progress displays).

    Returns:
        A `BatchSearchResult`; `batch_size == 0` when even batch 1 does not fit.

    Example:
        ```python
        memfit.emulate("T4")
        model = build_model()                      # compiled
        result = memfit.find_batch_size(model)
        print(result.batch_size, result.summary())
        ```
    """
    if not (isinstance(margin, (int, float)) and 0 <= margin < 1):
        raise MemfitError(f"margin must be a share of the budget from 0 to below 1, got {margin!r}")
    if max_batch is not None and (isinstance(max_batch, bool) or int(max_batch) < 1):
        raise MemfitError(f"max batch must be at least 1, got {max_batch!r}")
    resolved = as_budget(budget) or emulated_budget()
    if resolved is None:
        raise MemfitError(
            "no budget to search against: pass budget= (a size or card), or emulate one with "
            "memfit.emulate() / --memory / --device"
        )
    started = time.perf_counter()
    runner = _TrialRunner(
        model, resolved, data, input_shape, optimizer, loss, isolated, data is not None
    )
    try:
        result = _search(runner, resolved, max_batch, float(margin), on_trial)
    finally:
        runner.close()
    result.seconds = time.perf_counter() - started
    return result


class _TrialRunner:
    """Measures one batch size, in this process or in a child, with one warm-up + one step."""

    def __init__(
        self,
        model: Any,
        budget: Budget,
        data: Any,
        input_shape: Any,
        optimizer: Any,
        loss: Any,
        isolated: bool,
        worst_case: bool,
    ) -> None:
        self.isolated = isolated
        self.budget = budget
        self.worst_case = worst_case
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.dataset_size: int | None = None
        self.largest_sample: dict[str, Any] | None = None
        self.resident_bytes: int | None = None
        if isolated:
            from memfit.isolate import save_for_child

            if isinstance(model, str):
                self.model_spec = model
            else:
                self._tmp = tempfile.TemporaryDirectory(prefix="memfit-search-")
                self.model_spec = save_for_child(model, self._tmp.name)
            from memfit.isolate import ChildWorker, _shapes, check_child_arguments

            check_child_arguments(optimizer, loss, data)
            # One child loads the model once and measures size after size; after an OOM it
            # is replaced, so the next trial starts on a fresh allocator.
            self.worker = ChildWorker(
                "memfit._child:open_measurer",
                {
                    "spec": self.model_spec,
                    "data": data,
                    "input_shape": [list(s) for s in _shapes(input_shape)] if input_shape else None,
                    "optimizer": optimizer,
                    "loss": loss,
                    "worst_case": worst_case,
                },
                budget=budget,
            )
            if data is not None:
                self.dataset_size = _child_dataset_size(data)
        else:
            if isinstance(model, str):
                raise WorkloadError(
                    "find_batch_size() takes a keras.Model in this process; pass isolated=True "
                    "to search a MODEL string"
                )
            self.workload = Workload(
                model,
                optimizer=optimizer,
                loss=loss,
                input_shape=input_shape,
                data=data,
                worst_case=worst_case,
            )
            self.device = tfb.default_device()
            if data is not None:
                self.dataset_size = len(self.workload.ranked_samples())
                self.largest_sample = self.workload.largest_sample()

    def __call__(self, batch_size: int, exact: bool = True) -> Measurement:
        if self.isolated:
            from memfit.isolate import measurement_from_child

            if exact:
                # A deciding trial gets a fresh process: the allocator state that earlier sizes
                # left behind moves a peak by several percent (a step that fits a fresh
                # process can fail after others ran, measured on MobileNetV2).
                self.worker.close()
            try:
                result = self.worker.call(batch_size=int(batch_size), repeats=1, exact=exact)
            except MemfitError:
                self.worker.close()
                raise
            measurement = measurement_from_child(result, int(batch_size), self.budget)
            if measurement.oom:
                self.worker.close()
            if self.resident_bytes is None and self.worker.resident is not None:
                self.resident_bytes = self.worker.resident
            return measurement
        return measure_workload(
            self.workload,
            batch_size,
            repeats=1,
            device=self.device,
            budget=self.budget,
            exact=exact,
        )

    def close(self) -> None:
        if self.isolated:
            self.worker.shutdown()
        if self._tmp is not None:
            self._tmp.cleanup()


def _child_dataset_size(spec: str) -> int:
    from memfit.isolate import run_in_child

    return int(run_in_child("memfit._child:dataset_size", {"spec": spec}))


def _search(
    run: _TrialRunner,
    budget: Budget,
    max_batch: int | None,
    margin: float,
    on_trial: Callable[[Trial], None] | None,
) -> BatchSearchResult:
    limit = int(budget.usable_bytes * (1 - margin))
    cap = int(max_batch) if max_batch is not None else DEFAULT_MAX_BATCH
    capped_by = "max_batch"
    if run.dataset_size is not None and run.dataset_size < cap:
        cap, capped_by = run.dataset_size, "dataset_size"
    result = BatchSearchResult(
        batch_size=0,
        margin=margin,
        peak_bytes=None,
        budget=budget,
        limit_bytes=limit,
        worst_case_samples=run.worst_case,
        largest_sample=run.largest_sample,
    )
    peaks: dict[int, int] = {}  # fitting sizes -> measured peak

    def trial(size: int, predicted: int | None) -> bool:
        start = time.perf_counter()
        # The probes and the first prediction only calibrate: one process, one trace shared
        # by all sizes. The sizes that decide the answer are traced exactly, as memfit.fit will
        # run them, each in a fresh process when isolated.
        exact = len(result.trials) >= CALIBRATION_TRIALS
        m = run(size, exact=exact)
        ok = not m.oom and m.peak_bytes is not None and m.peak_bytes <= limit
        t = Trial(size, m.oom, m.peak_bytes, time.perf_counter() - start, predicted, ok)
        result.trials.append(t)
        if run.resident_bytes is None:
            run.resident_bytes = m.resident_bytes
        if on_trial is not None:
            on_trial(t)
        if ok:
            peaks[size] = int(m.peak_bytes)  # type: ignore[arg-type]
        return ok

    if not trial(1, None):
        result.stopped_by = "nothing_fits"
        result.failing_batch_size = 1
        result.peak_bytes = result.trials[0].peak_bytes
        _explain_if_weights_alone_exceed(run, budget)
        return result
    lo, hi = 1, None  # largest fitting, smallest failing
    if cap >= 2:
        # A second probe a few samples away: batch 2's peak differs from batch 1's by little
        # more than the allocator's jitter, which would make the first prediction a guess.
        probe = min(cap, PROBE_BATCH)
        if trial(probe, None):
            lo = probe
        else:
            hi = probe
    while lo < cap and (hi is None or hi - lo > max(1, math.floor(margin * lo))):
        guess, predicted = _next_guess(peaks, lo, hi, cap, limit, result.trials)
        if trial(guess, predicted):
            lo = guess
        else:
            hi = guess
    result.batch_size = lo
    result.peak_bytes = peaks[lo]
    result.failing_batch_size = hi
    if hi is None or lo >= cap:
        result.stopped_by = capped_by if lo >= cap else "bracket"
    return result


def _next_guess(
    peaks: dict[int, int], lo: int, hi: int | None, cap: int, limit: int, trials: list[Trial]
) -> tuple[int, int | None]:
    """Next size to try: predicted from the two largest fitting sizes, kept inside the bracket."""
    upper = min(cap, (hi - 1) if hi is not None else cap)
    # The slope between the smallest and the largest fitting size: far apart, so the
    # allocator's jitter (a few MiB) barely moves it, and it follows any curvature.
    sizes = sorted(peaks)
    predicted_peak: int | None = None
    guess: int | None = None
    slope = 0.0
    if len(sizes) >= 2:
        a, b = sizes[0], sizes[-1]
        slope = (peaks[b] - peaks[a]) / (b - a)
        if slope > 0:
            reach = (limit - peaks[b]) / slope
            if reach > b:
                # Far beyond what was measured, the allocator's jitter at small sizes is
                # multiplied: aim a little short, so the trial fits and gives the slope over
                # the whole range (an OOM here would teach nothing about the slope).
                reach *= 1 - FAR_SHORTFALL
            # At or past the limit already: confirm with the next size up.
            guess = max(lo + 1, b + math.floor(reach))
    tried = {t.batch_size for t in trials}
    if guess is None or guess in tried or (hi is not None and guess >= hi):
        last = trials[-1] if trials else None
        before = trials[-2] if len(trials) >= 2 else None
        if (
            hi is not None
            and last is not None
            and last.batch_size == hi
            and last.predicted_peak_bytes is not None
            and (before is None or before.fits)
            and hi - lo > 2
        ):
            # A predicted size just overshot: the limit is most likely just below it. Once;
            # a second failure in a row bisects.
            guess = hi - max(1, math.floor(NEAR_MISS * hi))
        else:
            # Prediction unusable (flat or falling peaks) or stalled: double, or bisect.
            guess = lo * 2 if hi is None else (lo + hi) // 2
    guess = max(lo + 1, min(guess, upper))
    if slope > 0:
        predicted_peak = int(peaks[sizes[-1]] + slope * (guess - sizes[-1]))
    return guess, predicted_peak


def _explain_if_weights_alone_exceed(run: _TrialRunner, budget: Budget) -> None:
    """Batch 1 failing because the weights and optimizer slots alone exceed the budget."""
    resident = run.resident_bytes
    if resident is not None and resident >= budget.usable_bytes:
        raise MemfitError(
            f"the model's weights and optimizer state alone take {format_size(resident)}, more "
            f"than the {format_size(budget.usable_bytes)} budget ({budget.name}); no batch size "
            f"can fit. Use a card with more memory, a smaller model, or an optimizer with less "
            f"state (SGD keeps none, Adam two copies of the weights)"
        )
