"""Per-step losses of a fit, derived in step order from the running means Keras logs.

Keras passes `on_train_batch_end` the epoch's running mean of the loss, not the step's own
loss, and may call it from a thread pool, so the means can arrive out of order.
`StepLosses` keeps them until every earlier step's mean has arrived, then turns each into
that step's own loss: `((b + 1) * mean_b - (a + 1) * mean_a) / (b - a)` between the batch
`a` seen before and this batch `b` (with `steps_per_execution` > 1, `b - a` batches at
once). No TensorFlow here.

Example:
    ```python
    losses = StepLosses(steps_per_execution=1)
    losses.add(step=0, epoch=0, batch=0, mean=2.0)
    losses.add(step=1, epoch=0, batch=1, mean=1.5)
    for step, loss, epoch in losses.process(final=False):
        print(step, loss)  # 0 2.0, then 1 1.0
    ```
"""

from __future__ import annotations

import math


class StepLosses:
    """The losses of one fit's steps, from the running means Keras logs (not thread-safe).

    Args:
        steps_per_execution: the batches Keras runs per call of its train function (its
            logs come once per group of that many).

    Attributes:
        losses: step -> that step's own loss, for the steps processed so far.
    """

    def __init__(self, steps_per_execution: int = 1) -> None:
        self.steps_per_execution = steps_per_execution
        self.losses: dict[int, float] = {}
        self._pending: dict[int, tuple[int, int, float]] = {}  # step -> (epoch, batch, mean)
        self._last_mean: tuple[int, int, float] | None = None

    def add(self, step: int, epoch: int, batch: int, mean: float) -> None:
        """Keep the running mean Keras logged after `batch` of `epoch` (the fit's `step`)."""
        self._pending[step] = (epoch, batch, mean)

    def get(self, step: int) -> float | None:
        """The loss of `step`, or None when it has not been processed (yet)."""
        return self.losses.get(step)

    def process(self, final: bool) -> list[tuple[int, float, int]]:
        """Turn the running means kept so far into per-step losses, in step order.

        Stops at the first step whose predecessor's mean has not arrived yet, unless `final`
        (Keras has run every `on_train_batch_end` of the epoch): then a gap gives `nan`.

        Args:
            final: process every kept mean, waiting for none.

        Returns:
            `(step, loss, epoch)` for each step processed by this call, in step order.
        """
        spe = self.steps_per_execution
        done: list[tuple[int, float, int]] = []
        for step in sorted(self._pending):
            epoch, batch, mean = self._pending[step]
            last = self._last_mean
            # After the batch seen before in this epoch, or the first batch (group) of one.
            expected = last[1] + spe if last is not None and last[0] == epoch else spe - 1
            if batch != expected and not final:
                break  # an earlier step's logs have not arrived yet
            del self._pending[step]
            if last is not None and last[0] == epoch and batch > last[1]:
                loss = ((batch + 1) * mean - (last[1] + 1) * last[2]) / (batch - last[1])
            else:
                loss = mean if batch == expected else math.nan
            if not math.isfinite(mean):
                loss = mean
            self._last_mean = (epoch, batch, mean)
            self.losses[step] = loss
            done.append((step, loss, epoch))
        return done
