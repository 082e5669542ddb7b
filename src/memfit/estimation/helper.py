"""A second process for the what-ifs that rebuild the model: their traces, side by side.

Each what-if that rebuilds the model (another precision, remat mode, optimizer or input
size) costs a Keras trace of its own: 4-10 s of one core on ResNet50 at 224 px, nearly all
of it Python building TensorFlow's graph, which holds Python's lock, so threads cannot
share it out. `WhatIfQueue` starts a child process (`memfit._child.open_what_if_estimator`)
as the estimate begins, so that TensorFlow's import there overlaps the base step's trace
here. Once the child is ready it takes the next what-if from the queue this process takes
them from, one at a time, and sends back the row's figures. A what-if is traced once,
by whichever process is free first; estimates are deterministic, so a row is the same
whichever process made it (`tests/test_estimate_helper.py`).

Where the child cannot start or dies, the what-if it held goes back to the queue and this
process does it: a second process makes the what-ifs sooner, never different or missing.
Without a child (`WhatIfQueue(None)`), the queue is this process's to-do list.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from memfit.estimation.child import open_what_if_estimator
from memfit.process.runner import ChildWorker

Task = tuple[str, dict[str, Any]]  # (the row's change, the variant's WorkloadSpec fields)



class WhatIfQueue:
    """What-ifs to make, taken by this process and (when given one) a helper child.

    Args:
        child: arguments of `memfit.estimation.child.open_what_if_estimator` (the workload as
            `WorkloadSpec.to_json`, the batch size, the thread counts, `sys.path`); None:
            no helper, this process makes every what-if.
        handler: the function the child prepares with `child` and answers with (a module's
            top-level function; default: `open_what_if_estimator`).

    The child runs with the GPUs hidden (`CUDA_VISIBLE_DEVICES=-1`): it traces, it never
    trains, and a second TensorFlow on the card would take its memory.

    Example:
        ```python
        queue = WhatIfQueue(None)  # or a child's arguments: it starts now
        queue.add([("optimizer sgd", {"optimizer": "sgd"})])
        while (task := queue.take() or queue.wait()) is not None:
            ...  # make it here
        rows = queue.finish()  # what the child made: {change: figures}
        ```
    """

    def __init__(self, child: dict[str, Any] | None, handler: Callable[..., Any] =
    open_what_if_estimator) -> None:
        self._ready = threading.Condition()
        self._tasks: list[Task] = []
        self._made: dict[str, dict[str, Any]] = {}
        self._busy = False  # the child holds a what-if
        self._closed = False  # no more what-ifs will come
        self._gone = child is None  # no child takes what-ifs (none, or it failed)
        self._worker: ChildWorker | None = None
        if child is not None:
            self._worker = ChildWorker(handler, child, env={"CUDA_VISIBLE_DEVICES": "-1"})
            self._worker.start()  # TensorFlow's import there begins now
            threading.Thread(target=self._serve, name="memfit-what-ifs", daemon=True).start()

    @property
    def busy(self) -> bool:
        """Whether the child is making a what-if now."""
        return self._busy

    @property
    def helping(self) -> bool:
        """Whether a child takes what-ifs (it may still be starting); False once it failed."""
        return not self._gone

    @property
    def made(self) -> dict[str, dict[str, Any]]:
        """The child's what-ifs so far, `{change: figures}`."""
        with self._ready:
            return dict(self._made)

    @property
    def pending(self) -> list[Task]:
        """The what-ifs no process has taken yet."""
        with self._ready:
            return list(self._tasks)

    def add(self, tasks: Iterable[Task]) -> None:
        """Queue what-ifs (in the order they are wanted)."""
        with self._ready:
            self._tasks.extend(tasks)
            self._ready.notify_all()

    def take(self) -> Task | None:
        """The next what-if for this process, or None when the queue is empty (for now)."""
        with self._ready:
            return self._tasks.pop(0) if self._tasks else None

    def wait(self) -> Task | None:
        """Wait until the child is done; a what-if it gave back is returned to make here.

        Returns None when every what-if is made (their figures: `finish`).
        """
        with self._ready:
            self._closed = True
            self._ready.notify_all()
            while self._busy and not self._tasks:
                self._ready.wait()
            return self._tasks.pop(0) if self._tasks else None

    def finish(self) -> dict[str, dict[str, Any]]:
        """The child's what-ifs, `{change: figures}`; stops the child. Call after `wait`."""
        self.close()
        return dict(self._made)

    def close(self) -> None:
        """Stop the child now (what it holds is dropped); safe to call twice."""
        with self._ready:
            self._closed = True
            self._tasks.clear()
            self._ready.notify_all()
        if self._worker is not None:
            self._worker.shutdown(kill=True)
            self._worker = None

    def _serve(self) -> None:
        """The child's side of the queue (on a thread): wait until it is ready, then feed it."""
        worker = self._worker
        if worker is None:
            return
        try:
            worker.wait_ready()
        except Exception:  # noqa: BLE001 - no child: this process makes every what-if
            self._gone = True
            return
        while True:
            with self._ready:
                while not self._tasks and not self._closed:
                    self._ready.wait()
                if not self._tasks:
                    return
                change, variant = self._tasks.pop(0)
                self._busy = True
            try:
                figures = worker.call(**variant)
            except Exception:  # noqa: BLE001 - the child died: the what-if is made here
                with self._ready:
                    self._tasks.insert(0, (change, variant))
                    self._busy, self._gone = False, True
                    self._ready.notify_all()
                return
            with self._ready:
                self._made[change] = figures
                self._busy = False
                self._ready.notify_all()
