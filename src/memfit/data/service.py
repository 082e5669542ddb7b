"""The input pipeline on tf.data service workers: off the (emulated) card, and scaled out.

`DataService` runs a `tf.data` pipeline on TensorFlow's own tf.data service: worker processes
that this process starts and ends (`DataService(workers=2)`), or the workers of a dispatcher
that runs elsewhere (`DataService("grpc://host:5050")`). The trainer receives finished
elements and holds nothing of the pipeline itself: no shuffle, map or prefetch buffer.

That matters twice. Under a CPU-emulated card (`memfit.emulate`) every tensor TensorFlow
allocates in the process counts against the card, the pipeline's buffers too, which a GPU
keeps in host memory; elements received from the service are allocated outside the emulated
card's allocator, so only the batch a step reads counts (`memfit.fit` copies it onto the card,
as a GPU does). And a run whose input cannot keep up (decode, storage) gets more CPUs: each
worker runs the whole pipeline.

The dispatcher of local workers runs in this process (it coordinates, it holds no data); each
worker is a fresh Python process without the emulation's cap, started in a session of its own
(Ctrl-C reaches the trainer, which ends them) and killed by the kernel if the trainer dies. A
worker that dies mid-run is started again, with a warning; the trainer then goes on reading
from it (one worker: the order of that epoch changes from then on).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from memfit.backend import tf as tfb
from memfit.errors import DataError

# Operations that call back into this Python process: tf.data service cannot run them in a
# worker (tf.py_function, tf.numpy_function, Dataset.from_generator).
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
# How long a local worker may take to start (import TensorFlow, register with the dispatcher).
WORKER_START_SECONDS = 120.0
# How long to wait for a remote dispatcher's port to answer.
CONNECT_SECONDS = 10.0
# A dead worker is dropped by the dispatcher after this long without a heartbeat.
WORKER_TIMEOUT_MS = 3000
HEARTBEAT_MS = 500
# Environment a local worker must not inherit: the emulated card's cap is the trainer's.
_TRAINER_ONLY = ("MEMFIT_", "TF_CPU_BFC", "TF_CPU_ALLOCATOR")


class DataService:
    """A tf.data service to run input pipelines on: local worker processes, or a dispatcher.

    Args:
        address: a dispatcher's address (`"grpc://host:5050"` or `"host:5050"`) whose workers
            run elsewhere; None starts local workers.
        workers: how many local worker processes (with `address=None`; default 1).
        verbose: print a line when a local worker dies and is started again.

    Example:
        ```python
        with memfit.data.DataService(workers=2) as service:
            model.fit(service.serve(dataset), epochs=3)
        ```
    """

    def __init__(self, address: str | None = None, *, workers: int = 1, verbose: bool = True):
        if address is None and (isinstance(workers, bool) or int(workers) < 1):
            raise DataError(f"data_service needs at least 1 worker, got {workers}")
        self.address = _normalised(address) if address is not None else None
        self.workers = 0 if address is not None else int(workers)
        self.verbose = verbose
        self.restarts = 0
        self._dispatcher: Any = None
        self._processes: list[subprocess.Popen[str]] = []
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def local(self) -> bool:
        """Whether this service's workers are processes of this one."""
        return self.address is None

    @property
    def target(self) -> str:
        """The dispatcher's address as `distribute` takes it (after `start`)."""
        if self.address is not None:
            return self.address
        if self._dispatcher is None:
            raise DataError("the data service is not started: use it in a `with` block")
        return str(self._dispatcher.target)

    def start(self) -> DataService:
        """Reach the dispatcher, or start a local one and its workers; returns self.

        Raises:
            DataError: the dispatcher does not answer, or a local worker cannot start.
        """
        if self.address is not None:
            _reach(self.address)
            return self
        if self._dispatcher is not None:
            return self
        tf = tfb.import_tf()
        service = tf.data.experimental.service
        self._dispatcher = service.DispatchServer(
            service.DispatcherConfig(port=0, worker_timeout_ms=WORKER_TIMEOUT_MS)
        )
        try:
            started = [self._spawn() for _ in range(self.workers)]
            for process in started:
                self._wait_ready(process)
        except BaseException:
            self.close()
            raise
        self._watcher = threading.Thread(target=self._watch, name="memfit-data-service",
                                         daemon=True)
        self._watcher.start()
        return self

    def serve(self, dataset: Any) -> Any:
        """`dataset` read from this service's workers, element for element.

        One worker yields the dataset's own elements in its own order (`parallel_epochs`);
        several each run the pipeline on their share of its source files or slices
        (`distributed_epoch`, dynamic sharding), every element once an epoch, in the order
        they finish.

        Raises:
            DataError: the pipeline calls Python (`tf.py_function`, `from_generator`), which a
                worker process cannot run.
        """
        tf = tfb.import_tf()
        check_servable(dataset)
        mode = "parallel_epochs" if self.workers == 1 else "distributed_epoch"
        return dataset.apply(
            tf.data.experimental.service.distribute(
                processing_mode=mode,
                service=self.target,
                # Compressed elements are unpacked with TensorFlow's process-wide allocator,
                # outside an emulated card's; uncompressed ones land on it (measured: a
                # batch of 0.84 MiB, 0.85-1.16 MiB in use after each read, 0 compressed).
                compression="AUTO",
            )
        )

    def close(self) -> None:
        """End the local workers and the dispatcher (nothing to do for a remote one)."""
        self._closing.set()
        with self._lock:
            processes, self._processes = self._processes, []
        for process in processes:
            if process.poll() is None:
                process.kill()
        for process in processes:
            with contextlib.suppress(Exception):
                process.wait(timeout=10)
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=5)
        self._watcher = None
        if self._dispatcher is not None:
            with contextlib.suppress(Exception):
                self._dispatcher._stop()  # noqa: SLF001 - TensorFlow's only way to stop it
            self._dispatcher = None

    def pids(self) -> list[int]:
        """The process ids of the local workers running now."""
        with self._lock:
            return [p.pid for p in self._processes if p.poll() is None]

    def __enter__(self) -> DataService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self) -> subprocess.Popen[str]:
        address = self.target.split("://", 1)[-1]
        env = {k: v for k, v in os.environ.items() if not k.startswith(_TRAINER_ONLY)}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # The worker imports this package as the trainer does, installed or not.
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        process = subprocess.Popen(
            [sys.executable, "-m", "memfit.data.service_worker", address, str(HEARTBEAT_MS)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ctrl-C goes to the trainer, which ends the workers
            preexec_fn=_die_with_parent,
        )
        with self._lock:
            self._processes.append(process)
        return process

    def _wait_ready(self, process: subprocess.Popen[str]) -> None:
        line: list[str] = []
        reader = threading.Thread(
            target=lambda: line.append(process.stdout.readline() if process.stdout else ""),
            daemon=True,
        )
        reader.start()
        reader.join(WORKER_START_SECONDS)
        if line and line[0].strip() == "ready":
            # Drain stderr in the background, so a chatty worker never blocks on a full pipe.
            threading.Thread(target=_drain, args=(process,), daemon=True).start()
            return
        process.kill()
        _, err = process.communicate(timeout=10)
        tail = " ".join((err or "").strip().splitlines()[-1:]) or "no output"
        raise DataError(f"a tf.data service worker did not start: {tail}")

    def _watch(self) -> None:
        """Start a worker again where one died, until the service closes."""
        while not self._closing.wait(0.5):
            with self._lock:
                dead = [p for p in self._processes if p.poll() is not None]
                for process in dead:
                    self._processes.remove(process)
            for process in dead:
                if self._closing.is_set():
                    return
                self.restarts += 1
                if self.verbose:
                    print(
                        f"memfit: warning: a tf.data service worker ended "
                        f"({_how(process.returncode)}); starting another",
                        file=sys.stderr,
                        flush=True,
                    )
                try:
                    self._wait_ready(self._spawn())
                except DataError as exc:
                    print(f"memfit: error: {exc}", file=sys.stderr, flush=True)


def check_servable(dataset: Any) -> None:
    """Refuse a pipeline a worker process cannot run, in one line that says what to do.

    Raises:
        DataError: the pipeline calls Python (`tf.py_function`, `from_generator`).
    """
    python_ops = python_ops_in(dataset)
    if python_ops:
        raise DataError(
            f"the input pipeline calls Python ({', '.join(sorted(python_ops))}: "
            f"tf.py_function, tf.numpy_function or Dataset.from_generator), which tf.data "
            f"service cannot run in a worker process; write those steps with TensorFlow ops, "
            f"or train without data_service"
        )


def python_ops_in(dataset: Any) -> set[str]:
    """The operations in `dataset`'s graph that call back into Python (see `PYTHON_OPS`)."""
    tf = tfb.import_tf()
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph().numpy())  # noqa: SLF001
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return ops & PYTHON_OPS


