"""memfit.data: check detection datasets, audit tf.data pipelines, a detection input pipeline.

- `check(paths, schema="od-api", label_map=None, model=None, batch_size=8)`: every bad
  record of TFRecord files (file and index), resolution and objects-per-image histograms, the
  largest images and what they mean for memory. `CheckResult`, `Problem`.
- `audit(dataset, steps=50, target_steps_per_second=None)`: static lint of a tf.data graph
  plus measured throughput, each finding with its fix. `AuditResult`, `AuditFinding`.
- `detection_pipeline(files, image_size, batch_size, ...)`: OD-API TFRecords to batches of
  `(images, {"boxes", "labels"})` for keras-hub's RetinaNet.
- `DataService(address=None, workers=1)`: run a tf.data pipeline on tf.data service workers
  (local processes or a dispatcher's), off the trainer and off an emulated card.
- `write_dataset(...)`: synthetic OD-API TFRecords for tests and demos.

TensorFlow is imported only when one of these runs.
"""

from __future__ import annotations

from memfit.data.audit import AuditFinding, AuditResult, audit
from memfit.data.check import CheckResult, ImageInfo, Problem, check
from memfit.data.pipeline import detection_pipeline
from memfit.data.records import read_records
from memfit.data.schema import load_label_map
from memfit.data.service import DataService
from memfit.data.synth import write_dataset, write_label_map

__all__ = [
    "AuditFinding",
    "AuditResult",
    "CheckResult",
    "DataService",
    "ImageInfo",
    "Problem",
    "audit",
    "check",
    "detection_pipeline",
    "load_label_map",
    "read_records",
    "write_dataset",
    "write_label_map",
]
