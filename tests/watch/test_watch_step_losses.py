"""StepLosses: each step's own loss from Keras' running means, in step order."""

from __future__ import annotations

import math

from memfit.watch.step_losses import StepLosses


def test_losses_from_running_means_in_step_order() -> None:
    losses = StepLosses()
    losses.add(step=1, epoch=0, batch=1, mean=1.5)  # arrives before step 0's mean
    assert losses.process(final=False) == []
    losses.add(step=0, epoch=0, batch=0, mean=2.0)
    assert losses.process(final=False) == [(0, 2.0, 0), (1, 1.0, 0)]
    losses.add(step=2, epoch=1, batch=0, mean=0.5)  # a new epoch restarts the mean
    assert losses.process(final=False) == [(2, 0.5, 1)]
    assert losses.get(1) == 1.0 and losses.get(3) is None


def test_a_gap_gives_nan_only_when_final() -> None:
    losses = StepLosses()
    losses.add(step=1, epoch=0, batch=1, mean=1.5)
    assert losses.process(final=False) == []
    [(step, loss, epoch)] = losses.process(final=True)
    assert (step, epoch) == (1, 0) and math.isnan(loss)


def test_steps_per_execution_groups() -> None:
    losses = StepLosses(steps_per_execution=2)
    losses.add(step=1, epoch=0, batch=1, mean=2.0)
    losses.add(step=3, epoch=0, batch=3, mean=1.5)
    assert losses.process(final=False) == [(1, 2.0, 0), (3, 1.0, 0)]