def resolve(data_service: Any) -> DataService | None:
    """A `DataService` for `memfit.fit`'s `data_service=` (None or 0: none).

    Args:
        data_service: a number of local workers, a dispatcher's address, or a `DataService`.
    """
    if data_service is None or data_service is False or data_service == 0:
        return None
    if isinstance(data_service, DataService):
        return data_service
    if isinstance(data_service, str):
        return DataService(data_service)
    if isinstance(data_service, int) and not isinstance(data_service, bool):
        return DataService(workers=data_service)
    raise DataError(
        f"data_service takes a number of local workers or a dispatcher address "
        f"(grpc://host:port), got {data_service!r}"
    )


@contextlib.contextmanager
def serving(service: DataService | None) -> Iterator[DataService | None]:
    """Start `service` (if any) for the block, and end what it started after it."""
    if service is None:
        yield None
        return
    owned = service._dispatcher is None and service.local  # noqa: SLF001
    service.start()
    try:
        yield service
    except BaseException as exc:
        # The frames of the traceback hold the reader (Keras' iterator): freed here, while
        # the workers and the dispatcher still answer, its client ends at once instead of
        # calling a stopped service at exit. The traceback's lines stay.
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        if owned:
            gc.collect()  # the reader goes before the service it reads from
            service.close()


def _normalised(address: str) -> str:
    text = address.strip()
    if "://" not in text:
        text = f"grpc://{text}"
    parsed = urlparse(text)
    if parsed.scheme != "grpc" or not parsed.hostname or parsed.port is None:
        raise DataError(
            f"data_service address {address!r} is not a dispatcher address: give it as "
            f"grpc://HOST:PORT"
        )
    return text


def _reach(address: str) -> None:
    parsed = urlparse(address)
    try:
        with socket.create_connection((parsed.hostname, parsed.port), CONNECT_SECONDS):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise DataError(
            f"cannot reach the tf.data service dispatcher at {address} ({reason}); start it "
            f"(tf.data.experimental.service.DispatchServer) and its workers, or pass "
            f"data_service=N to run N workers on this machine"
        ) from None


def _die_with_parent() -> None:
    """In the worker, before it runs: ask the kernel to kill it when the trainer dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _drain(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(Exception):
        for _ in process.stderr or ():
            pass


def _how(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"
