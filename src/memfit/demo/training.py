"""The child side of the demo's training steps: plain `model.fit`, then `memfit.fit`.

Each runs in its own process under the emulated card (`memfit.measuring.isolate.run_in_child`), so
an
out-of-memory error stays inside it.
"""

from __future__ import annotations

import re
from typing import Any

import memfit
from memfit.backend import tf as tfb
from memfit.demo.job import BATCH, LARGE, SMALL, detector, job_dataset


def train_plain(directory: str, epochs: int) -> dict[str, Any]:
    """Child: plain `model.fit` on the job, then on the new shard alone; what each died of."""
    import tensorflow as tf

    out: dict[str, Any] = {}
    for name, which in (("job", "all"), ("new_shard", "large")):
        model = detector()
        try:
            model.fit(job_dataset(directory, which=which), epochs=epochs, verbose=0)
            out[name] = {"outcome": "completed"}
        except tf.errors.ResourceExhaustedError as exc:
            out[name] = {"outcome": "ResourceExhaustedError", "message": first_line(exc)}
        except Exception as exc:  # what a user would see; the demo explains it
            out[name] = {"outcome": type(exc).__name__, "message": first_line(exc)}
        del model
    return out


def train_memfit(directory: str, epochs: int, log_path: str, memory: str) -> dict[str, Any]:
    """Child: `memfit.fit` on the same job, watched; its summary and the Watch's findings."""
    model = detector()
    watch = memfit.Watch(
        log_path=log_path,
        name="RetinaNet (ResNet-10) on the demo dataset",
        config={"batch_size": BATCH, "memory": memory, "images": f"{SMALL}px then {LARGE}px"},
        verbose=False,
    )
    batches = sum(1 for _ in job_dataset(directory))
    history = memfit.fit(model, job_dataset(directory), epochs=epochs, callbacks=[watch], verbose=0)
    return {
        "epochs": len(history.history["loss"]),
        "loss": [float(v) for v in history.history["loss"]],
        "updates": int(model.optimizer.iterations.numpy()),
        "expected_updates": batches * epochs,
        "summary": history.memfit.to_dict(),
        "findings": [f.to_dict() for f in watch.findings],
    }


def first_line(exc: BaseException) -> str:
    """One clean line of an error: the OOM's allocation, or the message without the graph
    traceback TensorFlow appends ("Detected at node ... defined at ... File ...")."""

    text = re.sub(r"\x1b\[[0-9;]*m", "", getattr(exc, "message", None) or str(exc))
    if tfb.is_oom(exc):
        text = tfb.oom_summary(exc)
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        lines = [line for line in lines if line.rstrip(":") != "Graph execution error"]
        text = lines[0] if lines else type(exc).__name__
        if text.startswith("Exception encountered when calling") and len(lines) > 1:
            text = f"{text.rstrip('.')}: {lines[1]}"  # Keras' layer name, then the error
    text = re.split(r"Detected at node|\s\[\[\{\{node|\. Hint:", text)[0]
    return " ".join(text.split()).rstrip(" .:")[:240]
