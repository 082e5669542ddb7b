"""What `memfit.Watch` reports: `WatchFinding`, the kinds of finding, and shared fix texts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit.serialize import json_dict

# Finding kinds, in the order a report lists them.
KINDS = (
    "oom",
    "oom_recovery",
    "memory_growth",
    "retracing",
    "near_budget",
    "thrashing",
    "input_bound",
    "divergence",
    "non_finite_loss",
)

PIPELINE_FIX = (
    "parallelise and overlap the input pipeline: `.map(f, num_parallel_calls=tf.data.AUTOTUNE)`, "
    "end it with `.prefetch(tf.data.AUTOTUNE)`, `.cache()` after expensive deterministic "
    "steps (decode, resize) when the data fits in RAM or on local disk, and read many files "
    "at once with `interleave(..., num_parallel_calls=tf.data.AUTOTUNE)`; move Python code "
    "(`py_function`, `numpy_function`, generators) into TensorFlow ops"
)

LR_FIX = (
    "lower the learning rate (try 3-10x lower), add a warm-up (e.g. "
    "`keras.optimizers.schedules.CosineDecay(lr, decay_steps, warmup_target=lr, "
    "warmup_steps=...)` starting from a small value) and a decay schedule, and clip gradients "
    "(`clipnorm=1.0` on the optimizer)"
)


@dataclass
class WatchFinding:
    """Something `Watch` saw: what, when, why, what to do, and the numbers behind it.

    Attributes:
        kind: one of `KINDS` (`memory_growth`, `retracing`, `near_budget`, `thrashing`,
            `input_bound`, `divergence`, `non_finite_loss`, `oom`, `oom_recovery`).
        step: the training step of its fit (counted from 0 over the fit's epochs) where it
            first held.
        epoch: the epoch (from 0).
        message: what was seen, with numbers.
        cause: the likely cause.
        fix: what to do.
        evidence: the numbers (`_bytes`, `_seconds`, fractions, counts).
        severity: `"warning"` or `"problem"`.
        run: which fit of the `Watch` it belongs to (0 for the first).

    Example:
        ```python
        for finding in watch.findings:
            print(finding.kind, finding.step, finding.fix)
        ```
    """

    kind: str
    step: int
    epoch: int | None
    message: str
    cause: str
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)
    severity: str = "warning"
    run: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return json_dict(self)

    def __str__(self) -> str:
        return f"{self.kind} at step {self.step}: {self.message}"
