"""Checkpoint: the file a preemption-safe `memfit.fit` keeps, written atomically.

One checkpoint is kept in `backup_dir/memfit-backup.npz`: an `.npz` of the saved variables
(`v0`, `v1`, ...), the metric variables (`m0`, ...) and a JSON `state` entry with everything
else (`Checkpoint.state()`). A checkpoint is written to a temporary file in the directory,
flushed and fsynced, and only then `os.replace`d over the previous one (and the directory
fsynced): a process killed at any moment (`kill -9`, power loss) leaves the previous
checkpoint whole. A leftover temporary file is ignored and removed by the next write.
`memfit.training.backup` decides what goes into a checkpoint and when it is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memfit.backend import tf as tfb
from memfit.errors import BackupError

BACKUP_FILE = "memfit-backup.npz"
"""The checkpoint's file name inside `backup_dir`."""

FORMAT = 1
"""The checkpoint format this memfit writes and reads (a file of another is refused)."""

_TEMP_PREFIX = ".memfit-backup-"
# Test hook: a file path; the checkpoint write numbered MEMFIT_BACKUP_TEST_PAUSE_AT (from 1)
# creates it once its temporary file is written, then sleeps before the replace (so a test
# can kill -9 the process in the middle of the write).
_PAUSE_ENV = "MEMFIT_BACKUP_TEST_PAUSE"
_PAUSE_AT_ENV = "MEMFIT_BACKUP_TEST_PAUSE_AT"


@dataclass
class Checkpoint:
    """One saved training state of `memfit.fit` (see `memfit.training.backup`).

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

    Args:
        backup_dir: the `backup_dir` a user gave (a `str` or `os.PathLike`).

    Returns:
        The directory's path, which exists and is writable.

    Raises:
        BackupError: one line saying what is wrong with the directory.

    Example:
        ```python
        path = check_backup_dir(pathlib.Path("/tmp/backup"))   # "/tmp/backup", created
        ```
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

    Args:
        backup_dir: the directory `memfit.fit(..., backup_dir=...)` was given.

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
    """Remove the checkpoint (and leftover temporary files); the directory too when empty.

    Args:
        backup_dir: the directory of the checkpoint; other files in it are left alone.

    Example:
        ```python
        remove_checkpoint("/tmp/backup")             # what a completed memfit.fit does
        ```
    """
    _remove_temporaries(backup_dir)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(backup_dir, BACKUP_FILE))
    with contextlib.suppress(OSError):
        os.rmdir(backup_dir)  # only when empty: never a user's other files


def state_variables(model: Any, optimizer: Any) -> list[Any]:
    """The variables a checkpoint holds: the model's (with seed states), then the optimizer's.

    Args:
        model: a built `keras.Model`.
        optimizer: its optimizer, built.

    Returns:
        Each variable once, in a fixed order.

    Example:
        ```python
        variables = state_variables(model, model.optimizer)
        check_same_model(read_checkpoint("/tmp/backup"), variables, "/tmp/backup")
        ```
    """
    seen: set[int] = set()
    out = []
    for v in [*model.variables, *optimizer.variables]:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def check_same_model(checkpoint: Checkpoint, variables: list[Any], backup_dir: str) -> None:
    """Refuse a checkpoint whose variables are not those of this model (shape and dtype).

    Args:
        checkpoint: the checkpoint read from `backup_dir`.
        variables: this model's `state_variables`, in order.
        backup_dir: where the checkpoint was read from (for the message).

    Raises:
        BackupError: which variable differs, and what to do.

    Example:
        ```python
        checkpoint = read_checkpoint("/tmp/backup")
        check_same_model(checkpoint, state_variables(model, optimizer), "/tmp/backup")
        ```
    """
    path = os.path.join(backup_dir, BACKUP_FILE)
    theirs = [(list(v.shape), str(v.dtype)) for v in checkpoint.variables]
    ours = [(list(v.shape), _dtype_name(v)) for v in variables]
    if theirs == ours:
        return
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
