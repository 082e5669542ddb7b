"""The demo's job: the detector, the generated dataset, and the settings the demo runs at.

`detector`, `samples` and `large_samples` are the specs the demo's commands name
(`memfit.demo:detector`, ...), so each command can be copied and rerun.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from memfit import zoo
from memfit.data import detection_pipeline
from memfit.data.synth import write_dataset
from memfit.errors import MemfitError

# Measured (CPU, TF 2.21, 2 threads): memfit.fit's step at batch 16 peaks near 400 MiB at
# 128 px and near 755-790 MiB at 256 px in 2 micro-batches; plain model.fit's unsplit 256 px
# step peaked at 1012 MiB in a fresh process (1199 MiB in a second fit), so a 1 GiB card
# would be a coin flip: 900 MiB keeps every step clear of its edge by 10% or more.
DEFAULT_MEMORY = "900MiB"
# The job: shards of SMALL x SMALL images, then one shard at LARGE x LARGE, batches of BATCH.
SMALL = 128
LARGE = 256
BATCH = 16
# The effective batch `memfit plan` is asked for: it does not fit unsplit.
TARGET_BATCH = BATCH
MAX_OBJECTS = 6
# Fresh processes whose highest peak the estimate is compared with (one is the data check's).
MEASURED_PROCESSES = 3
# Steps each `memfit measure` of that comparison takes after its warm-up: as many as the
# accuracy benchmark, whose figure the estimate is (a run's peak is its highest step, and
# under two inter-op threads the steps of one process peak up to ~10% apart: with 2 steps a
# process of the quick demo measured 1010-1115 MiB where the estimate said 1219).
MEASURED_STEPS = 5
DATA_ENV = "MEMFIT_DEMO_DATA"


@dataclass
class Settings:
    """What the demo runs at; `quick` is the shortened demo the tests run."""

    memory: str = DEFAULT_MEMORY
    out: str = "memfit-demo"
    quick: bool = False
    small_images: int = 32  # over the small shards
    large_images: int = 16  # in the last shard
    epochs: int = 1
    measured_processes: int = MEASURED_PROCESSES  # the estimate is compared with their highest

    @classmethod
    def make(cls, memory: str | None, out: str | None, quick: bool) -> Settings:
        settings = cls(memory=memory or DEFAULT_MEMORY, out=out or "memfit-demo", quick=quick)
        if quick:
            settings.small_images, settings.large_images = BATCH, BATCH
            # The data check's measurement and one of `memfit measure` (a third RetinaNet
            # process costs the test suite about 30 s of CPU).
            settings.measured_processes = 2
        return settings


# -- the job's model and data (specs for the commands) -----------------------------------------
def detector() -> Any:
    """The demo's detector: keras-hub RetinaNet, ResNet-10 encoder, any input size, Adam."""
    return zoo.retinanet(None)


def data_dir() -> str:
    """The demo dataset's directory (`MEMFIT_DEMO_DATA`)."""
    directory = os.environ.get(DATA_ENV)
    if not directory or not os.path.isdir(directory):
        raise MemfitError(
            f"{DATA_ENV} does not name the demo's dataset directory; run `memfit demo` first, "
            f"then set {DATA_ENV}=<its --out>/data"
        )
    return directory


def shard_files(directory: str) -> tuple[list[str], list[str]]:
    """The dataset's small-image shards and its large-image shard, in file order."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".tfrecord"))
    large = [os.path.join(directory, n) for n in names if n.startswith("new-")]
    small = [os.path.join(directory, n) for n in names if not n.startswith("new-")]
    return small, large


def samples() -> Any:
    """The dataset's samples, unbatched, each at its own resolution (for `--data`)."""
    return job_dataset(data_dir(), batch_size=1).unbatch()


def large_samples() -> Any:
    """The new shard's samples alone, unbatched, at their (twice as large) resolution."""
    return job_dataset(data_dir(), batch_size=1, which="large").unbatch()


def job_dataset(directory: str, batch_size: int = BATCH, which: str = "all") -> Any:
    """The training job's batches: the small shards, then the large shard.

    Args:
        directory: the demo dataset.
        batch_size: images per batch.
        which: `"all"` (native resolutions: yesterday's images, then today's at twice the
            size) or `"large"` (the new shard alone, at its fixed size).
    """

    small, large = shard_files(directory)
    parts = [large] if which == "large" else [small, large]
    size = (LARGE, LARGE) if which == "large" else None
    datasets = [
        detection_pipeline(
            files,
            size,
            batch_size,
            max_objects=MAX_OBJECTS,
            deterministic=True,
        )
        for files in parts
    ]
    dataset = datasets[0]
    for more in datasets[1:]:
        dataset = dataset.concatenate(more)
    return dataset


def write_data(directory: str, settings: Settings) -> dict[str, Any]:
    """Generate the dataset: small-image shards, then a shard at twice the resolution."""

    small = write_dataset(
        directory,
        count=settings.small_images,
        shards=2,
        image_size=(SMALL, SMALL),
        max_objects=MAX_OBJECTS,
        prefix="train",
    )
    large = write_dataset(
        directory,
        count=settings.large_images,
        shards=1,
        image_size=(LARGE, LARGE),
        max_objects=MAX_OBJECTS,
        prefix="new",
        seed=1,
    )
    return {"small_shards": small, "large_shard": large}
