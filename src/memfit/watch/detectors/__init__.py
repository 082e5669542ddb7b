"""Detectors: pure functions over the series `memfit.Watch` records.

Nothing here imports TensorFlow: every detector takes plain numbers (the step records that
`Watch` writes to its log, a list of losses) and returns a `WatchFinding` or `None`, so each
one can be tested on synthetic series and rerun on a log.

A step record is a dict with the keys of a log's step line: `step`, `step_seconds`,
`input_wait_seconds`, `memory_current_bytes` (in use after the step), `memory_peak_bytes`
(the step's peak), `traces`, `batch_size` and `input_shape` (the first input's shape).

The package, one module a family of detectors, all names re-exported here:

- `stats`: the robust statistics they share (median, MAD spread, Theil-Sen slope,
  Mann-Kendall trend) and a shape's text;
- `growth`: memory left in use after each step rising (`Floors`, `memory_growth`), and
  memory at the start of repeated fits rising (`repeated_fits`);
- `tracing`: the train function traced again after warm-up (`retracing`);
- `budget_edge`: a peak near the budget or trending to it (`near_budget`), and slow steps at
  its edge (`thrashing`);
- `input_pipeline`: waiting for the next batch (`input_bound`);
- `loss`: divergence and non-finite losses (`LossMonitor`);
- `oom`: why a step ran out of memory and the fix in numbers (`diagnose_oom`).

Noise: thresholds compare a change with the series' own spread, measured robustly as the
median absolute deviation (MAD, scaled by 1.4826 to match a standard deviation for normal
noise), so a noisy but healthy run stays quiet and a clean run's real change is still found.

Example:
    ```python
    from memfit.watch import detectors

    monitor = detectors.LossMonitor()
    for step, loss in enumerate(losses):
        finding = monitor.add(step, loss)
        if finding is not None:
            print(finding.message)
    ```
"""

from __future__ import annotations

from memfit.watch.detectors.budget_edge import near_budget, thrashing
from memfit.watch.detectors.growth import Floors, memory_growth, repeated_fits
from memfit.watch.detectors.input_pipeline import MIN_INPUT_WAIT_SECONDS, input_bound
from memfit.watch.detectors.loss import LossMonitor
from memfit.watch.detectors.oom import OomDiagnosis, diagnose_oom
from memfit.watch.detectors.stats import (
    MAD_SCALE,
    mann_kendall,
    median,
    robust_spread,
    shape_text,
    theil_sen,
)
from memfit.watch.detectors.tracing import retrace_cause, retrace_fix, retracing

__all__ = [
    "MAD_SCALE",
    "MIN_INPUT_WAIT_SECONDS",
    "Floors",
    "LossMonitor",
    "OomDiagnosis",
    "diagnose_oom",
    "input_bound",
    "mann_kendall",
    "median",
    "memory_growth",
    "near_budget",
    "repeated_fits",
    "retrace_cause",
    "retrace_fix",
    "retracing",
    "robust_spread",
    "shape_text",
    "theil_sen",
    "thrashing",
]
