"""Audit a tf.data pipeline: static lint of its graph, measured throughput, a fix per finding.

The lint reads the dataset's graph (the ops `tf.data` builds, and the functions its `map`s
run) and names what makes input pipelines slow or fragile:

- `map_not_parallel`: `map` without `num_parallel_calls`.
- `no_prefetch`: the last transformation is not `prefetch`.
- `batch_before_map`: an expensive per-image map (decode, resize, Python) after `batch`.
- `large_tensor_slices`: `from_tensor_slices` of a large in-memory array.
- `missing_cache`: files small enough for memory, read and decoded again every epoch.
- `interleave_not_parallel`: `interleave` without `num_parallel_calls`.
- `serial_file_reads`: `TFRecordDataset` over several files, read one after another.
- `no_error_policy` (info): files decoded with no decision about bad records.
- `input_bound`: measured elements/s below a target step rate.
- `map_enlarges_images`: the elements' images have at least 1.5x the pixels of the largest
  stored one (read from the TFRecords the pipeline reads) and a map scales them by a size it
  computes (an augmentation that doubles the resolution quadruples the step's activations);
  with a model, what that costs a step. Resizing (and padding) images of several sizes to
  one input size is what a model needs, and is not flagged.

Each finding carries its fix. When timed, the result also lists the image shapes the
pipeline produces next to the stored images' sizes.

This module runs the audit; its parts live beside it: `lint` (the rules, over the graph that
`dataset_graph` reads), `throughput` (the timing), `enlargement` (produced against stored image
sizes) and `audit_result` (what it reports).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from memfit.backend import tf as tfb
from memfit.data.audit_result import AuditFinding, AuditResult
from memfit.data.dataset_graph import read_files
from memfit.data.enlargement import ENLARGE_FACTOR, STORED_RECORDS, check_enlarged, stored_sizes
from memfit.data.lint import CACHE_BYTES, LARGE_SLICES_BYTES, lint
from memfit.data.throughput import time_pipeline, time_service
from memfit.errors import DataError

__all__ = [
    "CACHE_BYTES",
    "ENLARGE_FACTOR",
    "LARGE_SLICES_BYTES",
    "STORED_RECORDS",
    "AuditFinding",
    "AuditResult",
    "audit",
    "stored_sizes",
]


def audit(
    dataset: Any,
    steps: int = 50,
    target_steps_per_second: float | None = None,
    *,
    large_bytes: int = LARGE_SLICES_BYTES,
    cache_bytes: int = CACHE_BYTES,
    model: Any = None,
    workers: Sequence[int] = (),
) -> AuditResult:
    """Lint a `tf.data.Dataset`'s graph and measure how fast it yields elements.

    Args:
        dataset: the pipeline as the model will consume it (batched, if it batches).
        steps: elements to time after the first (0: lint only).
        target_steps_per_second: the training step rate the pipeline must keep up with
            (e.g. from `memfit measure`'s step time); a slower pipeline is `input_bound`.
        large_bytes: `from_tensor_slices` constants above this are `large_tensor_slices`.
        cache_bytes: files read from disk totalling less than this should be cached.
        model: a Keras model or MODEL spec (`package.module:factory`, a `.keras` file): when
            a map enlarges images, a training step is measured (in a child process) at the
            produced and at the stored size, to say what the enlargement costs.
        workers: also time the pipeline read from this many local tf.data service workers
            (each count in fresh worker processes; 0 is this process), and say how many
            reach `target_steps_per_second` (see `memfit.fit(..., data_service=N)`).

    Returns:
        An `AuditResult`; `result.ok` is False when a finding is a warning.

    Example:
        ```python
        result = memfit.data.audit(make_dataset(), steps=20)
        for finding in result.findings:
            print(finding.kind, finding.fix)
        ```
    """
    tf = tfb.import_tf()
    if not isinstance(dataset, tf.data.Dataset):
        raise DataError(
            f"audit takes a tf.data.Dataset, got {type(dataset).__name__}; a dataset_fn must "
            f"return the pipeline as training consumes it"
        )
    if steps < 0:
        raise DataError(f"steps must be 0 or more, got {steps}")
    graph = tfb.dataset_graph(dataset)
    result = AuditResult(target_steps_per_second=target_steps_per_second)
    result.findings, result.ops = lint(graph, large_bytes, cache_bytes)
    if any(int(n) < 0 for n in workers):
        raise DataError(f"workers must be 0 or more, got {list(workers)}")
    if steps:
        time_pipeline(tf, dataset, steps, result)
        if workers:
            time_service(tf, dataset, steps, workers, result)
        nodes = {n.name: n for n in graph.node}
        files = [f for f in read_files(graph, nodes) if os.path.isfile(f)]
        if files and result.element_shapes:
            result.stored_sizes = stored_sizes(files)
            check_enlarged(graph, result, model)
        if (
            target_steps_per_second
            and result.elements_per_second is not None
            and result.elements_per_second < target_steps_per_second
        ):
            others = [f.kind for f in result.findings if f.severity == "warning"]
            result.findings.append(
                AuditFinding(
                    "input_bound",
                    "",
                    f"the pipeline yields {result.elements_per_second:.1f} elements/s, below "
                    f"the target {target_steps_per_second:g} steps/s: training would wait for "
                    f"input",
                    "fix the findings above ("
                    + (", ".join(others) if others else "none found")
                    + "); then parallelise further (more files, num_parallel_calls), move "
                    "work to the accelerator, or lower the resolution"
                    + _service_fix(result),
                )
            )
    return result


def _service_fix(result: AuditResult) -> str:
    """The input-bound fix's clause on tf.data service workers, from what was timed."""
    if result.service_workers:
        return (
            f"; or read it from {result.service_workers} tf.data service workers "
            f"(`memfit.fit(..., data_service={result.service_workers})`: "
            f"{result.service_rates[result.service_workers]:.1f} elements/s measured)"
        )
    if result.service_rates:
        return "; the tf.data service workers timed do not reach it either"
    return "; or time it on tf.data service workers (`--workers 1,2,4`)"
