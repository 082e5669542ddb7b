"""How exact K micro-batches are: a classifier's loss sums over samples, detectors' do not.

`AccumulatingStep` weights each micro-batch's mean loss by its share of the batch. For a loss
that is a mean over samples the summed gradient is the whole batch's (float rounding). The
detectors people train normalise by something counted over the batch (RetinaNet: positive
anchors; YOLO: the assigned target scores; D-FINE: the boxes, and batch-coupled matching
terms), and their BatchNorm layers see micro-batch statistics: K micro-batches then train a
different (not wrong) objective. These tests pin both facts with the figures docs/fit.md gives.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(os.path.dirname(TESTS), "src")
ENV = {"PYTHONPATH": os.pathsep.join([SRC, TESTS])}

# The children (children/*_gradients.py) compare the gradient of K=2 with K=1's (the full
# batch): ||g2 - g1|| / ||g1|| over all variables; children/detector_losses.py a batch's loss
# with the mean of its two halves' (BatchNorm frozen: no batch statistics).


def test_a_classifier_s_micro_batches_give_the_full_batch_gradient() -> None:
    """Mean cross-entropy over samples: K=2 and K=1 agree to float32 rounding."""
    result = run_isolated(
        CHILDREN / "classifier_gradients.py",
        env=ENV,
    )
    assert result < 1e-5, result


@pytest.mark.slow
def test_yolo_micro_batches_train_a_different_objective() -> None:
    """kyolo's loss divides by the batch's target-score sum: K=2 differs even without BN."""
    pytest.importorskip("kyolo")
    result = run_isolated(
        CHILDREN / "yolo_gradients.py",
        env=ENV,
    )
    # Measured: 0.25 with BatchNorm frozen (the normaliser alone), 2.3 with it training
    # (max over variables; these are over all variables at once).
    assert 0.02 < result["frozen"] < 1.0, result
    assert result["live"] > result["frozen"], result


@pytest.mark.slow
def test_detector_losses_are_not_sums_over_images() -> None:
    """RetinaNet, D-FINE and YOLO: a batch's loss is not the mean of its halves' losses."""
    pytest.importorskip("keras_hub")
    result = run_isolated(
        CHILDREN / "detector_losses.py",
        env=ENV,
    )
    # Measured (BatchNorm frozen, seed 0): RetinaNet 14%, D-FINE 5.7%, YOLO 1.7%.
    assert result["retinanet"] > 0.03, result
    assert result["d_fine"] > 0.01, result
    if "yolo" in result:
        assert result["yolo"] > 0.003, result
