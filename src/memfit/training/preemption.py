"""Preemption: SIGTERM noted while `memfit.fit` runs, and the line and status it stops with.

Cloud VMs and Kubernetes send SIGTERM before they take a machine. `Sigterm.catching()`
installs a handler that only takes note (the update under way finishes: weights and optimizer
are never half-updated) and puts the previous handler back after; `memfit.training.backup` then
writes
the checkpoint, prints `preempted_line(...)` and exits with `PREEMPTED_EXIT_CODE`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger("memfit")

PREEMPTED_EXIT_CODE = 143
"""Exit status after a SIGTERM checkpoint: 128 + SIGTERM (TensorFlow's restartable code)."""


class Sigterm:
    """Notes a SIGTERM while a block runs, instead of letting it end the process there.

    Attributes:
        signum: the signal noted (`signal.SIGTERM`), or None.
        installed: whether the handler is installed (only on the main thread).
        stopped: set by whoever stops for the signal; otherwise a signal noted too late to
            stop at is sent again once the previous handler is back.

    Example:
        ```python
        sigterm = Sigterm()
        with sigterm.catching():
            for batch in batches:
                train(batch)
                if sigterm.signum is not None:
                    save(); sigterm.stopped = True; raise SystemExit(PREEMPTED_EXIT_CODE)
        ```
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.installed = False
        self.stopped = False

    @contextlib.contextmanager
    def catching(self) -> Iterator[None]:
        """Catch SIGTERM while the block runs (only note it), then put the old handler back.

        A SIGTERM noted but not stopped for (`stopped` still False) is sent again once the old
        handler is back, so the process still ends as it was asked to. Off the main thread
        (where Python cannot install handlers) nothing is installed.
        """
        if threading.current_thread() is not threading.main_thread():
            logger.warning("memfit: fit runs off the main thread: SIGTERM is not caught")
            yield
            return

        def note(signum: int, frame: Any) -> None:
            self.signum = signum

        previous = signal.signal(signal.SIGTERM, note)
        self.installed = True
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.installed = False
            if self.signum is not None and not self.stopped:
                signal.raise_signal(signal.SIGTERM)


def preempted_line(
    signum: int | None, updates: int, epoch: int, batch: int, steps: int | None, path: str
) -> str:
    """The one line a preempted `memfit.fit` prints before it exits.

    Args:
        signum: the signal it stops for (None: SIGTERM).
        updates: the optimizer updates trained.
        epoch: the epoch it stopped in (from 0), or, with `batch` 0, the epochs completed.
        batch: batches of that epoch trained.
        steps: batches in an epoch, when known.
        path: the checkpoint written.

    Example:
        >>> preempted_line(15, 11, 1, 5, 6, "/tmp/backup/memfit-backup.npz")[:59]
        'memfit: preempted (SIGTERM) after update 11 (epoch 2, batch'
    """
    name = signal.Signals(signum or signal.SIGTERM).name
    where = (
        f"epoch {epoch + 1}, batch {batch}" + (f" of {steps}" if steps else "")
        if batch
        else f"the end of epoch {epoch}"
    )
    return (
        f"memfit: preempted ({name}) after update {updates} ({where}); "
        f"checkpoint written to {path}; run the same memfit.fit again to resume "
        f"(exit status {PREEMPTED_EXIT_CODE})"
    )
