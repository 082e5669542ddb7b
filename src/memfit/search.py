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
from memfit.checks import DEFAULT_MARGIN, check_margin, check_positive_int, check_soak_steps
from memfit.errors import MemfitError, WorkloadError
from memfit.measure import Measurement, measure_workload
from memfit.progress import Progress, shows_progress
from memfit.sizes import format_size
from memfit.workload import InputShape, Workload, shape_list

# Without a cap, the search stops doubling here.
DEFAULT_MAX_BATCH = 65536
PROBE_BATCH = 4
# How far short of a long extrapolation's prediction the search aims (see _next_guess): its
# peak has come out 5% either side of the prediction, about two samples at 20-30 sizes on, and
# a size past the limit costs a fresh process (3-5 steps' time) where one short costs a step.
FAR_SHORTFALL = 0.12
# A calibration trial goes at most this many times further than the largest size measured.
CALIBRATION_GROWTH = 3
# Near the limit, the next size goes at most this share further than the largest that fits,
# and one short of the largest predicted to fit (a prediction can overshoot: an OOM costs a
# trial in a fresh process).
NEAR_STEP = 0.125
# Steps the size found trains before it is the answer (a soak, the step `model.fit` runs, in a
# fresh process): near the limit a step's peak rises over the first steps of training as the
# allocator's free chunks split up (BFC hands a request a whole free chunk up to twice its
# size), so a size that ran two steps can run out of memory a few steps later (MobileNetV2
# 224 px under 2.3 GiB: 35 ran 3 steps and ran out at the 4th, 33 at the 6th). Under one
# region the rise went on past 15 steps (MobileNetV2 160 px, batch 32, 20 steps of
# `model.fit`: 1009 MiB at the first, 1042-1062 at steps 2-6, 1088-1107 at steps 13-18).
DEFAULT_SOAK_STEPS = 20
# How much a size's peak over the soak's steps, back to back in a fresh process, comes above
# its one-step trial peak, as the first soak assumes. MobileNetV2 96 px under 500 MiB
# (2026-11-27): trials 31 at 425.6 MiB and 33 at 443.1, soaks 454.3 (x1.067) and 499.8
# (x1.128); on a roomy card (2 GiB) the rise is larger, x1.12-1.22 at batch 32, as the
# allocator has free chunks up to twice a request's size to hand out whole.
SOAK_RISE = 1.10
# An in-process search with a dataset hands its largest samples, at most this many, to the
# child process that measures.
CHILD_SAMPLES = 512


