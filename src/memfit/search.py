"""Search: the largest batch size that fits a budget, found from measurements."""

from __future__ import annotations

import math
import os
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
# A calibration trial goes at most this many times further than the largest size measured.
CALIBRATION_GROWTH = 3
# An in-process search with a dataset hands its largest samples, at most this many, to the
# fresh processes of the deciding trials.
FRESH_SAMPLES = 512


@dataclass
class Trial:
    """One measured batch size in a search.

    `deciding`: traced for its exact shape and measured in a fresh process (the trials the
    answer rests on); otherwise a calibration trial on the shared relaxed trace.
    """

    batch_size: int
    oom: bool
    peak_bytes: int | None
    seconds: float
    predicted_peak_bytes: int | None = None
    fits: bool = False
    deciding: bool = False


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
        seconds: wall time of the search.
        decided_in: `"fresh_processes"` (the deciding trials each ran in a new process) or
            `"this_process"` (the model could not be saved for a child).
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
    decided_in: str = "fresh_processes"

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
            "decided_in": self.decided_in,
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

    Calibration: peaks measured at batch 1 and 4, then at sizes at most 3x further each time
    towards the predicted limit (aiming a little short), give the step's memory per sample;
    these trials share one trace with a relaxed batch dimension (cheap, in this process or
    one child). Deciding: the predicted largest size and the one above it are each traced
    exactly (the graph `memfit.fit` runs) and measured in a fresh child process, side by side;
    those processes start while the calibration runs, so they are ready when needed. A miss
    narrows the bracket (just below an overshoot, then thirds of what is left) until a size
    that fits and one that fails are next to each other (or within the margin), both measured
    in fresh processes: the answer holds for a fresh process, as the user's training is.
    Peaks that are not linear in the batch size (kernels and workspaces change with size)
    cost rounds, never the answer.

    The model is never trained: calibration trials restore every variable bit for bit (see
    `memfit.measure`); with `isolated=True` the model in this process is not touched at all.
    The deciding trials of an in-process search run on a saved copy of the model (and of the
    dataset's largest samples); a model that cannot be saved is decided in this process
    instead (`decided_in == "this_process"`; after OOMs, this process's allocator is
    fragmented and may fail sizes a fresh process fits).

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
        isolated: run the calibration in a child process that builds the model once and
            measures size after size (replaced after an OOM), so this process needs no
            TensorFlow state and its model is not touched.
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
    """Measures batch sizes: calibration trials in one place, deciding trials in fresh processes.

    Calibration trials run with one warm-up + one step on a shared, relaxed trace, in this
    process or (isolated) in one child that is replaced after an OOM. Deciding trials each run
    in a fresh child process that was started ahead (TensorFlow imported, model loaded, while
    the calibration ran) and is closed after its one trial; two run side by side. When the
    model cannot travel to a child (it cannot be saved), deciding trials run in this process.
    """

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
        from memfit.isolate import ChildWorker, _shapes, check_child_arguments, save_for_child

        self.isolated = isolated
        self.budget = budget
        self.worst_case = worst_case
        self._tmp = tempfile.TemporaryDirectory(prefix="memfit-search-")
        self.dataset_size: int | None = None
        self.largest_sample: dict[str, Any] | None = None
        self.resident_bytes: int | None = None
        self.worker: ChildWorker | None = None
        self.fresh: _FreshWorkers | None = None
        self.fresh_note: str | None = None
        shapes = [list(s) for s in _shapes(input_shape)] if input_shape else None
        if isolated:
            model_spec = model if isinstance(model, str) else save_for_child(model, self._tmp.name)
            check_child_arguments(optimizer, loss, data)
            child_kwargs = {
                "spec": model_spec,
                "data": data,
                "input_shape": shapes,
                "optimizer": optimizer,
                "loss": loss,
                "worst_case": worst_case,
            }
            # One child loads the model once and measures the calibration sizes; after an OOM
            # it is replaced, so the next trial starts on a fresh allocator.
            self.worker = ChildWorker("memfit._child:open_measurer", child_kwargs, budget=budget)
            self.worker.start()
            self.fresh = _FreshWorkers(child_kwargs, budget)
            if data is not None:
                self.dataset_size = _child_dataset_size(data)
            return
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
        self.fresh = self._fresh_for_model(model, shapes)

    def _fresh_for_model(self, model: Any, shapes: Any) -> _FreshWorkers | None:
        """Fresh children for the deciding trials of an in-process search, if the model travels."""
        from memfit.isolate import save_for_child

        try:
            spec = save_for_child(model, self._tmp.name)
        except MemfitError as exc:
            self.fresh_note = f"decided in this process: {exc}"
            return None
        saved_data = None
        if self.workload.data is not None:
            saved_data = os.path.join(self._tmp.name, "samples")
            self._save_largest_samples(saved_data)
        # The saved model carries its compiled optimizer and loss.
        return _FreshWorkers(
            {
                "spec": spec,
                "data": None,
                "saved_data": saved_data,
                "input_shape": shapes,
                "optimizer": None,
                "loss": None,
                "worst_case": self.worst_case,
                "imports": _packages_of(model),
            },
            self.budget,
        )

    def _save_largest_samples(self, path: str) -> None:
        """The dataset's largest samples, largest first, for the children (`Dataset.save`)."""
        tf = tfb.import_tf()
        dataset = self.workload.data
        ranked = self.workload.ranked_samples()
        # Largest first (the children rank them again, in the same order), else the first ones.
        keep = (
            ranked[:FRESH_SAMPLES] if self.worst_case else list(range(len(ranked)))[:FRESH_SAMPLES]
        )
        wanted = set(keep)
        chosen: dict[int, Any] = {}
        for index, sample in enumerate(dataset):
            if index in wanted:
                chosen[index] = sample
        ordered = tf.data.Dataset.from_generator(
            lambda: (chosen[i] for i in keep), output_signature=dataset.element_spec
        )
        ordered.save(path)

    def calibrate(self, batch_size: int) -> Measurement:
        """A calibration trial: the shared relaxed trace, in this process or the one child."""
        if self.worker is None:
            return measure_workload(
                self.workload,
                batch_size,
                repeats=1,
                device=self.device,
                budget=self.budget,
                exact=False,
            )
        from memfit.isolate import measurement_from_child

        try:
            result = self.worker.call(batch_size=int(batch_size), repeats=1, exact=False)
        except MemfitError:
            self.worker.close()
            raise
        measurement = measurement_from_child(result, int(batch_size), self.budget)
        if measurement.oom:
            self.worker.close()
        if self.resident_bytes is None and self.worker.resident is not None:
            self.resident_bytes = self.worker.resident
        return measurement

    def warm(self) -> None:
        """Start the deciding trials' processes now (they get ready while calibration runs)."""
        if self.fresh is not None:
            self.fresh.warm()

    def end_calibration(self) -> None:
        """Free the calibration child (its CPU and memory go to the deciding trials)."""
        if self.worker is not None:
            self.worker.close()

    def decide(self, sizes: list[int], more: bool) -> list[tuple[Measurement, float]]:
        """Deciding trials: each size traced exactly in a fresh process, side by side.

        `more`: more rounds are likely, so the next round's processes start right away.
        """
        if self.fresh is not None:
            return self.fresh.measure(sizes, more)
        results = []
        for size in sizes:
            start = time.perf_counter()
            m = measure_workload(
                self.workload, size, repeats=1, device=self.device, budget=self.budget
            )
            results.append((m, time.perf_counter() - start))
        return results

    def close(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
        if self.fresh is not None:
            self.fresh.shutdown()
        self._tmp.cleanup()


def _packages_of(model: Any) -> list[str]:
    """Top-level packages (besides Keras) whose layers the model uses: the child imports them
    before loading the saved model, so their classes are registered."""
    layers = [model, *getattr(model, "_flatten_layers", lambda: [])()]
    names = {type(layer).__module__.split(".")[0] for layer in layers}
    return sorted(names - {"keras", "builtins", "__main__"})


class _FreshWorkers:
    """Child processes started ahead of need, each used for one deciding trial, then closed.

    A deciding trial's cost is mostly start-up (importing TensorFlow, building the model),
    which these children pay while the calibration runs; two trials then run side by side
    (tracing is single-threaded Python and TensorFlow's 10 s wait before an OOM is raised is
    idle time, so two overlap well even on two cores).
    """

    def __init__(self, kwargs: dict[str, Any], budget: Budget, count: int = 2) -> None:
        self.kwargs, self.budget, self.count = kwargs, budget, count
        self.spare: list[Any] = []

    def warm(self) -> None:
        from memfit.isolate import ChildWorker

        while len(self.spare) < self.count:
            worker = ChildWorker("memfit._child:open_measurer", self.kwargs, budget=self.budget)
            worker.start()
            self.spare.append(worker)

    def measure(self, sizes: list[int], more: bool = False) -> list[tuple[Measurement, float]]:
        """One trial per size, each in its own fresh process; `more` starts the next ones now
        (they import TensorFlow while these trace, and while an OOM waits out TensorFlow's
        10 s allocator retry)."""
        from memfit.isolate import measurement_from_child

        self.count = max(self.count, len(sizes))
        self.warm()
        workers = [self.spare.pop(0) for _ in sizes]
        try:
            started = time.perf_counter()
            tickets = [
                w.submit(batch_size=int(s), repeats=1, exact=True)
                for w, s in zip(workers, sizes, strict=True)
            ]
            if more:
                self.warm()
            results = []
            for worker, ticket, size in zip(workers, tickets, sizes, strict=True):
                raw = worker.collect(ticket)
                m = measurement_from_child(raw, int(size), self.budget)
                results.append((m, time.perf_counter() - started))
        finally:
            for worker in workers:
                worker.shutdown()
        return results

    def shutdown(self) -> None:
        # Unused: stopped at once (one still importing TensorFlow would not read its stdin).
        for worker in self.spare:
            worker.shutdown(kill=True)
        self.spare = []


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
        decided_in="this_process" if run.fresh is None else "fresh_processes",
    )
    peaks: dict[int, int] = {}  # calibration sizes that fit -> measured peak (relaxed trace)

    def record(
        size: int, m: Measurement, predicted: int | None, seconds: float, fresh: bool
    ) -> bool:
        ok = not m.oom and m.peak_bytes is not None and m.peak_bytes <= limit
        t = Trial(size, m.oom, m.peak_bytes, seconds, predicted, ok, deciding=fresh)
        result.trials.append(t)
        if run.resident_bytes is None:
            run.resident_bytes = m.resident_bytes
        if on_trial is not None:
            on_trial(t)
        return ok

    def calibrate(size: int, predicted: int | None) -> bool:
        start = time.perf_counter()
        m = run.calibrate(size)
        ok = record(size, m, predicted, time.perf_counter() - start, False)
        if ok:
            peaks[size] = int(m.peak_bytes)  # type: ignore[arg-type]
        return ok

    # Calibration: batch 1, a probe a few samples away (batch 2's peak differs from batch 1's
    # by little more than the allocator's jitter), then a size a little short of the limit the
    # two predict, so that the slope spans nearly the whole range.
    if not calibrate(1, None):
        result.stopped_by = "nothing_fits"
        result.failing_batch_size = 1
        result.peak_bytes = result.trials[0].peak_bytes
        _explain_if_weights_alone_exceed(run, budget)
        return result
    lo, hi = 1, None  # calibration: largest fitting, smallest failing
    if cap >= 2:
        probe = min(cap, PROBE_BATCH)
        if calibrate(probe, None):
            lo = probe
        else:
            hi = probe
    # Then towards the predicted limit, at most CALIBRATION_GROWTH times further each time
    # (peaks are not linear in the batch: a long extrapolation can be far off), until the
    # limit is predicted within reach of what was measured.
    while lo < cap and hi is None:
        guess, predicted = _next_guess(peaks, lo, hi, cap, limit, result.trials)
        if predicted is not None and guess <= lo + max(1, lo // 2):
            break  # close enough: the deciding trials take it from here
        slope = _slope(peaks)
        if slope > 0 and 2 * guess >= lo + (limit - peaks[lo]) / slope:
            # Likely the last calibration trial: the deciding trials' processes start now and
            # get ready meanwhile (earlier, they would slow the calibration on a small CPU).
            run.warm()
        if calibrate(guess, predicted):
            lo = guess
        else:
            hi = guess
    run.end_calibration()
    run.warm()

    # Deciding: every size the answer rests on is traced exactly (the graph memfit.fit runs)
    # and measured in a fresh process, two sizes at a time, until a fitting size and a failing
    # one are next to each other (or within the margin).
    fits: dict[int, int] = {}  # deciding sizes that fit -> measured peak
    fails: set[int] = set()
    misses, overshot = 0, False
    while True:
        hi_x = min(fails, default=None)
        # A size that failed below one that fitted: the allocator's jitter; trust the failure.
        lo_x = max((s for s in fits if hi_x is None or s < hi_x), default=0)
        if hi_x == 1:
            result.stopped_by = "nothing_fits"
            result.failing_batch_size = 1
            result.peak_bytes = next(t.peak_bytes for t in result.trials if t.deciding)
            return result
        if lo_x >= cap:
            result.stopped_by = capped_by
            break
        if hi_x is not None and lo_x and hi_x - lo_x <= max(1, math.floor(margin * lo_x)):
            break
        sizes, predicted = _deciding_sizes(
            peaks, fits, lo_x, hi_x, lo, hi, cap, limit, misses, overshot
        )
        for size, (m, seconds) in zip(sizes, run.decide(sizes, misses > 0), strict=True):
            predicted_peak = predicted(size)
            if record(size, m, predicted_peak, seconds, True):
                fits[size] = int(m.peak_bytes)  # type: ignore[arg-type]
            else:
                fails.add(size)
        misses += 1
        overshot = all(size in fails for size in sizes)
    result.batch_size = lo_x
    result.peak_bytes = fits[lo_x]
    result.failing_batch_size = hi_x
    return result


def _deciding_sizes(
    peaks: dict[int, int],
    fits: dict[int, int],
    lo_x: int,
    hi_x: int | None,
    lo: int,
    hi: int | None,
    cap: int,
    limit: int,
    misses: int,
    overshot: bool,
) -> tuple[list[int], Callable[[int], int | None]]:
    """The next deciding sizes: the predicted limit and the size above it, first.

    The slope comes from the deciding trials once two that fitted are far enough apart, else
    from the calibration; it is anchored at the largest size that fitted in a deciding trial
    (an exact trace peaks a little below the shared relaxed one), else at the largest
    calibration size. When the first prediction overshot, the two sizes right below the
    failure come next; after that, the two sizes split what is left of the bracket in three
    (or are the last two candidates).
    """
    lower = lo_x + 1
    upper = min(cap, hi_x - 1) if hi_x is not None else cap
    exact_slope = _slope(fits)
    slope = exact_slope if len(fits) >= 2 and exact_slope > 0 else _slope(peaks)
    sizes = sorted(peaks)
    if fits and lo_x:
        anchor, anchor_peak = lo_x, fits[lo_x]
    else:
        anchor, anchor_peak = sizes[-1], peaks[sizes[-1]]

    def predicted(size: int) -> int | None:
        return int(anchor_peak + slope * (size - anchor)) if slope > 0 else None

    if overshot and misses == 1 and upper - lower >= 2:
        # The prediction just overshot: the limit is most likely right below the failure.
        return [upper - 1, upper], predicted
    # A calibration size that fitted but is not decided yet still counts as a likely floor.
    floor_ = max([s for s in peaks if lower <= s <= upper], default=lower)
    if hi_x is not None and misses > 0:
        if upper - floor_ < 2:
            return list(range(floor_, upper + 1)), predicted
        third = (upper - floor_) // 3
        return [floor_ + third, floor_ + 2 * third + 1], predicted
    guess: int | None = None
    if slope > 0:
        guess = anchor + math.floor((limit - anchor_peak) / slope)
        if hi is not None and lo_x < hi - 1:
            guess = min(guess, hi - 1)  # the calibration saw `hi` fail (relaxed: likely)
    if guess is None:
        base = max(lo_x, lo)
        guess = base * 2 if hi_x is None else (base + hi_x) // 2
    guess = max(lower, min(guess, upper))
    if guess + 1 <= upper:
        return [guess, guess + 1], predicted
    if guess - 1 >= lower:
        return [guess - 1, guess], predicted
    return [guess], predicted


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
    slope = _slope(peaks)
    if slope > 0:
        b = sizes[-1]
        reach = (limit - peaks[b]) / slope
        if reach > 0:
            # Aim a little short: the trial then fits and gives the slope over the whole
            # range (an OOM here would teach nothing about the slope).
            reach *= 1 - FAR_SHORTFALL
        guess = max(lo + 1, min(b + math.floor(reach), CALIBRATION_GROWTH * b))
    if guess is None or (hi is not None and guess >= hi):
        # Prediction unusable (flat or falling peaks): double, or bisect.
        guess = lo * 2 if hi is None else (lo + hi) // 2
    guess = max(lo + 1, min(guess, upper))
    if slope > 0:
        predicted_peak = int(peaks[sizes[-1]] + slope * (guess - sizes[-1]))
    return guess, predicted_peak


def _slope(peaks: dict[int, int]) -> float:
    """Bytes per sample: between the two largest fitting sizes when far enough apart (they
    follow any curvature; the allocator's jitter of a few MiB barely moves it), else between
    the smallest and the largest."""
    sizes = sorted(peaks)
    if len(sizes) < 2:
        return 0.0
    a, b = sizes[-2], sizes[-1]
    if b - a < max(3, b // 4):
        a = sizes[0]
    return (peaks[b] - peaks[a]) / (b - a)


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
