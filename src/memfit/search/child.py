"""The batch search's side of a child process: how many samples a user's dataset yields.
"""

from __future__ import annotations

from typing import Any

from memfit.workload.models import call_factory
from memfit.workload.workload import count_samples


def dataset_size(spec: str) -> int | None:
    """Number of samples a `package.module:dataset_fn` dataset yields, or None when it repeats
    for ever or is longer than `SAMPLES_READ` of unknown length (`workload.count_samples`: a
    bounded read, never element by element through an infinite dataset)."""
    return count_samples(load_dataset(spec))


def load_dataset(spec: str) -> Any:
    """Call a `package.module:dataset_fn` that returns a tf.data.Dataset of (x, y) samples."""
    return call_factory(spec)
