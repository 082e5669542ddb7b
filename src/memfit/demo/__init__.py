"""Demo: the whole memfit story on a real detector, as a user meets it.

`memfit demo` (and `make demo`) trains a keras-hub RetinaNet with a ResNet-10 encoder, built
from config with random weights, on a generated OD-API TFRecord dataset whose last shard holds
images at twice the resolution — the job that trained yesterday and dies today — under an
emulated card. Each step runs the `memfit` command or API a user would run, in its own process
(an emulated budget is set before TensorFlow starts), narrates what it shows, and checks it:
the demo exits non-zero when a step does not show what it claims.

The job's model and data are importable specs, so each command can be copied and rerun:
`memfit.demo:detector` (the RetinaNet, any input size) and `memfit.demo:samples` (the
dataset's samples, unbatched, at their own resolution; the directory comes from
`MEMFIT_DEMO_DATA`).

The package: `job` (the model, the dataset and the settings), `training` (the child side of
the two training steps), `checks` (each step's run and the check of its claim), `runner` (runs
the steps in order), `render` (the narration), `results` (what each step showed).
"""

from memfit.demo.job import (
    BATCH,
    DATA_ENV,
    DEFAULT_MEMORY,
    LARGE,
    MAX_OBJECTS,
    MEASURED_PROCESSES,
    SMALL,
    TARGET_BATCH,
    Settings,
    data_dir,
    detector,
    job_dataset,
    large_samples,
    samples,
    shard_files,
    write_data,
)
from memfit.demo.results import DemoResult, StepResult
from memfit.demo.runner import Demo, run_demo
from memfit.demo.training import first_line, train_memfit, train_plain

__all__ = [
    "BATCH",
    "DATA_ENV",
    "DEFAULT_MEMORY",
    "LARGE",
    "MAX_OBJECTS",
    "MEASURED_PROCESSES",
    "SMALL",
    "TARGET_BATCH",
    "Demo",
    "DemoResult",
    "Settings",
    "StepResult",
    "data_dir",
    "detector",
    "first_line",
    "job_dataset",
    "large_samples",
    "run_demo",
    "samples",
    "shard_files",
    "train_memfit",
    "train_plain",
    "write_data",
]
