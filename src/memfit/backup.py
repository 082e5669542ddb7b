"""Backup: preemption-safe `memfit.fit`: an atomic checkpoint, SIGTERM, and the resume.

`memfit.fit(..., backup_dir=DIR)` keeps one checkpoint in `DIR/memfit-backup.npz`: the
model's variables (weights, non-trainable state, dropout seeds), the optimizer's variables
(slots and iteration count), the metrics of the epoch under way, K (micro-batches) per input
shape, the data position (epoch, and batches of that epoch already trained) and, when a
`memfit.Watch` is among the callbacks, what it exposes (its step records, findings and the
log file written so far).

- **Atomic.** A checkpoint is written to a temporary file in `DIR`, flushed and fsynced, and
  only then `os.replace`d over the previous one (and `DIR` fsynced): a process killed at any
  moment (`kill -9`, power loss) leaves the previous checkpoint whole. A leftover temporary
  file is ignored and removed by the next write.
- **SIGTERM** (what cloud VMs and Kubernetes send before they take a machine) is caught only
  while `memfit.fit` runs (the previous handler is put back after). The handler only takes
  note; the update under way finishes (weights and optimizer are never half-updated), the
  checkpoint is written, one line says where, and the process exits with status 143
  (128 + SIGTERM, the code TensorFlow's `PreemptionCheckpointHandler` exits with on GCE to
  ask for a restart).
- **Periodic**: at each epoch's end (`save_freq="epoch"`) or every N updates, so a
  `kill -9` (no handler runs) loses at most that much.
- **Resume.** The next `memfit.fit` with the same `backup_dir` restores the state, starts at
  the saved epoch and skips the batches that epoch already trained (Keras'
  `BackupAndRestore` restarts the epoch from its first batch; memfit skips, so no batch is
  trained twice and the update count matches), with K per input shape as it was (no OOM to
  find it again). After a run that completes, the checkpoint is removed (as Keras does)
  unless `keep_backup=True`.

Skipping reproduces the uninterrupted run only when each epoch yields its batches in the
same order in every process: arrays with `shuffle=False`, or with `shuffle=True` after
`keras.utils.set_random_seed(...)` (Keras 3.15 then draws the same order in every process);
a `tf.data.Dataset` that is not shuffled, or shuffled with a fixed seed and
`reshuffle_each_iteration=False`. Arrays shuffled without a seed are shuffled anew by the new
process: the resumed epoch still trains the right number of updates, but over a new
permutation (memfit warns).

**Several workers** (`MultiWorkerMirroredStrategy`): after each update (and at each epoch's
end) every worker votes whether it was sent SIGTERM (`Agreement.any`, one tiny collective), so a
SIGTERM that reaches any one worker stops all of them after the same update. Their states are
equal then (the all-reduce and the OOM votes see to it), so only the chief (task 0 of
`"worker"`, `strategy.extended.should_checkpoint`) writes the checkpoint; the other workers
write nothing (TensorFlow's multi-worker Keras, `distributed_file_utils`, has them write to a
`workertemp_N` directory it then removes). A last vote waits for the chief's write, then every
worker prints the same line and exits 143. Every worker is then started again with the same
`backup_dir` (a shared filesystem, or one machine's directory) and resumes at the same update.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memfit.backend import tf as tfb
from memfit.distributed import Agreement
from memfit.errors import BackupError, MemfitWarning

logger = logging.getLogger("memfit")

BACKUP_FILE = "memfit-backup.npz"
"""The checkpoint's file name inside `backup_dir`."""

PREEMPTED_EXIT_CODE = 143
"""Exit status after a SIGTERM checkpoint: 128 + SIGTERM (TensorFlow's restartable code)."""

FORMAT = 1
_TEMP_PREFIX = ".memfit-backup-"
# Test hook: a file path; the checkpoint write numbered MEMFIT_BACKUP_TEST_PAUSE_AT (from 1)
# creates it once its temporary file is written, then sleeps before the replace (so a test
# can kill -9 the process in the middle of the write).
_PAUSE_ENV = "MEMFIT_BACKUP_TEST_PAUSE"
_PAUSE_AT_ENV = "MEMFIT_BACKUP_TEST_PAUSE_AT"