@dataclass
class Trial:
    """One measured batch size in a search.

    `fresh`: the first trial of a fresh process (later ones run on an allocator that earlier
    trials used). `deciding`: one of the two trials the answer rests on (the largest size
    that fits, the smallest that fails). `steps`: training steps run (a warm-up in a fresh
    process, then the measured ones; the peak is the largest of the measured). `soak`: the
    steps that check a size found holds over more steps of training, from a fresh start.
    """

    batch_size: int
    oom: bool
    peak_bytes: int | None
    seconds: float
    predicted_peak_bytes: int | None = None
    fits: bool = False
    deciding: bool = False
    fresh: bool = False
    steps: int = 2
    soak: bool = False


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
        decided_in: `"child_process"` (the trials ran in a child process, replaced after an
            OOM) or `"this_process"` (the model could not be saved for a child).
        soak_steps: measured steps the answer trained before it was given (0: not soaked).
    """

    @property
    def confirmed_by(self) -> str:
        """How the answer was checked before it was given, for people and JSON."""
        if not self.fits:
            return "nothing fits"
        if self.soak_steps:
            return (
                f"trained {self.soak_steps} steps of model.fit's train function back to back "
                f"in a fresh process, after a warm-up step, peaking at "
                f"{format_size(self.peak_bytes)}: within {format_size(self.limit_bytes)} "
                f"(the budget less the {self.margin:.0%} margin)"
            )
        return "not confirmed: answered from the search's one-step trials (soak steps 0)"

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
    decided_in: str = "child_process"
    soak_steps: int = 0

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
            "soak_steps": self.soak_steps,
            "confirmed_by": self.confirmed_by,
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
        if self.soak_steps:
            text += (
                f"; confirmed: it trained {self.soak_steps} steps as model.fit runs them, in "
                f"a fresh process"
            )
        if self.worst_case_samples:
            text += "; measured on the dataset's largest samples, so it holds for all of them"
        return text


def _at_least(result: BatchSearchResult) -> str:
    first = result.trials[0] if result.trials else None
    if first is None or first.peak_bytes is None:
        return "more than the budget"
    return ("more than " if first.oom else "") + format_size(first.peak_bytes)


@shows_progress(
    "on_trial",
    lambda a: (
        "finding the largest batch size"
        + (f" for {a['budget']}" if a["budget"] is not None else "")
    ),
    "trial",
)
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
    soak_steps: int = DEFAULT_SOAK_STEPS,
    on_trial: Callable[[Trial], None] | None = None,
    classes: int | None = None,
    safe_mode: bool = True,
    progress: Progress = None,
) -> BatchSearchResult:
    """Find the largest batch size whose training step fits the budget, from measurements.

    Peaks measured at batch 1 and 4 give the step's memory per sample; each next size is
    predicted from the peaks so far: far from the limit a little short of it and at most 3x
    further (peaks are not linear in the batch: a long extrapolation can be far off), near it
    one short of the largest size predicted to fit (at most 1/8 further) and then up one at a
    time, until a size that fits and one that fails are next to each other (or within the
    margin). A surprise peak or an OOM only narrows the bracket. The trials share one trace
    with a relaxed batch dimension (traced once, while the child starts) and run one after
    the other in one child process, which leaves their updates in place (the allocator sees
    what training would); each is one measured step, after a warm-up step in a fresh
    process. A step that runs out of memory is answered as soon as it stalls in TensorFlow's
    allocator retry (`AllocatorStallWatch`), and the next trial runs in a spare child started
    when the sizes got near the limit. Every trial runs the train function `model.fit`
    builds, fed as `model.fit` feeds a dataset (see `memfit.measure`). The size found then
    trains `soak_steps` more steps in a fresh process (a soak) under a card smaller by the
    margin, which confirms it: a step's peak rises over the first steps of training, and a
    fresh process's limit moves by a size or two from one process to the next, for which the
    margin leaves room; a size whose soak runs out of memory gives way to the next smaller
    size predicted to hold, soaked in turn.

    The model in this process is never touched: the child loads the MODEL string
    (`isolated=True`) or a saved copy of the model (and of the dataset's largest samples). A
    model that cannot be saved is measured in this process (`decided_in == "this_process"`):
    every variable is restored bit for bit after each trial (see `memfit.measure`), and after
    an OOM this process's allocator is fragmented and may fail sizes a fresh process fits.

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
        isolated: `model` is a MODEL string the child loads, so this process needs no
            TensorFlow state at all.
        soak_steps: measured training steps the size found must hold for, from a fresh
            start, before it is the answer (default 20; 0 answers from the search's trials).
        on_trial: called with each `Trial` as it completes (progress displays).
        classes: classes of a built-in MODEL string (`isolated=True`).
        safe_mode: False lets the child load a trusted `.keras` file (or the saved copy of
            a model) that runs Python code, such as a Lambda layer.
        progress: a spinner and one line per trial on stderr, as the CLI shows them; default
            on when stderr is a terminal and no `on_trial` is given; False turns it off, a
            callable receives each `Trial` instead (`memfit.progress`).

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
    margin = check_margin(margin)
    if max_batch is not None:
        max_batch = check_positive_int(max_batch, "max_batch")
    soak_steps = check_soak_steps(soak_steps)
    resolved = as_budget(budget) or emulated_budget()
    if resolved is None:
        raise MemfitError(
            "no budget to search against: pass budget= (a size or card), or emulate one with "
            "memfit.emulate() / --memory / --device"
        )
    started = time.perf_counter()
    runner = _TrialRunner(
        model,
        resolved,
        data,
        input_shape,
        optimizer,
        loss,
        isolated,
        data is not None,
        classes=classes,
        safe_mode=safe_mode,
    )
    try:
        result = _search(runner, resolved, max_batch, margin, soak_steps, on_trial)
    finally:
        runner.close()
    result.seconds = time.perf_counter() - started
    return result


class _TrialRunner:
    """Measures batch sizes one after the other, in one throwaway process.

    The trials share one trace with a relaxed batch dimension (traced once, then each size
    costs only its steps) and leave their updates in place: nothing is copied, the variables
    keep their buffers, so the allocator sees what training would. They run in a child
    process — one that loads the MODEL string (`isolated=True`), or a saved copy of an
    in-process model and of the dataset's largest samples — that is replaced after an OOM.
    A model that cannot be saved is measured in this process instead, its state restored
    after every trial.
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
        classes: int | None = None,
        safe_mode: bool = True,
    ) -> None:
        from memfit.isolate import check_child_arguments, save_for_child

        self.budget = budget
        self.worst_case = worst_case
        self._tmp = tempfile.TemporaryDirectory(prefix="memfit-search-")
        self.dataset_size: int | None = None
        self.largest_sample: dict[str, Any] | None = None
        self.resident_bytes: int | None = None
        self.worker: Any = None
        self.spare: Any = None
        self._worker_trials = 0
        self._local_trials = 0
        self._child_kwargs: dict[str, Any] | None = None
        self.note: str | None = None
        shapes = [list(s) for s in shape_list(input_shape)] if input_shape else None
        if isolated:
            model_spec = model if isinstance(model, str) else save_for_child(model, self._tmp.name)
            check_child_arguments(optimizer, loss, data)
            self._start_child(
                {
                    "spec": model_spec,
                    "data": data,
                    "input_shape": shapes,
                    "optimizer": optimizer,
                    "loss": loss,
                    "worst_case": worst_case,
                    "classes": classes,
                    "safe_mode": bool(safe_mode),
                }
            )
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
        try:
            spec = save_for_child(model, self._tmp.name)
        except MemfitError as exc:
            self.note = f"measured in this process: {exc}"
            return
        saved_data = None
        if self.workload.data is not None:
            saved_data = os.path.join(self._tmp.name, "samples")
            self._save_largest_samples(saved_data)
        # The saved model carries its compiled optimizer and loss.
        self._start_child(
            {
                "spec": spec,
                "data": None,
                "saved_data": saved_data,
                "input_shape": shapes,
                "optimizer": None,
                "loss": None,
                "worst_case": self.worst_case,
                "imports": _packages_of(model),
                "safe_mode": bool(safe_mode),
            }
        )

    @property
    def in_child(self) -> bool:
        """Whether the trials run in a child process (else in this one)."""
        return self.worker is not None

    def _start_child(self, kwargs: dict[str, Any]) -> None:
        # The child traces the relaxed step while this process goes on (ranking samples, say)
        # or, for a spare, while other trials run: its first trial then costs only the
        # graph's optimisation and the steps.
        self._child_kwargs = {**kwargs, "warm_relaxed": True}
        self.worker = self._new_child()

    def _new_child(self) -> Any:
        from memfit.isolate import ChildWorker

        worker = ChildWorker("memfit._child:open_measurer", self._child_kwargs, budget=self.budget)
        worker.start()
        return worker

    def expect_oom(self) -> None:
        """The next trials may run out of memory: get a spare child ready to take over (an
        OOM leaves the child's allocator fragmented, and a child that stalled has exited)."""
        if self.worker is not None and self.spare is None:
            self.spare = self._new_child()

    def _save_largest_samples(self, path: str) -> None:
        """The dataset's largest samples, largest first, for the child (`Dataset.save`)."""
        tf = tfb.import_tf()
        dataset = self.workload.data
        ranked = self.workload.ranked_samples()
        # Largest first (the child ranks them again, in the same order), else the first ones.
        keep = ranked[:CHILD_SAMPLES] if self.worst_case else list(range(len(ranked)))
        keep = keep[:CHILD_SAMPLES]
        wanted = set(keep)
        chosen: dict[int, Any] = {}
        for index, sample in enumerate(dataset):
            if index in wanted:
                chosen[index] = sample
        ordered = tf.data.Dataset.from_generator(
            lambda: (chosen[i] for i in keep), output_signature=dataset.element_spec
        )
        ordered.save(path)

    def measure(
        self, batch_size: int, repeats: int = 1, soak: bool = False
    ) -> tuple[Measurement, bool, bool]:
        """One trial: `repeats` measured steps of `batch_size` on the relaxed trace, after a
        warm-up step in a fresh process.

        A fresh process's first steps optimise the graph and find an empty allocator, and its
        first step peaks below the ones after it: a warm-up step is run and not counted. Once
        the trace has run, a new size's first step peaks as high as its second (MobileNetV2
        224 px, sizes 30-34 after 1, 4 and 12 in one process: first minus second step -50
        to +50 MiB, both ways; 32 after batch 1 alone: -21 and -15 MiB), so later trials
        measure from their first step, and a fresh process's warm-up runs at batch 1 (the
        graph's optimisation without a full step's compute). A soak (`soak=True`) runs its
        steps back to back, as `model.fit` does, and warms up at
        its own size, as training starts. A trial passes only if every step it ran fitted.

        Returns the measurement, whether it was the first trial of a fresh process (the
        allocator's history of earlier trials moves the limit by a sample or two), and
        whether it ran a warm-up step (the first trial in this process, when measured here).
        """
        if self.worker is None:
            first = self._local_trials == 0
            self._local_trials += 1
            m = measure_workload(
                self.workload,
                batch_size,
                repeats=repeats,
                device=self.device,
                budget=self.budget,
                exact=False,
                warm_up=first,
                warm_up_batch=None if soak else 1,
                continuous=soak,
            )
            return m, False, first
        from memfit.isolate import measurement_from_child

        fresh = self._worker_trials == 0
        self._worker_trials += 1
        try:
            result = self.worker.call(
                batch_size=int(batch_size),
                repeats=int(repeats),
                exact=False,
                restore=False,
                warm_up=fresh,
                warm_up_batch=None if soak else 1,
                continuous=soak,
            )
        except MemfitError:
            self.worker.close()
            raise
        measurement = measurement_from_child(result, int(batch_size), self.budget)
        if self.resident_bytes is None and self.worker.resident is not None:
            self.resident_bytes = self.worker.resident
        if measurement.oom:
            self.fresh_process()
        return measurement, fresh, fresh

    def fresh_process(self) -> None:
        """Go on in a fresh process (the spare, if one was started): after an OOM, and
        before a soak, which trains the size found from a fresh start as training would."""
        if self.worker is None:
            return
        if self._worker_trials == 0:
            return
        self.worker.shutdown(kill=True)
        self.worker, self.spare = self.spare or self._new_child(), None
        self._worker_trials = 0

    def close(self) -> None:
        for worker in (self.worker, self.spare):
            if worker is not None:
                worker.shutdown(kill=True)
        self._tmp.cleanup()


def _packages_of(model: Any) -> list[str]:
    """Top-level packages (besides Keras) whose layers the model uses: the child imports them
    before loading the saved model, so their classes are registered."""
    layers = [model, *getattr(model, "_flatten_layers", lambda: [])()]
    names = {type(layer).__module__.split(".")[0] for layer in layers}
    return sorted(names - {"keras", "builtins", "__main__"})


def _child_dataset_size(spec: str) -> int:
    from memfit.isolate import run_in_child

    return int(run_in_child("memfit._child:dataset_size", {"spec": spec}))


def _search(
    run: _TrialRunner,
    budget: Budget,
    max_batch: int | None,
    margin: float,
    soak_steps: int,
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
        decided_in="child_process" if run.in_child else "this_process",
    )
    peaks: dict[int, int] = {}  # sizes that fit -> measured peak

    def trial(size: int, predicted: int | None, soak: int = 0) -> bool:
        start = time.perf_counter()
        m, fresh, warmed_up = run.measure(size, repeats=soak or 1, soak=bool(soak))
        ok = not m.oom and m.peak_bytes is not None and m.peak_bytes <= limit
        seconds = time.perf_counter() - start
        t = Trial(
            size,
            m.oom,
            m.peak_bytes,
            seconds,
            predicted,
            ok,
            fresh=fresh,
            steps=(soak or 1) + (1 if warmed_up else 0),
            soak=bool(soak),
        )
        result.trials.append(t)
        if run.resident_bytes is None:
            run.resident_bytes = m.resident_bytes
        if ok:
            peaks[size] = int(m.peak_bytes)  # type: ignore[arg-type]
        if on_trial is not None:
            on_trial(t)
        return ok

    # Batch 1, a probe a few samples away (batch 2's peak differs from batch 1's by little
    # more than the allocator's jitter), then sizes predicted from the peaks: far from the
    # limit a little short of it and at most 3x further, near it right at it, until a size
    # that fits and one that fails are next to each other (or within the margin).
    if not trial(1, None):
        result.stopped_by = "nothing_fits"
        result.failing_batch_size = 1
        result.peak_bytes = result.trials[0].peak_bytes
        _explain_if_weights_alone_exceed(run, budget)
        return result
    lo, hi = 1, None  # largest size that fits, smallest that fails
    if cap >= 2:
        probe = min(cap, PROBE_BATCH)
        if trial(probe, None):
            lo = probe
        else:
            hi = probe
    while True:
        if lo >= cap:
            result.stopped_by = capped_by
            break
        if hi is not None and hi - lo <= max(1, math.floor(margin * lo)):
            break
        guess, predicted, near = _next_guess(peaks, lo, hi, cap, limit)
        # An OOM ends this process's trials: when one is likely and more trials would follow
        # it, get a fresh process ready meanwhile (not for lo + 1, whose OOM ends the search).
        if (hi is not None or near) and guess > lo + 1:
            run.expect_oom()
        if trial(guess, predicted):
            lo = guess
        else:
            hi = guess
    # The soak: a size trains more steps, back to back, in a fresh process under the budget,
    # and passes when its peak over them stays within the limit. The first soak goes to the
    # largest size whose one-step trial peak, raised by SOAK_RISE, is predicted to stay within
    # the limit; a soak that peaks over the limit (or runs out of memory) shows its own rise
    # over the trial peak, and the next soak goes to the largest smaller size predicted to
    # stay within the limit with that rise.
    rise = SOAK_RISE
    # At least batch 1, which fitted its trial: only a soak may say it does not train.
    size = max(1, _soak_size(peaks, lo, limit, rise)) if soak_steps else lo
    while soak_steps and size >= 1:
        run.fresh_process()
        if trial(size, _predicted_peak(peaks, size, rise), soak=soak_steps):
            lo = size
            break
        hi = size
        soaked = result.trials[-1].peak_bytes
        base = _predicted_peak(peaks, size)
        if soaked and base and soaked / base > rise:
            rise = soaked / base
        size = min(size - 1, _soak_size(peaks, size, limit, rise))
    if soak_steps:
        lo = max(size, 0)
    if lo < 1:
        result.stopped_by = "nothing_fits"
        result.failing_batch_size = 1
        result.peak_bytes = result.trials[-1].peak_bytes
        return result
    result.soak_steps = soak_steps
    result.batch_size = lo
    result.peak_bytes = peaks[lo]
    result.failing_batch_size = hi
    # The answer rests on the last trial of each size of the bracket.
    for size in (lo, hi):
        last = next((t for t in reversed(result.trials) if t.batch_size == size), None)
        if last is not None:
            last.deciding = True
    return result


def _next_guess(
    peaks: dict[int, int], lo: int, hi: int | None, cap: int, limit: int
) -> tuple[int, int | None, bool]:
    """Next size to try, predicted from the measured peaks, kept inside the bracket.

    Far from the limit (more than half again the largest size that fits), the guess aims a
    little short and goes at most `CALIBRATION_GROWTH` times further: peaks are not linear
    in the batch, and a size that fits teaches the slope over a longer range, where an OOM
    would also cost a fresh process. Near the limit it goes one short of the largest size
    predicted to fit, and then up one at a time: peaks there grow faster than the line
    through smaller sizes predicts (ResNet50 under 3.25 GiB: 33 predicted at 3152 MiB from
    1, 4 and 12, measured 3290), a size that fits costs one more step in the same process,
    and one that fails a fresh process besides (its graph optimised again, a warm-up step),
    so the size above the last that fitted usually closes the bracket. A size that failed
    more than two above the largest that fits shows the peaks overestimated the room: the
    guess then stays a tenth of the gap below it, and no higher than halfway for small gaps
    (each OOM costs a fresh process; a size that fits lets the next ones run in the same
    process).

    Returns the guess, its predicted peak, and whether it is near the limit.
    """
    upper = min(cap, (hi - 1) if hi is not None else cap)
    peaks = _envelope(peaks)
    sizes = sorted(peaks)
    slope = _slope(peaks)
    guess: int | None = None
    near = False
    if slope > 0:
        b = sizes[-1]
        reach = (limit - peaks[b]) / slope
        near = reach <= b / 2
        if not near:
            reach *= 1 - FAR_SHORTFALL
            guess = b + min(math.floor(reach), (CALIBRATION_GROWTH - 1) * b)
        else:
            guess = b + max(1, min(math.floor(reach) - 1, math.floor(b * NEAR_STEP)))
    if guess is None:
        # Prediction unusable (flat or falling peaks): double, or bisect.
        guess = lo * 2 if hi is None else (lo + hi) // 2
    if hi is not None and hi - lo > 2:
        guess = min(guess, max((lo + hi) // 2, hi - 1 - math.ceil((hi - lo) / 10)))
    guess = max(lo + 1, min(guess, upper))
    predicted = int(peaks[sizes[-1]] + slope * (guess - sizes[-1])) if slope > 0 else None
    return guess, predicted, near


def _predicted_peak(peaks: dict[int, int], size: int, rise: float = 1.0) -> int | None:
    """A size's one-step trial peak, from the measured ones, times `rise`.

    Measured sizes give their envelope peak (see `_envelope`); others lie on the line
    through the two nearest measured sizes below and above (or `_slope` beyond the largest).
    """
    envelope = _envelope(peaks)
    if not envelope:
        return None
    if size in envelope:
        return int(envelope[size] * rise)
    below = [s for s in envelope if s < size]
    above = [s for s in envelope if s > size]
    if below and above:
        a, b = max(below), min(above)
        slope = (envelope[b] - envelope[a]) / (b - a)
        return int((envelope[a] + slope * (size - a)) * rise)
    anchor = max(below) if below else min(above)
    return int((envelope[anchor] + _slope(envelope) * (size - anchor)) * rise)


def _soak_size(peaks: dict[int, int], upper: int, limit: int, rise: float) -> int:
    """The largest size up to `upper` whose trial peak times `rise` stays within `limit`.

    Peaks between measured sizes are interpolated (`_predicted_peak`), which keeps them
    non-decreasing in the size, so the size is bisected; 0 when even batch 1 is predicted
    over the limit.
    """
    if not peaks:
        return upper
    lo, hi = 0, upper  # lo holds (or is 0), every size above hi fails
    while lo < hi:
        middle = (lo + hi + 1) // 2
        if (_predicted_peak(peaks, middle, rise) or 0) <= limit:
            lo = middle
        else:
            hi = middle - 1
    return lo


def _envelope(peaks: dict[int, int]) -> dict[int, int]:
    """Peaks made non-decreasing in the batch size (each the largest measured at or below it).

    A step's true peak does not fall as the batch grows; a measured one can, near the limit,
    by about a sample's worth (MobileNetV2 64 px under 256 MiB, one search: 237.8 MiB at 34,
    232.6 MiB at 35, about 5.5 MiB a sample). Predicting from the lower one overshoots the
    limit, and each OOM costs a trial in a fresh process.
    """
    envelope, top = {}, 0
    for size in sorted(peaks):
        top = max(top, peaks[size])
        envelope[size] = top
    return envelope


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
