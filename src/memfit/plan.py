"""Plan: the fastest way to train a target effective batch within a budget, checked to hold.

A configuration is a precision policy, a recompute (`keras.RematScope`) mode and K, the number
of micro-batches `memfit.fit` splits each batch into. The planner predicts each
configuration's peak with `memfit.estimate` (nothing run) to find, per precision and recompute
mode, the smallest K predicted to fit the budget with margin; configurations that cannot beat
one already found (more time per step for no fewer micro-batches) are not estimated. Only the
finalists are measured in fresh child processes (the very step `memfit.fit` runs), the fastest
that fits is chosen, and it is confirmed: 20 steps of `memfit.fit` in a fresh process without
a recovery, else the next candidate is taken.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.budget import Budget, as_budget, emulated_budget
from memfit.checks import DEFAULT_MARGIN, check_batch_size, check_margin, check_positive_int
from memfit.errors import MeasurementError, MemfitError
from memfit.progress import Progress, shows_progress
from memfit.sizes import format_size

DEFAULT_CONFIRM_STEPS = 20
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# "full" is left out by default: on the TF backend it raised inside Functional.call.
# "memfit": memfit's own recompute (`memfit.recompute(model, "sqrt")`), beside Keras' modes.
REMAT_MODES: tuple[str | None, ...] = (None, "memfit", "larger_than", "activations")
# Finalists measured when several configurations could be the fastest; confirmations tried.
MAX_FINALISTS = 3
MAX_CONFIRMATIONS = 4
# A smaller K predicted within this share over the limit is measured too (estimates miss).
NEAR_LIMIT = 0.08
# A confirmation run is over at TensorFlow's first OOM line: stop its process this soon after.
CONFIRM_OOM_GRACE = 5.0
# Rough time per step relative to float32 without recompute, for the order in which
# configurations are estimated and measured (measured times decide). Reduced precision has
# no fast kernels on CPUs (MobileNetV2 160 px, 2 cores: mixed_float16 1.1x, mixed_bfloat16
# 3.3x float32's time); on GPUs it is the faster one. Recompute adds forward passes.
_PRECISION_COST = {
    "CPU": {"float32": 1.0, "mixed_float16": 1.6, "mixed_bfloat16": 1.8},
    "GPU": {"float32": 1.0, "mixed_float16": 0.6, "mixed_bfloat16": 0.7},
}
_REMAT_COST = {
    "memfit": 1.25,
    "activations": 1.15,
    "list_of_layers": 1.2,
    "larger_than": 1.25,
    "full": 1.35,
}


@dataclass
class Candidate:
    """One configuration the planner looked at: estimated, measured, confirmed.

    Attributes:
        precision: Keras dtype policy.
        remat: `keras.RematScope` mode, or None for no recompute.
        micro_batches: K.
        micro_batch_size: samples per micro-batch (the last may hold fewer).
        peak_bytes: measured peak of the whole step (None when not measured or it failed).
        step_seconds: measured time per effective batch (None when not measured or no fit).
        fits: within the budget less the margin: measured when `measured`, else predicted.
        oom: the step ran out of memory.
        error: why the configuration could not be estimated or measured, if it could not.
        predicted_peak_bytes: the estimate's peak (`memfit.estimate`), when estimated.
        measured: the step ran in a child process (else the candidate was only estimated).
        confirmed: None when no confirmation ran; True when `memfit.fit` trained the
            confirmation's steps in a fresh process without a recovery within the limit,
            False when it did not (`recoveries` says why).
        recoveries: what went wrong in the confirmation run.
    """

    precision: str
    remat: str | None
    micro_batches: int
    micro_batch_size: int
    peak_bytes: int | None = None
    step_seconds: float | None = None
    fits: bool = False
    oom: bool = False
    error: str | None = None
    predicted_peak_bytes: int | None = None
    measured: bool = False
    confirmed: bool | None = None
    recoveries: list[str] = field(default_factory=list)

    @property
    def estimated_only(self) -> bool:
        """Whether the candidate was only estimated, never run."""
        return not self.measured and self.predicted_peak_bytes is not None

    @property
    def config(self) -> tuple[str, str | None]:
        """Its precision and recompute mode."""
        return self.precision, self.remat

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (sizes in bytes, times in seconds)."""
        return {**asdict(self), "estimated_only": self.estimated_only}