@dataclass
class Checkpoint:
    """One saved training state of `memfit.fit` (see `memfit.backup`).

    Attributes:
        epoch: the epoch to resume in (from 0).
        step: batches of that epoch already trained (skipped on resume).
        updates: the optimizer's iteration count.
        micro_batches: K per input shape (`FitSummary.micro_batches`).
        reason: why it was written: `"preempted"`, `"epoch"`, `"updates"` or `"end"`.
        model: the model's name.
        names: the saved variables' paths, in order.
        variables: their values (model variables, then the optimizer's).
        metrics: the values of the model's metric variables (the epoch's running means).
        summary: the `FitSummary` so far, as a dict.
        watch: what a `memfit.Watch` exposed: `steps`, `findings`, `log_path`, `log` (the
            text of its log file when written), or None without a Watch.
        written_at: when it was written (seconds since the epoch).
    """

    epoch: int
    step: int
    updates: int
    micro_batches: dict[str, int]
    reason: str
    model: str
    names: list[str] = field(default_factory=list)
    variables: list[np.ndarray] = field(default_factory=list, repr=False)
    metrics: list[np.ndarray] = field(default_factory=list, repr=False)
    summary: dict[str, Any] = field(default_factory=dict, repr=False)
    watch: dict[str, Any] | None = field(default=None, repr=False)
    written_at: float = 0.0

    def state(self) -> dict[str, Any]:
        """Everything but the arrays, as JSON-ready data (the checkpoint's `state` entry)."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("variables", "metrics")
        }
        out["format"] = FORMAT
        out["shapes"] = [list(v.shape) for v in self.variables]
        out["dtypes"] = [str(v.dtype) for v in self.variables]
        return out


def check_backup_dir(backup_dir: Any) -> str:
    """Return `backup_dir` as a path; create it if missing; refuse a file or a read-only dir.

    Raises:
        BackupError: one line saying what is wrong with the directory.
    """
    if isinstance(backup_dir, bool) or not isinstance(backup_dir, (str, os.PathLike)):
        raise BackupError(f"backup_dir must be a directory path, got {backup_dir!r}")
    path = os.fspath(backup_dir)
    if not path:
        raise BackupError("backup_dir is empty: give a directory for the checkpoint")
    if os.path.exists(path) and not os.path.isdir(path):
        raise BackupError(f"backup_dir {path} is a file, not a directory: give a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise BackupError(f"backup_dir {path} cannot be created ({exc.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise BackupError(f"backup_dir {path} is not writable: give a directory you can write")
    return path


def write_checkpoint(backup_dir: str, checkpoint: Checkpoint) -> str:
    """Write `checkpoint` into `backup_dir` atomically; the previous one stays until then.

    Args:
        backup_dir: an existing, writable directory.
        checkpoint: what to save.

    Returns:
        The checkpoint file's path.

    Example:
        ```python
        path = write_checkpoint("/tmp/backup", checkpoint)
        assert read_checkpoint("/tmp/backup").updates == checkpoint.updates
        ```
    """
    final = os.path.join(backup_dir, BACKUP_FILE)
    _remove_temporaries(backup_dir)
    checkpoint.written_at = time.time()
    arrays = {f"v{i}": np.asarray(v) for i, v in enumerate(checkpoint.variables)}
    arrays.update({f"m{i}": np.asarray(v) for i, v in enumerate(checkpoint.metrics)})
    arrays["state"] = np.array(json.dumps(checkpoint.state(), default=_json_default))
    fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=".npz", dir=backup_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            _pause_for_test()
            os.fsync(f.fileno())
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
    _fsync_dir(backup_dir)
    return final


def read_checkpoint(backup_dir: str | os.PathLike[str]) -> Checkpoint | None:
    """The checkpoint in `backup_dir`, or None when there is none.

    Raises:
        BackupError: the file is there but cannot be read (not memfit's, damaged).

    Example:
        ```python
        checkpoint = read_checkpoint("/tmp/backup")
        if checkpoint is not None:
            print(checkpoint.epoch, checkpoint.step, checkpoint.micro_batches)
        ```
    """
    path = os.path.join(os.fspath(backup_dir), BACKUP_FILE)
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            state = json.loads(str(data["state"]))
            count = len(state["names"])
            variables = [data[f"v{i}"] for i in range(count)]
            metrics = [data[f"m{i}"] for i in range(sum(k.startswith("m") for k in data.files))]
    except Exception as exc:  # a truncated or foreign file: zipfile, KeyError, ValueError...
        raise BackupError(
            f"the checkpoint {path} cannot be read ({type(exc).__name__}: {exc}): delete it "
            f"to train from the start"
        ) from None
    if state.get("format") != FORMAT:
        raise BackupError(
            f"the checkpoint {path} has format {state.get('format')!r}, this memfit reads "
            f"{FORMAT}: delete it to train from the start"
        )
    known = {f.name for f in dataclasses.fields(Checkpoint)}
    values = {k: v for k, v in state.items() if k in known}
    return Checkpoint(**values, variables=variables, metrics=metrics)


def remove_checkpoint(backup_dir: str) -> None:
    """Remove the checkpoint (and leftover temporary files); the directory too when empty."""
    _remove_temporaries(backup_dir)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(backup_dir, BACKUP_FILE))
    with contextlib.suppress(OSError):
        os.rmdir(backup_dir)  # only when empty: never a user's other files


class Backup:
    """Backs a `memfit.fit` up into `backup_dir` and resumes it from there.

    Made by `memfit.fit(..., backup_dir=...)`; see `memfit.backup` for what is saved and when.

    Args:
        backup_dir: the directory of the checkpoint (created if missing).
        save_freq: `"epoch"` (at each epoch's end) or N (every N updates), besides SIGTERM.
        keep: keep the checkpoint after the run completes (default: remove it).

    Example:
        ```python
        backup = Backup("/tmp/backup")               # what memfit.fit does with backup_dir
        initial_epoch = backup.prepare(model, step, x=x, shuffle=False)   # step: GuardedStep
        with backup.handling_signals():
            model.fit(x, y, shuffle=False, initial_epoch=initial_epoch,
                      callbacks=[backup.callback()])
        ```
    """

    def __init__(self, backup_dir: Any, *, save_freq: Any = "epoch", keep: bool = False) -> None:
        if save_freq != "epoch" and (
            isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1
        ):
            raise BackupError(
                f"save_freq must be 'epoch' or a whole number of updates of at least 1, got "
                f"{save_freq!r}"
            )
        if not isinstance(keep, bool):
            raise BackupError(f"keep_backup must be True or False, got {keep!r}")
        self.backup_dir = check_backup_dir(backup_dir)
        self.save_freq = save_freq
        self.keep = keep
        self.resumed = read_checkpoint(self.backup_dir)
        self.model: Any = None
        self.step: Any = None
        self.watch: Any = None
        self.epoch = 0
        self.batch = 0  # batches of the current epoch trained
        self._skip = 0  # batches to skip in the resumed epoch (its first call)
        self._restored = False
        self._since_save = 0
        self._signalled: int | None = None
        self._stopped = False  # exited for the signal
        self._metrics_pending = False  # the resumed epoch's metrics wait for the first step
        self.agreement: Agreement | None = None  # the workers' votes (inactive in one process)
        self.chief = True  # this process writes the checkpoint

    # -- before fit ---------------------------------------------------------------------------
    def prepare(
        self,
        model: Any,
        step: Any,
        *,
        x: Any = None,
        shuffle: Any = True,
        steps_per_epoch: int | None = None,
        callbacks: list[Any] | None = None,
        initial_epoch: int = 0,
    ) -> int:
        """Check the data can be resumed, restore a checkpoint; return the epoch to start at.

        Args:
            model: the compiled Keras model.
            step: its `GuardedStep` (K per input shape is restored into it).
            x, shuffle, steps_per_epoch: as given to `memfit.fit`.
            callbacks: the user's callbacks (a `memfit.Watch` among them is backed up).
            initial_epoch: the epoch to start at without a checkpoint.
        """
        self.model, self.step = model, step
        strategy = model.distribute_strategy
        self.agreement = Agreement(strategy)
        self.chief = bool(getattr(strategy.extended, "should_checkpoint", True))
        self.watch = next((c for c in callbacks or [] if _is_watch(c)), None)
        _check_resumable_data(x, steps_per_epoch)
        checkpoint = self.resumed
        if checkpoint is None:
            self.epoch = initial_epoch
            return initial_epoch
        if model.built:
            self._restore()  # before anything runs: a wrong checkpoint stops here, untouched
        self._skip = checkpoint.step
        self.epoch = checkpoint.epoch
        seeded = tfb.import_tf().compat.v1.get_seed(None)[0] is not None
        if checkpoint.step and shuffle and not _is_dataset(x) and not seeded:
            warnings.warn(
                f"resuming epoch {checkpoint.epoch + 1} after its batch {checkpoint.step} "
                f"with shuffle=True and no random seed: this process shuffles the arrays anew, "
                f"so the rest of the epoch is a new permutation (some samples twice, some "
                f"not); call keras.utils.set_random_seed(...) before fit, or pass "
                f"shuffle=False, for a resume that repeats the uninterrupted run",
                MemfitWarning,
                stacklevel=3,
            )
        self._restore_watch_log()
        where = f"epoch {checkpoint.epoch + 1}" + (
            f", after its batch {checkpoint.step}" if checkpoint.step else ""
        )
        text = (
            f"memfit: resuming from {os.path.join(self.backup_dir, BACKUP_FILE)} at update "
            f"{checkpoint.updates} ({where})"
        )
        logger.info(text)
        if getattr(step, "verbose", True):
            print(text, flush=True)
        return checkpoint.epoch

    def _restore(self) -> None:
        if self._restored or self.resumed is None:
            return
        checkpoint = self.resumed
        model, optimizer = self.model, self.step.optimizer
        if not optimizer.built:
            with model.distribute_strategy.scope():
                optimizer.build(model.trainable_variables)
        variables = state_variables(model, optimizer)
        path = os.path.join(self.backup_dir, BACKUP_FILE)
        theirs = [(list(v.shape), str(v.dtype)) for v in checkpoint.variables]
        ours = [(list(v.shape), _dtype_name(v)) for v in variables]
        if theirs != ours:
            first = next(
                (i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b),
                min(len(theirs), len(ours)),
            )
            detail = (
                f"{len(theirs)} variables saved, {len(ours)} in this model"
                if len(theirs) != len(ours)
                else f"{checkpoint.names[first]} is {theirs[first][0]} {theirs[first][1]} "
                f"there, {variables[first].path} is {ours[first][0]} {ours[first][1]} here"
            )
            raise BackupError(
                f"the checkpoint {path} is of another model ({checkpoint.model!r}: {detail}): "
                f"use another backup_dir, or delete it to train from the start"
            )
        for v, value in zip(variables, checkpoint.variables, strict=True):
            tfb.assign_exact(v, value)
        self.step.resume_micro_batches(checkpoint.micro_batches)
        self._restored = True

    def _restore_watch_log(self) -> None:
        """Put the Watch log of the interrupted run back; the resumed run is appended to it."""
        saved = (self.resumed.watch or {}) if self.resumed is not None else {}
        log_path = getattr(self.watch, "log_path", None)
        if self.watch is None or not log_path or saved.get("log") is None:
            return
        with open(log_path, "w", encoding="utf-8") as f:
            f.write(saved["log"])
        # The resumed run is appended after the runs the log holds, numbered on from them.
        runs = sum('"type": "header"' in line for line in saved["log"].splitlines())
        self.watch.runs = max(int(self.watch.runs), runs)

    # -- during fit ---------------------------------------------------------------------------
    def _skipping(self, train_function: Any) -> Any:
        """`train_function` that first skips the batches the resumed epoch already trained.

        Installed outermost (after other callbacks, e.g. `memfit.Watch`, wrapped theirs), as
        those take the batch from Keras' iterator themselves.
        """

        def skipping(iterator: Iterator[Any]) -> Any:
            if self._metrics_pending:
                self._restore_metrics(iterator)
                self._metrics_pending = False
            while self._skip:
                next(iterator)  # an epoch that ends here ends as Keras ends it (StopIteration)
                self._skip -= 1
            return train_function(iterator)

        skipping.guarded_step = getattr(train_function, "guarded_step", None)  # type: ignore[attr-defined]
        return skipping

    @contextlib.contextmanager
    def handling_signals(self) -> Iterator[None]:
        """Catch SIGTERM while the block runs (only note it), then put the old handler back.

        A SIGTERM noted too late to stop at (after the last update's check) is sent again
        once the old handler is back, so the process still ends as it was asked to. Off the
        main thread (where Python cannot install handlers) nothing is installed: the
        periodic checkpoints still are written.
        """
        if threading.current_thread() is not threading.main_thread():
            logger.warning("memfit: fit runs off the main thread: SIGTERM is not caught")
            yield
            return

        def note(signum: int, frame: Any) -> None:
            self._signalled = signum

        previous = signal.signal(signal.SIGTERM, note)
        try:
            with warnings.catch_warnings():
                if self._skip:  # the resumed epoch ends early in Keras' eyes: say nothing
                    warnings.filterwarnings("ignore", message="Your input ran out of data")
                yield
        finally:
            signal.signal(signal.SIGTERM, previous)
            if self._signalled is not None and not self._stopped:
                signal.raise_signal(signal.SIGTERM)

    def callback(self) -> Any:
        """A Keras callback that counts batches, saves, and stops on SIGTERM."""
        keras = tfb.import_keras()
        backup = self

        class BackupCallback(keras.callbacks.Callback):
            def on_train_begin(self, logs: Any = None) -> None:
                backup._restore()  # a model built only now by Keras
                if backup._skip:
                    self.model.train_function = backup._skipping(self.model.train_function)

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                backup._epoch_begin(epoch)

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                backup._batch_end(self.params.get("steps"))

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                backup._epoch_end(epoch)

            def on_train_end(self, logs: Any = None) -> None:
                backup._train_end()

        return BackupCallback()

    def _epoch_begin(self, epoch: int) -> None:
        resumed = self.resumed
        self.epoch = epoch
        self.batch = 0
        if resumed is not None and epoch == resumed.epoch and self._skip:
            self.batch = self._skip
            self._metrics_pending = not self._restore_metrics(None)

    def _restore_metrics(self, iterator: Any) -> bool:
        """Put back the resumed epoch's running metrics (Keras has just reset them).

        Keras builds compiled metrics when the first step is traced (under no strategy): then
        they are built here first, as Keras does under a strategy, from the data's spec.
        """
        saved = self.resumed.metrics if self.resumed is not None else []
        metrics = list(self.model.metrics_variables)
        spec = getattr(iterator, "element_spec", None)
        build = getattr(self.model, "_symbolic_build", None)
        if len(metrics) != len(saved) and spec is not None and build is not None:
            try:
                build(data_batch=spec)
            except Exception as exc:  # the metrics of one epoch's log are not worth a stop
                logger.debug("memfit: the metrics could not be built to restore: %s", exc)
            metrics = list(self.model.metrics_variables)
        if len(metrics) != len(saved):
            return False
        for v, value in zip(metrics, saved, strict=True):
            if tuple(v.shape) == value.shape:
                tfb.assign_exact(v, value)
        return True

    def _batch_end(self, steps: int | None) -> None:
        self.batch += 1
        self._since_save += 1
        if self._stop_voted():
            self._preempted(steps)
        if self.save_freq != "epoch" and self._since_save >= self.save_freq:
            self.save("updates")

    def _epoch_end(self, epoch: int) -> None:
        self.epoch, self.batch = epoch + 1, 0
        if self._stop_voted():
            self._preempted(None)
        if self.save_freq == "epoch":
            self.save("epoch")

    def _train_end(self) -> None:
        if self.keep:
            self.save("end")
        elif self.chief:
            remove_checkpoint(self.backup_dir)

    def _stop_voted(self) -> bool:
        """Whether this worker, or any other (a vote under several workers), was signalled."""
        signalled = self._signalled is not None
        if self.agreement is None or not self.agreement.active:
            return signalled
        return self.agreement.any(signalled, "the vote on stopping for a SIGTERM")

    def _preempted(self, steps: int | None) -> None:
        failure: BaseException | None = None
        try:
            path = self.save("preempted")
        except Exception as exc:  # the others must still hear of it, or they wait for ever
            failure, path = exc, os.path.join(self.backup_dir, BACKUP_FILE)
        if self.agreement is not None and self.agreement.active:
            # Nobody exits before the chief's checkpoint is whole (or known to have failed).
            failed = self.agreement.any(failure is not None, "the vote after the checkpoint")
            if failed and failure is None:
                self._stopped = True
                raise BackupError(
                    f"preempted, but the chief worker could not write the checkpoint {path} "
                    f"(its own error is in its log): the job cannot resume from this stop"
                )
        if failure is not None:
            self._stopped = True
            raise failure
        name = signal.Signals(self._signalled or signal.SIGTERM).name
        where = (
            f"epoch {self.epoch + 1}, batch {self.batch}" + (f" of {steps}" if steps else "")
            if self.batch
            else f"the end of epoch {self.epoch}"
        )
        text = (
            f"memfit: preempted ({name}) after update {self._iterations()} ({where}); "
            f"checkpoint written to {path}; run the same memfit.fit again to resume "
            f"(exit status {PREEMPTED_EXIT_CODE})"
        )
        logger.info(text)
        print(text, file=sys.stderr, flush=True)
        self._stopped = True
        raise SystemExit(PREEMPTED_EXIT_CODE)

    # -- the checkpoint -----------------------------------------------------------------------
    def save(self, reason: str) -> str:
        """Write the current state as the checkpoint; returns its path.

        Under several workers every worker reads the state (reading a metric's variable is a
        collective there: all take part, in the same order), and only the chief writes it; the
        others return the path it writes.
        """
        model, optimizer = self.model, self.step.optimizer
        variables = state_variables(model, optimizer)
        checkpoint = Checkpoint(
            epoch=self.epoch,
            step=self.batch,
            updates=self._iterations(),
            micro_batches=dict(self.step.summary.micro_batches),
            reason=reason,
            model=str(model.name),
            names=[str(getattr(v, "path", v.name)) for v in variables],
            variables=[np.array(v.numpy(), copy=True) for v in variables],
            metrics=[np.array(v.numpy(), copy=True) for v in model.metrics_variables],
            summary=self.step.summary.to_dict(),
            watch=self._watch_state(),
        )
        self._since_save = 0
        if not self.chief:
            return os.path.join(self.backup_dir, BACKUP_FILE)
        return write_checkpoint(self.backup_dir, checkpoint)

    def _watch_state(self) -> dict[str, Any] | None:
        watch = self.watch
        if watch is None:
            return None
        log_path = getattr(watch, "log_path", None)
        log = None
        if hasattr(watch, "flush"):
            watch.flush()  # the steps of the epoch under way too
        if log_path and os.path.exists(log_path):
            with open(log_path, encoding="utf-8") as f:
                log = f.read()
        return {
            "log_path": log_path,
            "log": log,
            "steps": list(getattr(watch, "steps", [])),
            "findings": [
                dataclasses.asdict(f) if dataclasses.is_dataclass(f) else str(f)
                for f in getattr(watch, "findings", [])
            ],
        }

    def _iterations(self) -> int:
        return int(self.step.optimizer.iterations.numpy())


def state_variables(model: Any, optimizer: Any) -> list[Any]:
    """The variables a checkpoint holds: the model's (with seed states), then the optimizer's."""
    seen: set[int] = set()
    out = []
    for v in [*model.variables, *optimizer.variables]:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _check_resumable_data(x: Any, steps_per_epoch: int | None) -> None:
    """Refuse data whose epochs a resume cannot find its place in."""
    if steps_per_epoch is not None:
        raise BackupError(
            "backup_dir resumes inside an epoch by skipping the batches it already trained, "
            "which needs each epoch to be one pass over the data: leave steps_per_epoch out "
            "(take() the dataset to the epoch's length instead)"
        )
    if _is_dataset(x):
        cardinality = x.cardinality  # a method; a number on a DistributedDataset
        cardinality = int(cardinality() if callable(cardinality) else cardinality)
        if cardinality < 0:
            kind = "infinite (repeat())" if cardinality == -1 else "unknown (filter, generator)"
            raise BackupError(
                f"backup_dir needs to know an epoch's length, and the dataset's is {kind}: "
                f"drop repeat(), or add .apply(tf.data.experimental.assert_cardinality(N))"
            )
    elif inspect.isgenerator(x) or (hasattr(x, "__next__") and not hasattr(x, "__len__")):
        raise BackupError(
            "backup_dir needs data it can go through again from the start each epoch, not a "
            "Python generator: pass arrays, a tf.data.Dataset or a keras.utils.PyDataset"
        )


def _is_dataset(x: Any) -> bool:
    return type(x).__module__.startswith("tensorflow") and hasattr(x, "cardinality")


def _is_watch(callback: Any) -> bool:
    return type(callback).__name__ == "Watch" and hasattr(callback, "findings")


def _dtype_name(variable: Any) -> str:
    return str(np.dtype(tfb.import_tf().as_dtype(variable.dtype).as_numpy_dtype))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def _remove_temporaries(backup_dir: str) -> None:
    for name in os.listdir(backup_dir):
        if name.startswith(_TEMP_PREFIX):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(backup_dir, name))


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):  # not every platform lets a directory be opened
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_writes = 0


def _pause_for_test() -> None:
    global _writes
    marker = os.environ.get(_PAUSE_ENV)
    if not marker:
        return
    _writes += 1
    if _writes == int(os.environ.get(_PAUSE_AT_ENV, "1")):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
