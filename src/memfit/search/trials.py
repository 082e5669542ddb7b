"""The batch-size search's trials: the child processes that measure sizes, soak, time out.

`TrialRunner` measures one batch size after another in a throwaway child process (or, for a
model that cannot be saved, in this one) and replaces the process after an OOM; it decides
nothing: `memfit.search` picks each size with `memfit.search.strategy`.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

from memfit.backend import tf as tfb
from memfit.budget.budget import Budget
from memfit.errors import MemfitError, WorkloadError
from memfit.measuring.child import open_measurer
from memfit.measuring.isolate import child_spec, measurement_from_child, save_for_child
from memfit.measuring.measurer import Measurement, measure_workload
from memfit.process.runner import ChildWorker, run_in_child
from memfit.search.child import dataset_size
from memfit.workload.spec import WorkloadSpec
from memfit.workload.workload import SAMPLES_READ, readable_samples

# Why an in-process search refuses a MODEL string.
IN_PROCESS_MODEL = (
    "find_batch_size() takes a keras.Model in this process; pass "
    "options=memfit.Options(isolated=True) to search a MODEL string"
)
# An in-process search with a dataset hands its largest samples, at most this many, to the
# child process that measures.
CHILD_SAMPLES = 512


class TrialRunner:
    """Measures batch sizes one after the other, in one throwaway process.

    The trials share one trace with a relaxed batch dimension (traced once, then each size
    costs only its steps) and leave their updates in place: nothing is copied, the variables
    keep their buffers, so the allocator sees what training would. They run in a child
    process — one that loads the MODEL string (`isolated=True`), or a saved copy of an
    in-process model and of the dataset's largest samples — that is replaced after an OOM.
    A model that cannot be saved is measured in this process instead, its state restored
    after every trial.
    """

    def __init__(self, workload: WorkloadSpec, budget: Budget, model: Any, isolated: bool) -> None:
        """Start the trials' child process (or prepare this process).

        Args:
            workload: what is trained; its MODEL string is what an isolated child loads.
            budget: the budget the trials run under.
            model: a Keras model given beside the workload: isolated, saved for the child;
                else measured through a saved copy (or here, when it cannot be saved).
            isolated: this process holds no model: the child loads `workload`'s MODEL
                string, or a saved copy of `model`.
        """

        self.budget = budget
        self.worst_case = workload.worst_case
        self._tmp = tempfile.TemporaryDirectory(prefix="memfit-search-")
        self.dataset_size: int | None = None
        # The first samples the largest were picked among, when not the whole dataset.
        self.samples_read: int | None = None
        self.largest_sample: dict[str, Any] | None = None
        self.resident_bytes: int | None = None
        self.worker: Any = None
        self.spare: Any = None
        self._worker_trials = 0
        self._local_trials = 0
        self._child_workload: WorkloadSpec | None = None
        self.note: str | None = None
        if isolated:
            self._start_child(child_spec(workload, model, self._tmp.name))
            if workload.data is not None:
                self.dataset_size = _child_dataset_size(workload.data)
                self.samples_read = None if self.dataset_size is not None else SAMPLES_READ
            return
        if model is None:
            raise WorkloadError(IN_PROCESS_MODEL)
        self.workload = workload.workload(model)
        self.device = tfb.default_device()
        if workload.data is not None:
            ranked = len(self.workload.ranked_samples())
            # Only the first SAMPLES_READ of an infinite (or unknown, longer) dataset are read.
            if self.workload.samples_read is None or ranked < SAMPLES_READ:
                self.dataset_size = ranked
            else:
                self.samples_read = SAMPLES_READ
            self.largest_sample = self.workload.largest_sample()
        try:
            saved = save_for_child(model, self._tmp.name)
        except MemfitError as exc:
            self.note = f"measured in this process: {exc}"
            return
        saved_data = None
        if self.workload.data is not None:
            saved_data = os.path.join(self._tmp.name, "samples")
            self._save_largest_samples(saved_data)
        # The saved model carries its compiled optimizer and loss.
        self._start_child(
            dataclasses.replace(
                workload,
                model=saved,
                data=None,
                saved_data=saved_data,
                optimizer=None,
                loss=None,
                classes=None,
                imports=tuple(_packages_of(model)),
            )
        )

    @property
    def in_child(self) -> bool:
        """Whether the trials run in a child process (else in this one)."""
        return self.worker is not None

    def _start_child(self, workload: WorkloadSpec) -> None:
        # The child traces the relaxed step while this process goes on (ranking samples, say)
        # or, for a spare, while other trials run: its first trial then costs only the
        # graph's optimisation and the steps.
        self._child_workload = workload
        self.worker = self._new_child()

    def _new_child(self) -> Any:
        assert self._child_workload is not None
        kwargs = {"workload": self._child_workload.to_json(), "warm_relaxed": True}
        worker = ChildWorker(open_measurer, kwargs, budget=self.budget)
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
        dataset = readable_samples(self.workload.data)
        ranked = self.workload.ranked_samples()
        # Largest first (the child ranks them again, in the same order), else the first ones.
        keep = ranked[:CHILD_SAMPLES] if self.worst_case else list(range(len(ranked)))
        keep = keep[:CHILD_SAMPLES]
        wanted = set(keep)
        chosen: dict[int, Any] = {}
        for index, sample in enumerate(dataset.take(max(keep) + 1 if keep else 0)):
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


def _child_dataset_size(spec: str) -> int | None:
    size = run_in_child(dataset_size, {"spec": spec})
    return None if size is None else int(size)