@dataclass
class Plan:
    """The configuration `memfit.fit` should train with, and what it was chosen from.

    Attributes:
        batch_size: the effective batch (samples per optimizer update).
        micro_batches: K, micro-batches per step (`accumulation_steps`).
        micro_batch_size: samples per micro-batch.
        precision: dtype policy to build the model under.
        remat: `keras.RematScope` mode to build the model under, or None.
        peak_bytes: measured peak of the chosen step.
        step_seconds: measured time per effective batch of the chosen step.
        budget: the budget planned for; `margin`: the share of it kept free.
        candidates: every configuration estimated or measured, in order.
        fits: whether any configuration fits (and, when confirmed, held).
        note: what was not considered and why (e.g. precision needs a factory).
        seconds: how long planning took.
        confirmed: True when the chosen configuration trained `confirm_steps` steps of
            `memfit.fit` in a fresh process without a recovery; None when not confirmed.
        confirmation: how the plan was confirmed, for people.
    """

    batch_size: int
    micro_batches: int
    micro_batch_size: int
    precision: str
    remat: str | None
    peak_bytes: int | None
    step_seconds: float | None
    budget: Budget
    margin: float
    candidates: list[Candidate] = field(default_factory=list)
    fits: bool = True
    note: str = ""
    seconds: float = 0.0
    confirmed: bool | None = None
    confirmation: str = ""

    @contextlib.contextmanager
    def build_scope(self) -> Iterator[None]:
        """Build the model inside this block to build it as planned: precision and recompute.

        Sets the Keras dtype policy to `precision` (restored afterwards) and enters a
        `keras.RematScope` of the `remat` mode, so that `memfit.fit(model, ...,
        micro_batches=plan)` accepts the model built here.

        Example:
            ```python
            plan = memfit.plan("mypkg.models:build", 256, "T4")
            with plan.build_scope():
                model = mypkg.models.build()
            memfit.fit(model, x, y, batch_size=256, micro_batches=plan)
            ```
        """
        from memfit.backend import tf as tfb

        keras = tfb.import_keras()
        previous = keras.mixed_precision.dtype_policy()
        keras.mixed_precision.set_dtype_policy(self.precision)
        try:
            from memfit.recompute import remat_scope

            with remat_scope(self.remat):
                yield
        finally:
            keras.mixed_precision.set_dtype_policy(previous)

    @property
    def accumulation_steps(self) -> int:
        """Gradient-accumulation steps per update: the same number as `micro_batches`."""
        return self.micro_batches

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (sizes in bytes, times in seconds)."""
        return {
            "batch_size": self.batch_size,
            "micro_batch_size": self.micro_batch_size,
            "accumulation_steps": self.accumulation_steps,
            "micro_batches": self.micro_batches,
            "precision": self.precision,
            "remat": self.remat,
            "peak_bytes": self.peak_bytes,
            "step_seconds": self.step_seconds,
            "fits": self.fits,
            "budget": self.budget.to_dict(),
            "margin": self.margin,
            "limit_bytes": int(self.budget.usable_bytes * (1 - self.margin)),
            "candidates": [c.to_dict() for c in self.candidates],
            "confirmed": self.confirmed,
            "confirmation": self.confirmation,
            "note": self.note,
            "plan_seconds": self.seconds,
        }

    def summary(self) -> str:
        """One or two sentences for people."""
        if not self.fits and self.confirmed is False and self.confirmation:
            return f"batch {self.batch_size}: {self.confirmation}. " + (
                self.note or "use a card with more memory or smaller inputs"
            )
        if not self.fits:
            return (
                f"no configuration fits batch {self.batch_size} in "
                f"{format_size(self.budget.usable_bytes)} ({self.budget.name}), even one "
                f"sample per micro-batch; "
                + (self.note or "use a card with more memory or smaller inputs")
            )
        split = (
            f"{self.micro_batches} micro-batches of {self.micro_batch_size}"
            if self.micro_batches > 1
            else "no split"
        )
        text = (
            f"batch {self.batch_size}: {split}, {self.precision}"
            + (f", remat {self.remat}" if self.remat else "")
            + f" — peak {format_size(self.peak_bytes)} of "
            f"{format_size(self.budget.usable_bytes)}, {self.step_seconds:.3f} s per batch"
        )
        text += (
            f". {self.confirmation[:1].upper()}{self.confirmation[1:]}" if self.confirmation else ""
        )
        return text + (f". {self.note}" if self.note else "")


@shows_progress(
    "on_candidate",
    lambda a: (
        f"planning batch {a['batch_size']}"
        + (f" for {a['budget']}" if a["budget"] is not None else "")
        + ": estimating, measuring, confirming"
    ),
    "candidate",
)
def plan(
    model: Any,
    batch_size: int,
    budget: Budget | str | int | None = None,
    *,
    margin: float = DEFAULT_MARGIN,
    precisions: Sequence[str] | None = None,
    remat_modes: Sequence[str | None] | None = None,
    input_shape: Any = None,
    data: str | None = None,
    optimizer: str | None = None,
    loss: str | None = None,
    repeats: int = 1,
    on_candidate: Callable[[Candidate], None] | None = None,
    classes: int | None = None,
    safe_mode: bool = True,
    confirm: bool = True,
    confirm_steps: int = DEFAULT_CONFIRM_STEPS,
    progress: Progress = None,
) -> Plan:
    """Plan K (micro-batches), precision and recompute for a target effective batch.

    First `memfit.estimate` predicts, in one child process, the peak of the step `memfit.fit`
    runs for each precision and recompute mode, and finds the smallest K predicted to fit the
    budget less the margin. Configurations go from the cheapest per step (float32 without
    recompute on a CPU; mixed precision on a GPU) to the dearest, and one is estimated only
    while it could still need fewer micro-batches than those found. The finalists — when
    several could be the fastest, or a smaller K is predicted near the limit — are measured
    in fresh child processes under the budget, and the fastest that fits is chosen. With
    `confirm` (the default) the choice then trains `confirm_steps` steps of `memfit.fit` in a
    fresh process; if it needs a recovery or peaks over the limit, the next fastest is
    confirmed in turn: the other measured finalists, and the same configuration with more
    micro-batches, its time scaled from the failed one's. A model the estimate cannot trace
    is planned from measurements alone.

    Precision and recompute change how the model is built, so they are planned only for a
    MODEL string that builds it — a factory (`package.module:factory`) or a built-in
    (`keras.applications.ResNet50`); for a model object or a `.keras` file only K is
    planned, and `note` says what a factory would add.

    Args:
        model: a MODEL string, or a compiled Keras model (saved for the child; K only).
        batch_size: the target effective batch.
        budget: the budget (`Budget`, size, or card name); default the emulated one.
        margin: share of the budget kept free (default 0.05).
        precisions: dtype policies to consider (default float32, mixed_float16,
            mixed_bfloat16 when the model can be rebuilt; float32 otherwise).
        remat_modes: `keras.RematScope` modes to consider, None meaning no recompute
            (default None, "larger_than", "activations" when the model can be rebuilt).
        input_shape: one sample's shape, for models with undefined inputs.
        data: `package.module:dataset_fn` of unbatched samples (detectors, dict targets).
        optimizer, loss: by name, to compile with (default: the model's own).
        repeats: measured steps per measured candidate after the warm-up.
        on_candidate: called with a `Candidate` each time it is estimated, measured or
            confirmed (progress displays).
        classes: classes of a built-in model (`keras.applications.Name`).
        safe_mode: False loads a trusted `.keras` file that runs Python code (Lambda layers).
        confirm: train the chosen configuration `confirm_steps` steps of `memfit.fit` in a
            fresh process before answering (default True).
        confirm_steps: steps of the confirmation run (default 20).
        progress: a spinner and one line per candidate on stderr, as the CLI shows them;
            default on when stderr is a terminal and no `on_candidate` is given; False turns
            it off, a callable receives each `Candidate` instead (`memfit.progress`).

    Returns:
        A `Plan`; build the model in `plan.build_scope()` and pass the plan to
        `memfit.fit(..., micro_batches=plan)`.

    Example:
        ```python
        p = memfit.plan("keras.applications.ResNet50", 256, "T4", input_shape=(224, 224, 3))
        print(p.summary())
        ```
    """
    from memfit.isolate import check_child_arguments, save_for_child
    from memfit.workload import shape_list

    batch_size = check_batch_size(batch_size)
    confirm_steps = check_positive_int(confirm_steps, "confirm_steps")
    check_margin(margin)
    resolved = as_budget(budget) or emulated_budget()
    if resolved is None:
        raise MemfitError(
            "no budget to plan for: pass budget= (a size or card), or emulate one with "
            "memfit.emulate() / --memory / --device"
        )
    check_child_arguments(optimizer, loss, data)
    rebuildable = isinstance(model, str) and not model.endswith((".keras", ".h5"))
    note = ""
    if not rebuildable:
        if precisions not in (None, ("float32",), ["float32"]) or remat_modes not in (
            None,
            (None,),
            [None],
        ):
            raise MemfitError(
                "precision and recompute need the model rebuilt: give a factory "
                "(package.module:factory) or a built-in name instead of a model object or file"
            )
        note = (
            "Only K was planned: a model factory (package.module:factory) would let the planner "
            "also try mixed precision and recompute"
        )
    precisions = list(precisions or (PRECISIONS if rebuildable else ("float32",)))
    remat_modes = list(remat_modes or (REMAT_MODES if rebuildable else (None,)))
    configs = [(p, r) for p in precisions for r in remat_modes]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memfit-plan-") as tmp:
        spec = model if isinstance(model, str) else save_for_child(model, tmp)
        planner = _Planner(
            batch_size,
            resolved,
            int(resolved.usable_bytes * (1 - margin)),
            child_args={
                "spec": spec,
                "data": data,
                "input_shape": [list(s) for s in shape_list(input_shape)] if input_shape else None,
                "optimizer": optimizer,
                "loss": loss,
                "classes": classes,
                "safe_mode": bool(safe_mode),
            },
            repeats=repeats,
            on_candidate=on_candidate,
        )
        chosen, how = planner.run(configs, confirm_steps if confirm else 0)
    notes = [n for n in (note, planner.skipped_note()) if n]
    result = Plan(
        batch_size=batch_size,
        micro_batches=chosen.micro_batches if chosen else batch_size,
        micro_batch_size=chosen.micro_batch_size if chosen else 1,
        precision=chosen.precision if chosen else precisions[0],
        remat=chosen.remat if chosen else None,
        peak_bytes=chosen.peak_bytes if chosen else None,
        step_seconds=chosen.step_seconds if chosen else None,
        budget=resolved,
        margin=float(margin),
        candidates=planner.candidates,
        fits=chosen is not None,
        note=". ".join(notes),
        seconds=time.perf_counter() - started,
        confirmed=True if chosen is not None and confirm else False if how else None,
        confirmation=how,
    )
    return result


class _Planner:
    """The candidates of one plan and the child processes that estimate, measure, confirm."""

    def __init__(
        self,
        batch_size: int,
        budget: Budget,
        limit: int,
        child_args: dict[str, Any],
        repeats: int,
        on_candidate: Callable[[Candidate], None] | None,
    ) -> None:
        self.batch_size, self.budget, self.limit = batch_size, budget, limit
        self.child_args, self.repeats = child_args, repeats
        self.on_candidate = on_candidate or (lambda _c: None)
        self.candidates: list[Candidate] = []
        self.device = "CPU"
        self.skipped: list[tuple[str, str | None]] = []
        # The estimate's resident bytes (weights, optimizer state, batch) per configuration.
        self.resident: dict[tuple[str, str | None], int] = {}
        self.ks = _k_values(batch_size)

    # -- the flow ---------------------------------------------------------------------------
    def run(
        self, configs: list[tuple[str, str | None]], confirm_steps: int
    ) -> tuple[Candidate | None, str]:
        """Estimate, measure the finalists, confirm; the chosen candidate and how it held."""
        try:
            finalists = self.estimate(configs)
        except MeasurementError:
            finalists = None  # the estimator process died: plan from measurements alone
        if finalists is None or not any(c.predicted_peak_bytes for c in self.candidates):
            finalists = self.measured_walk(configs)
            measured = True
        elif not finalists:
            finalists = self.last_resort()
            measured = True
        else:
            measured = False
        if not confirm_steps or len(finalists) > 1 or self.near_neighbours(finalists):
            if not measured:
                finalists = [c for c in map(self.measure_config, finalists) if c is not None]
            queue = sorted(
                (c for c in finalists if c.fits), key=lambda c: c.step_seconds or math.inf
            )
        else:
            queue = list(finalists)
        if not confirm_steps:
            if not queue:
                return None, ""
            return queue[0], ""
        return self.confirm_queue(queue, confirm_steps)

    def confirm_queue(self, queue: list[Candidate], steps: int) -> tuple[Candidate | None, str]:
        """Confirm candidates in order; one that fails gives way to its configuration with
        more K, queued by its expected time among the others (a measured finalist that is
        faster than the larger K goes first)."""
        failed: list[str] = []
        expected: dict[int, float] = {}  # seconds per batch of larger K queued, not measured
        while queue and len(failed) < MAX_CONFIRMATIONS:
            candidate = queue.pop(0)
            if self.confirm(candidate, steps):
                how = (
                    f"confirmed: trained {steps} steps of memfit.fit in a fresh process without "
                    f"a recovery, peak {format_size(candidate.peak_bytes)}"
                )
                if failed:
                    how += f" (after {'; '.join(failed)})"
                return candidate, how
            failed.append(
                f"K={candidate.micro_batches} {candidate.precision}"
                + (f" remat {candidate.remat}" if candidate.remat else "")
                + f" did not hold: {(candidate.recoveries or ['?'])[0][:160]}"
            )
            larger = [k for k in self.ks if k > candidate.micro_batches]
            if larger:
                bigger = self.candidate(candidate.precision, candidate.remat, larger[0])
                expected[id(bigger)] = self.expected_seconds(bigger, basis=candidate)
                position = next(
                    (
                        i
                        for i, c in enumerate(queue)
                        if expected.get(id(c), self.expected_seconds(c)) > expected[id(bigger)]
                    ),
                    len(queue),
                )
                queue.insert(position, bigger)
        if not failed:
            return None, ""  # nothing fitted to confirm
        return None, (
            f"no configuration trained {steps} steps of memfit.fit without a recovery: "
            + "; ".join(failed)
        )

    # -- estimates --------------------------------------------------------------------------
    def estimate(self, configs: list[tuple[str, str | None]]) -> list[Candidate]:
        """Per configuration, the smallest K predicted to fit, for those that could win."""
        from memfit._runner import ChildWorker

        args = {k: v for k, v in self.child_args.items()}
        worker = ChildWorker("memfit._child:open_estimator", args, budget=self.budget)
        finalists: list[Candidate] = []
        try:
            device = worker.call(what="device")["device"]
            self.device = "GPU" if str(device).upper().startswith("GPU") else "CPU"
            best_k = math.inf
            for precision, remat in sorted(configs, key=lambda c: self.cost(*c, 1)):
                if best_k == 1:
                    # Dearer per step, and no configuration needs fewer micro-batches.
                    self.skipped.append((precision, remat))
                    continue
                found = self.smallest_predicted_k(worker, precision, remat, best_k)
                if found is not None:
                    finalists.append(found)
                    best_k = found.micro_batches
        finally:
            worker.shutdown(kill=True)
        finalists.sort(key=lambda c: self.cost(c.precision, c.remat, c.micro_batches))
        return finalists[:MAX_FINALISTS]

    def smallest_predicted_k(
        self, worker: Any, precision: str, remat: str | None, below: float
    ) -> Candidate | None:
        """The smallest K below `below` whose predicted peak fits, or None."""
        ks = [k for k in self.ks if k < below]
        if not ks:
            return None
        first = self.predict(worker, precision, remat, ks[0])
        if first.error is not None or first.fits:
            return first if first.fits else None
        # Peaks grow about linearly in the micro-batch: guess K from K=1's prediction.
        assert first.predicted_peak_bytes is not None
        resident = self.resident.get((precision, remat), 0)
        per_sample = (first.predicted_peak_bytes - resident) / self.batch_size
        index = next(
            (
                i
                for i, k in enumerate(ks)
                if resident + per_sample * math.ceil(self.batch_size / k) <= self.limit
            ),
            len(ks) - 1,
        )
        for k in ks[max(1, index) :]:
            candidate = self.predict(worker, precision, remat, k)
            if candidate.error is not None:
                return None
            if candidate.fits:
                return candidate
        return None

    def predict(self, worker: Any, precision: str, remat: str | None, k: int) -> Candidate:
        """The estimate's peak for one configuration and K (in the estimator process)."""
        candidate = self.candidate(precision, remat, k)
        try:
            result = worker.call(
                precision=None if precision == "float32" else precision,
                remat=remat,
                batch_size=self.batch_size,
                micro_batches=k,
            )
        except MeasurementError as exc:  # this configuration cannot be traced or built
            candidate.error = f"estimate: {exc}"
        else:
            candidate.predicted_peak_bytes = int(result["peak_bytes"])
            self.resident.setdefault((precision, remat), int(result["resident_bytes"]))
            candidate.fits = candidate.predicted_peak_bytes <= self.limit
        self.on_candidate(candidate)
        return candidate

    # -- measurements -----------------------------------------------------------------------
    def near_neighbours(self, finalists: list[Candidate]) -> bool:
        """Whether a finalist's next smaller K was predicted near enough the limit to try."""
        return any(self.near_neighbour(c) is not None for c in finalists)

    def near_neighbour(self, candidate: Candidate) -> Candidate | None:
        smaller = [k for k in self.ks if k < candidate.micro_batches]
        if not smaller:
            return None
        below = self.find(candidate.precision, candidate.remat, smaller[-1])
        predicted = below.predicted_peak_bytes if below is not None else None
        if below is None or predicted is None or predicted > self.limit * (1 + NEAR_LIMIT):
            return None
        return below

    def measure_config(self, finalist: Candidate) -> Candidate | None:
        """The smallest measured K of a finalist's configuration that fits: its near smaller
        neighbour first, then the finalist, then larger K until one fits."""
        below = self.near_neighbour(finalist)
        if below is not None and self.measure(below).fits:
            return below
        return _smallest_fitting_k(
            lambda p, r, k: self.measure(self.candidate(p, r, k)),
            finalist.precision,
            finalist.remat,
            self.batch_size,
            finalist.micro_batches,
            up_only=True,
        )

    def measured_walk(self, configs: list[tuple[str, str | None]]) -> list[Candidate]:
        """Plan from measurements alone (the estimate could not trace the model): per
        configuration, walk K from the best so far, down while it fits, up until it fits."""
        found: list[Candidate] = []
        hint = 1
        for precision, remat in configs:
            try:
                best = _smallest_fitting_k(
                    lambda p, r, k: self.measure(self.candidate(p, r, k)),
                    precision,
                    remat,
                    self.batch_size,
                    hint,
                )
            except MemfitError as exc:
                failed = self.candidate(precision, remat, hint)
                failed.error = str(exc)
                self.on_candidate(failed)
                continue
            if best is not None:
                found.append(best)
                hint = min(c.micro_batches for c in found)
        return found

    def last_resort(self) -> list[Candidate]:
        """Nothing was predicted to fit: measure one sample per micro-batch of the
        configuration predicted lowest (estimates can be high), and fewer K while it fits."""
        estimated = [c for c in self.candidates if c.predicted_peak_bytes is not None]
        if not estimated:
            return []
        lowest = min(estimated, key=lambda c: c.predicted_peak_bytes or math.inf)
        found = _smallest_fitting_k(
            lambda p, r, k: self.measure(self.candidate(p, r, k)),
            lowest.precision,
            lowest.remat,
            self.batch_size,
            self.batch_size,
        )
        return [found] if found is not None else []

    def measure(self, candidate: Candidate) -> Candidate:
        """One candidate's step (`memfit.fit`'s, at its K), measured in a fresh child."""
        from memfit.isolate import measure_in_child

        if candidate.measured:
            return candidate
        args = self.child_args
        try:
            m = measure_in_child(
                args["spec"],
                self.batch_size,
                data=args["data"],
                input_shape=args["input_shape"],
                optimizer=args["optimizer"],
                loss=args["loss"],
                repeats=self.repeats,
                budget=self.budget,
                worst_case=args["data"] is not None,
                micro_batches=candidate.micro_batches,
                precision=None if candidate.precision == "float32" else candidate.precision,
                remat=candidate.remat,
                classes=args["classes"],
                safe_mode=args["safe_mode"],
            )
        except MemfitError as exc:
            candidate.error = str(exc)
            candidate.fits = False
            self.on_candidate(candidate)
            return candidate
        candidate.measured = True
        candidate.peak_bytes, candidate.step_seconds, candidate.oom = (
            m.peak_bytes,
            m.step_seconds,
            m.oom,
        )
        candidate.fits = not m.oom and m.peak_bytes is not None and m.peak_bytes <= self.limit
        self.on_candidate(candidate)
        return candidate

    def confirm(self, candidate: Candidate, steps: int) -> bool:
        """Train `steps` steps of `memfit.fit` at the candidate in a fresh child process."""
        from memfit._runner import run_in_child

        args = self.child_args
        result = run_in_child(
            "memfit._child:confirm_plan",
            {
                **{k: args[k] for k in ("spec", "data", "input_shape", "optimizer", "loss")},
                "batch_size": self.batch_size,
                "micro_batches": candidate.micro_batches,
                "steps": steps,
                "precision": None if candidate.precision == "float32" else candidate.precision,
                "remat": candidate.remat,
                "classes": args["classes"],
                "safe_mode": args["safe_mode"],
            },
            budget=self.budget,
            oom_grace=CONFIRM_OOM_GRACE,
        )
        if result.get("hung_after_oom"):
            candidate.oom = True
            candidate.recoveries = [f"out of memory: {result.get('oom_message') or 'OOM'}"]
            peak = result.get("max_in_use_bytes")
        else:
            candidate.recoveries = list(result["recoveries"])
            if result.get("error"):
                candidate.recoveries.append(result["error"])
            candidate.oom = bool(candidate.recoveries)  # memfit.fit recovers from OOMs only
            peak = result.get("peak_bytes")
            if not candidate.recoveries and result["steps_done"] < steps:
                candidate.recoveries.append(f"trained {result['steps_done']} of {steps} steps")
            if result.get("step_seconds") is not None:
                candidate.step_seconds = float(result["step_seconds"])
        if peak is not None:
            candidate.peak_bytes = max(int(peak), candidate.peak_bytes or 0)
        if not candidate.recoveries and (peak is None or peak > self.limit):
            candidate.recoveries.append(
                f"peak {format_size(peak)} over the limit {format_size(self.limit)}"
                if peak is not None
                else "no peak reported"
            )
        candidate.measured = True
        candidate.confirmed = not candidate.recoveries
        candidate.fits = candidate.confirmed
        self.on_candidate(candidate)
        return candidate.confirmed

    # -- bookkeeping ------------------------------------------------------------------------
    def find(self, precision: str, remat: str | None, k: int) -> Candidate | None:
        return next(
            (
                c
                for c in self.candidates
                if (c.precision, c.remat, c.micro_batches) == (precision, remat, k)
            ),
            None,
        )

    def candidate(self, precision: str, remat: str | None, k: int) -> Candidate:
        """The candidate for one configuration and K (created on first use)."""
        found = self.find(precision, remat, k)
        if found is None:
            found = Candidate(precision, remat, k, math.ceil(self.batch_size / k))
            self.candidates.append(found)
        return found

    def expected_seconds(self, candidate: Candidate, basis: Candidate | None = None) -> float:
        """Seconds per batch: measured, else scaled from `basis` (a measured K of the same
        configuration) by the cost of more micro-batches; unknown is infinite."""
        if candidate.step_seconds is not None:
            return candidate.step_seconds
        if basis is not None and basis.step_seconds is not None:
            scale = self.cost(*candidate.config, candidate.micro_batches) / self.cost(
                *basis.config, basis.micro_batches
            )
            return basis.step_seconds * scale
        return math.inf

    def cost(self, precision: str, remat: str | None, k: int) -> float:
        """Rough time per step relative to float32 without recompute, unsplit."""
        base = _PRECISION_COST[self.device].get(precision, 1.0)
        return base * _REMAT_COST.get(remat or "", 1.0) * (1 + 0.15 * math.log2(k))

    def skipped_note(self) -> str:
        if not self.skipped:
            return ""
        precisions = sorted({p for p, _ in self.skipped} - {"float32"})
        modes = sorted({r for _, r in self.skipped if r})
        names = " and ".join(
            part
            for part in (", ".join(precisions), f"remat {', '.join(modes)}" if modes else "")
            if part
        )
        return (
            f"Not estimated: {len(self.skipped)} configuration"
            f"{'s' if len(self.skipped) > 1 else ''} ({names}): more time per step "
            f"on this {self.device}, and none can need fewer micro-batches than the one found"
        )


def _k_values(batch_size: int) -> list[int]:
    """The K worth trying: each gives a different micro-batch size (doubling, then 1 sample)."""
    values, k = [], 1
    while k < batch_size:
        values.append(k)
        k *= 2
    return [*values, batch_size]


def _smallest_fitting_k(
    measure_k: Callable[[str, str | None, int], Candidate],
    precision: str,
    remat: str | None,
    batch_size: int,
    hint: int,
    up_only: bool = False,
) -> Candidate | None:
    """Walk K from `hint`: down while it still fits (unless `up_only`), up until it fits."""
    ks = _k_values(batch_size)
    index = min(range(len(ks)), key=lambda i: abs(ks[i] - hint))
    first = measure_k(precision, remat, ks[index])
    if first.fits:
        best = first
        while index > 0 and not up_only:
            index -= 1
            candidate = measure_k(precision, remat, ks[index])
            if not candidate.fits:
                break
            best = candidate
        return best
    while index + 1 < len(ks):
        index += 1
        candidate = measure_k(precision, remat, ks[index])
        if candidate.fits:
            return candidate
    return None
