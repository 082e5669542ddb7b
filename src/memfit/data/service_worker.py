"""A tf.data service worker process, as `memfit.data.DataService` starts it for local workers.

Run as `python -m memfit.data.service_worker DISPATCHER HEARTBEAT_MS`: it registers with the
dispatcher, prints `ready` and serves until it is killed. Its environment carries no emulated
card (the pipeline's buffers live in host memory, as beside a GPU).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """Serve as a tf.data service worker of the dispatcher at `argv[0]` until killed.

    Args:
        argv: the dispatcher's address (`host:port`) and the heartbeat interval in ms.
    """
    address, heartbeat_ms = (sys.argv[1:] if argv is None else argv)[:2]
    import tensorflow as tf  # the worker's only work: imported here, not on `import memfit`

    service = tf.data.experimental.service
    worker = service.WorkerServer(
        service.WorkerConfig(dispatcher_address=address, heartbeat_interval_ms=int(heartbeat_ms))
    )
    print("ready", flush=True)
    worker.join()


if __name__ == "__main__":
    main()
