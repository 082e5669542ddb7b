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

`Backup` puts the parts together for `memfit.fit`: the file and its atomic write are
`memfit.training.checkpoint`, the SIGTERM handler and the exit `memfit.training.preemption`, what a
resume checks
and puts back (data position, metrics, the Watch's log) `memfit.training.resume`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from memfit.backend import tf as tfb
from memfit.errors import BackupError
from memfit.training.checkpoint import (
    BACKUP_FILE,
    Checkpoint,
    check_backup_dir,
    check_same_model,
    read_checkpoint,
    remove_checkpoint,
    state_variables,
    write_checkpoint,
)
from memfit.training.distributed import Agreement
from memfit.training.preemption import PREEMPTED_EXIT_CODE, Sigterm, preempted_line
from memfit.training.resume import (
    check_resumable_data,
    is_watch,
    restore_metrics,
    restore_watch_log,
    warn_if_reshuffled,
    watch_state,
)

logger = logging.getLogger("memfit")

__all__ = ["BACKUP_FILE", "PREEMPTED_EXIT_CODE", "Backup", "read_checkpoint"]


class Backup:
    """Backs a `memfit.fit` up into `backup_dir` and resumes it from there.

    Made by `memfit.fit(..., backup_dir=...)`; see `memfit.training.backup` for what is saved and
    when.

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
        self.sigterm = Sigterm()  # noted while fit runs; `stopped` once exited for it
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
        self.watch = next((c for c in callbacks or [] if is_watch(c)), None)
        check_resumable_data(x, steps_per_epoch)
        checkpoint = self.resumed
        if checkpoint is None:
            self.epoch = initial_epoch
            return initial_epoch
        if model.built:
            self._restore()  # before anything runs: a wrong checkpoint stops here, untouched
        self._skip = checkpoint.step
        self.epoch = checkpoint.epoch
        warn_if_reshuffled(checkpoint, x, shuffle)
        restore_watch_log(self.watch, checkpoint.watch)
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
        check_same_model(checkpoint, variables, self.backup_dir)
        for v, value in zip(variables, checkpoint.variables, strict=True):
            tfb.assign_exact(v, value)
        self.step.resume_micro_batches(checkpoint.micro_batches)
        self._restored = True

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
        with self.sigterm.catching():
            if not self.sigterm.installed:
                yield
                return
            with warnings.catch_warnings():
                if self._skip:  # the resumed epoch ends early in Keras' eyes: say nothing
                    warnings.filterwarnings("ignore", message="Your input ran out of data")
                yield

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
        """Put back the resumed epoch's running metrics (see
        `memfit.training.resume.restore_metrics`)."""
        saved = self.resumed.metrics if self.resumed is not None else []
        return restore_metrics(self.model, saved, iterator)

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
        signalled = self.sigterm.signum is not None
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
                self.sigterm.stopped = True
                raise BackupError(
                    f"preempted, but the chief worker could not write the checkpoint {path} "
                    f"(its own error is in its log): the job cannot resume from this stop"
                )
        if failure is not None:
            self.sigterm.stopped = True
            raise failure
        text = preempted_line(
            self.sigterm.signum, self._iterations(), self.epoch, self.batch, steps, path
        )
        logger.info(text)
        print(text, file=sys.stderr, flush=True)
        self.sigterm.stopped = True
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
            watch=watch_state(self.watch),
        )
        self._since_save = 0
        if not self.chief:
            return os.path.join(self.backup_dir, BACKUP_FILE)
        return write_checkpoint(self.backup_dir, checkpoint)

    def _iterations(self) -> int:
        return int(self.step.optimizer.iterations.numpy())
