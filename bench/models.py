"""Zero-argument model and dataset factories the benchmarks hand to child processes."""

from __future__ import annotations

from typing import Any

from memfit import zoo

RETINANET_IMAGE = 192


def retinanet() -> Any:
    """keras-hub RetinaNet, ResNet-10 encoder, 192x192 inputs, Adam."""
    return zoo.retinanet(RETINANET_IMAGE)


def detection_samples() -> Any:
    """256 synthetic 192x192 detection samples with 16 boxes each, for the RetinaNet."""
    return zoo.detection_samples(256, RETINANET_IMAGE)
