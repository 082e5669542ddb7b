"""Watch: a Keras callback that watches training and says what is wrong, why, and what to do.

Per step `memfit.Watch` records the device's current and peak memory, the step time, the
time spent waiting for the next batch, the batch's shape, the loss and how often the train
function was traced. Detectors look at these series and turn what they see into findings,
each with a cause and a fix.

The package:

- `callback`: the `Watch` callback itself (a `keras.callbacks.Callback`; it imports Keras,
  so it is loaded on first use of `memfit.Watch`: `import memfit` stays TensorFlow-free,
  which emulation needs);
- `detectors`: the detectors, pure functions over the recorded series (no TensorFlow), one
  module per family (memory growth, retracing, the budget's edge, input, loss, OOM);
- `fit_checks`: which detectors run after each step and loss of a fit, and what has fired;
- `step_losses`: each step's own loss, derived from the running means Keras logs;
- `sampling`: what is read from TensorFlow after each step (memory, its peak, traces);
- `input_timing`: the train-function wrapper that times the input wait;
- `oom_findings`: the `oom` and `oom_recovery` findings from a diagnosis;
- `header`: a fit's header line (device, budget, configuration);
- `log`: the JSON-lines log format, its writer and reader, and the run summary that
  `memfit report` shares;
- `tensorboard`: the TensorBoard scalars (`Watch(log_dir=...)`);
- `console`: what is printed on the terminal;
- `findings`: `WatchFinding` and the kinds of finding.

Data flows fit -> watch: with `memfit.fit`, the GuardedStep fit installs is read for its
recoveries, traces and peaks (`train_function.guarded_step`).

Example:
    ```python
    watch = memfit.Watch(log_path="run.jsonl")
    model.fit(train_ds, epochs=5, callbacks=[watch])
    ```
"""

from __future__ import annotations

from typing import Any

from memfit.watch.findings import KINDS, WatchFinding
from memfit.watch.log import LOG_FORMAT

__all__ = ["KINDS", "LOG_FORMAT", "Watch", "WatchFinding", "watch_class"]


def watch_class() -> type:
    """`memfit.Watch`, imported on first use (its module imports Keras)."""
    # Here, not at the top: the callback's module imports Keras, and `import memfit` must not
    # (an emulated card is set before TensorFlow initialises).
    from memfit.watch.callback import Watch

    return Watch


def __getattr__(name: str) -> Any:
    if name == "Watch":
        return watch_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
