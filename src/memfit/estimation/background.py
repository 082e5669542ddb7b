"""The high bound's samples on the other core: a forked child replays them meanwhile.

The samples behind the high bound (`memfit.estimation.bounds.peak_range`) are replays only:
pure Python, no TensorFlow, deterministic for their seeds, and independent of the likely
replay and of the what-ifs. `start_peak_range` forks a child that replays some of them (the
child shares the traced graph with this process, so nothing is copied) while this process
replays the likely peak, the rest of the samples and the what-ifs; `PendingRange.result`
joins the two halves. The bound is the one `peak_range` gives in one process, to the byte:
sample `i` replays with seed `seed + i` and races when `i` is odd, so the child's samples are
a `peak_range` from an even offset, and the bound is the highest over the samples (a maximum
of the halves' bounds). `tests/test_estimate_bounds.py` checks the two agree.

Where a child cannot be forked (no `os.fork`) or fails, its samples are replayed here.
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import time
import warnings
from collections.abc import Callable
from typing import Any

from memfit.estimation.bounds import PeakRange, peak_range
from memfit.estimation.step import Replay

# Seconds a child that has not answered yet is waited for at least (see `_child_part`).
CHILD_GRACE_S = 60.0


def _replayed(graph: Any, region_bytes: int | None, seed: int, first: int, count: int) -> PeakRange:
    """Samples `first` to `first + count - 1` of a `peak_range` from `seed` (`first` even)."""
    return peak_range(graph, 0, region_bytes=region_bytes, samples=count, seed=seed + first)


class PendingRange:
    """A high bound whose last samples may still replay in a child: `result()` finishes it.

    Made by `start_peak_range`. The child only replays: it calls no TensorFlow and prints
    nothing, and leaves with `os._exit` (no clean-up of this process's state runs twice).
    """

    def __init__(
        self, graph: Any, region_bytes: int | None, samples: int, seed: int, first: int
    ) -> None:
        self.graph, self.region_bytes, self.seed = graph, region_bytes, seed
        self.samples, self.first = samples, first
        self.pid: int | None = None
        self.fd: int | None = None
        if first < samples:
            self._fork()

    def _fork(self) -> None:
        if not hasattr(os, "fork"):
            return
        read, write = os.pipe()
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns that forking a threaded process may deadlock the child.
                # The child only replays (pure Python, no TensorFlow, no logging), never
                # collects garbage (a finaliser could call into TensorFlow), and a child
                # that does not answer in time is killed and its samples replayed here.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            return
        if pid == 0:  # pragma: no cover - the child: replay, send the range, leave at once
            code = 1
            try:
                gc.disable()
                os.close(read)
                part = _replayed(
                    self.graph, self.region_bytes, self.seed, self.first, self.samples - self.first
                )
                with os.fdopen(write, "wb") as pipe:
                    pipe.write(pickle.dumps((part.high_bytes, part.sample_bytes, part.highest)))
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        self.pid, self.fd, self.started = pid, read, time.monotonic()

    def _child_part(self) -> tuple[int, list[int], Replay | None] | None:
        """The child's (high bound, sample peaks, highest sample's replay); None when it did
        not run, failed or hung.

        A healthy child replays no slower than this process: it is given three times as long
        again as it has run so far (at least a minute), then stopped.
        """
        if self.pid is None or self.fd is None:
            return None
        now = time.monotonic()
        deadline = now + max(CHILD_GRACE_S, 3 * (now - self.started))
        chunks: list[bytes] = []
        with os.fdopen(self.fd, "rb", buffering=0) as pipe:
            self.fd = None
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([pipe], [], [], left)[0]:
                    self.cancel()
                    return None
                chunk = pipe.read(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        data = b"".join(chunks)
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        try:
            high, peaks, top = pickle.loads(data) if status == 0 and data else (None, None, None)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError):
            return None
        if not isinstance(peaks, list) or len(peaks) != self.samples - self.first:
            return None
        return int(high), [int(p) for p in peaks], top if isinstance(top, Replay) else None

    def result(
        self, likely_bytes: int, on_sample: Callable[[int, int], None] | None = None
    ) -> PeakRange:
        """The `PeakRange` of all the samples: replays this process's, then joins the child's.

        Args:
            likely_bytes: the likely peak; the bound is never below it.
            on_sample: called with (samples done, samples) as they are done.
        """
        here = min(self.first, self.samples)

        def progress(done: int, _total: int) -> None:
            if on_sample is not None:
                on_sample(done, self.samples)

        own = peak_range(
            self.graph,
            likely_bytes,
            region_bytes=self.region_bytes,
            samples=here,
            seed=self.seed,
            on_sample=progress,
        )
        rest = self.samples - here
        if rest <= 0:
            return own
        part = self._child_part()
        if part is None:
            replayed = _replayed(self.graph, self.region_bytes, self.seed, here, rest)
            part = (replayed.high_bytes, replayed.sample_bytes, replayed.highest)
        progress(self.samples, self.samples)
        high, peaks, top = part
        tops = [r for r in (own.highest, top) if r is not None]
        highest = max(tops, key=lambda r: r.peak_bytes) if tops else None
        return PeakRange(
            likely_bytes, max(own.high_bytes, high), [*own.sample_bytes, *peaks], highest
        )

    def cancel(self) -> None:
        """Stop the child, if any, and forget its samples (an estimate that failed)."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        if self.fd is not None:
            os.close(self.fd)
        self.pid = self.fd = None


def start_peak_range(
    graph: Any,
    *,
    region_bytes: int | None = None,
    samples: int,
    seed: int = 0,
    here: int = 0,
) -> PendingRange:
    """Start a `peak_range`'s samples: all but the first `here` in a forked child, now.

    `here` is rounded up to an even number (a sample's racing follows its index's parity).
    The child runs on another core while this process goes on; `PendingRange.result(likely)`
    replays the first `here` samples here, joins the child, and gives the `PeakRange` that
    `peak_range(graph, likely, ...)` gives.

    Example:
        ```python
        pending = start_peak_range(graph, samples=4, here=2)  # samples 2 and 3 in a child
        likely = replay(graph).peak_bytes                      # meanwhile, here
        print(pending.result(likely).high_bytes)
        ```
    """
    first = min(samples, here + here % 2)
    return PendingRange(graph, region_bytes, samples, seed, first)
