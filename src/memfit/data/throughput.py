"""The audit's timing: how fast a pipeline yields elements, and the image shapes it yields."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from memfit.data.audit_result import AuditResult
from memfit.data.enlargement import count_image_shape


def time_pipeline(tf: Any, dataset: Any, steps: int, result: AuditResult) -> None:
    """Time `steps` elements after the first; record the rates and image shapes in `result`.

    Sets `first_element_seconds`, `batch_size` (when the pipeline batches), `steps`,
    `elements_per_second`, `samples_per_second` and `element_shapes`.
    """
    iterator = iter(dataset)
    start = time.perf_counter()
    try:
        first = next(iterator)
    except StopIteration:
        result.first_element_seconds = time.perf_counter() - start
        return
    result.first_element_seconds = time.perf_counter() - start
    leaves = tf.nest.flatten(first)
    batched = any(f.endswith("batch") for f in result.ops)
    if batched and leaves and leaves[0].shape.rank:
        result.batch_size = int(leaves[0].shape[0])
    shapes: Counter[tuple[int | None, ...]] = Counter()
    count_image_shape(tf, first, batched, shapes)
    count = 0
    start = time.perf_counter()
    for _ in range(steps):
        try:
            element = next(iterator)
        except StopIteration:
            break
        count_image_shape(tf, element, batched, shapes)
        count += 1
    elapsed = time.perf_counter() - start
    result.element_shapes = [list(shape) for shape, _ in shapes.most_common(10)]
    result.steps = count
    if count and elapsed > 0:
        result.elements_per_second = count / elapsed
        result.samples_per_second = result.elements_per_second * (result.batch_size or 1)
