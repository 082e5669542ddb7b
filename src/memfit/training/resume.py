"""Resume: what a resumed `memfit.fit` puts back besides the variables, and checks first.

A checkpoint (`memfit.training.checkpoint`) holds the data position (epoch, and batches of that
epoch
already trained), the epoch's running metrics and what a `memfit.Watch` exposed. To resume
there, `memfit.training.backup` needs data whose epochs it can find its place in
(`check_resumable_data`), warns when the arrays will be shuffled anew (`warn_if_reshuffled`),
and puts back the metrics (`restore_metrics`) and the Watch's log (`watch_state`,
`restore_watch_log`).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import warnings
from typing import Any

from memfit.backend import tf as tfb
from memfit.errors import BackupError, MemfitWarning
from memfit.training.checkpoint import Checkpoint

logger = logging.getLogger("memfit")


def check_resumable_data(x: Any, steps_per_epoch: int | None) -> None:
    """Refuse data whose epochs a resume cannot find its place in.

    Args:
        x, steps_per_epoch: as given to `memfit.fit`.

    Raises:
        BackupError: why the data cannot be resumed (steps_per_epoch, an infinite or unknown
            dataset, a Python generator), and what to do.

    Example:
        ```python
        check_resumable_data(dataset.repeat(), None)   # BackupError: ... infinite (repeat())
        ```
    """
    if steps_per_epoch is not None:
        raise BackupError(
            "backup_dir resumes inside an epoch by skipping the batches it already trained, "
            "which needs each epoch to be one pass over the data: leave steps_per_epoch out "
            "(take() the dataset to the epoch's length instead)"
        )
    if is_dataset(x):
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


def is_dataset(x: Any) -> bool:
    """Whether `x` is a `tf.data.Dataset` (or a distributed one): it has a cardinality.

    Example:
        >>> is_dataset([1, 2, 3])
        False
    """
    return type(x).__module__.startswith("tensorflow") and hasattr(x, "cardinality")


def warn_if_reshuffled(checkpoint: Checkpoint, x: Any, shuffle: Any) -> None:
    """Warn when the resumed epoch's arrays will be shuffled anew (no random seed is set).

    Args:
        checkpoint: the checkpoint resumed from.
        x, shuffle: as given to `memfit.fit`.

    Example:
        ```python
        warn_if_reshuffled(read_checkpoint("/tmp/backup"), x, shuffle=True)
        ```
    """
    seeded = tfb.import_tf().compat.v1.get_seed(None)[0] is not None
    if checkpoint.step and shuffle and not is_dataset(x) and not seeded:
        warnings.warn(
            f"resuming epoch {checkpoint.epoch + 1} after its batch {checkpoint.step} "
            f"with shuffle=True and no random seed: this process shuffles the arrays anew, "
            f"so the rest of the epoch is a new permutation (some samples twice, some "
            f"not); call keras.utils.set_random_seed(...) before fit, or pass "
            f"shuffle=False, for a resume that repeats the uninterrupted run",
            MemfitWarning,
            stacklevel=4,  # memfit.fit's caller
        )


def restore_metrics(model: Any, saved: list[Any], iterator: Any) -> bool:
    """Put back the resumed epoch's running metrics (Keras has just reset them).

    Keras builds compiled metrics when the first step is traced (under no strategy): then
    they are built here first, as Keras does under a strategy, from the data's spec.

    Args:
        model: the compiled Keras model.
        saved: the checkpoint's `metrics` (values of the model's metric variables).
        iterator: Keras' data iterator (its `element_spec` builds the metrics), or None.

    Returns:
        Whether the metrics were put back (False: not built yet, and no spec to build them).

    Example:
        ```python
        restore_metrics(model, read_checkpoint("/tmp/backup").metrics, None)
        ```
    """
    metrics = list(model.metrics_variables)
    spec = getattr(iterator, "element_spec", None)
    build = getattr(model, "_symbolic_build", None)
    if len(metrics) != len(saved) and spec is not None and build is not None:
        try:
            build(data_batch=spec)
        except Exception as exc:  # the metrics of one epoch's log are not worth a stop
            logger.debug("memfit: the metrics could not be built to restore: %s", exc)
        metrics = list(model.metrics_variables)
    if len(metrics) != len(saved):
        return False
    for v, value in zip(metrics, saved, strict=True):
        if tuple(v.shape) == value.shape:
            tfb.assign_exact(v, value)
    return True


def is_watch(callback: Any) -> bool:
    """Whether a callback is a `memfit.Watch` (told by its name: Keras is not imported here).

    Example:
        >>> is_watch(object())
        False
    """
    return type(callback).__name__ == "Watch" and hasattr(callback, "findings")


def watch_state(watch: Any) -> dict[str, Any] | None:
    """What a checkpoint keeps of a `memfit.Watch`: its steps, findings and log so far.

    Args:
        watch: the `memfit.Watch` among the callbacks, or None.

    Returns:
        `log_path`, `log` (the log file's text when written), `steps` and `findings`; None
        without a Watch.

    Example:
        ```python
        state = watch_state(memfit.Watch(log_path="train.jsonl"))
        ```
    """
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


def restore_watch_log(watch: Any, saved: dict[str, Any] | None) -> None:
    """Put the Watch log of the interrupted run back; the resumed run is appended to it.

    Args:
        watch: the `memfit.Watch` of the resumed run, or None.
        saved: the checkpoint's `watch` (`watch_state` of the interrupted run), or None.

    Example:
        ```python
        restore_watch_log(watch, read_checkpoint("/tmp/backup").watch)
        ```
    """
    saved = saved or {}
    log_path = getattr(watch, "log_path", None)
    if watch is None or not log_path or saved.get("log") is None:
        return
    with open(log_path, "w", encoding="utf-8") as f:
        f.write(saved["log"])
    # The resumed run is appended after the runs the log holds, numbered on from them.
    runs = sum('"type": "header"' in line for line in saved["log"].splitlines())
    watch.runs = max(int(watch.runs), runs)
