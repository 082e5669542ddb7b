"""The audit's timing: how fast a pipeline yields elements (in this process, and on tf.data
service workers), and the image shapes it yields."""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from memfit.data.audit_result import AuditResult
from memfit.data.enlargement import count_image_shape
from memfit.data.service import DataService, python_ops_in


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


def time_service(
    tf: Any, dataset: Any, steps: int, workers: Sequence[int], result: AuditResult
) -> None:
    """Time `steps` elements read from 1, 2, ... local tf.data service workers.

    Sets `service_rates` (workers -> elements/s; 0 is this process, as timed by
    `time_pipeline`) and `service_workers`: the fewest workers that reach the target rate, or
    without one, that come within 10% of the fastest.
    """
    rates: dict[int, float] = {}
    if 0 in workers and result.elements_per_second is not None:
        rates[0] = result.elements_per_second
    counts = sorted({int(n) for n in workers if int(n) > 0})
    if counts and python_ops_in(dataset):
        result.service_note = (
            "not timed on tf.data service workers: the pipeline calls Python "
            "(tf.py_function, from_generator), which a worker process cannot run"
        )
        counts = []
    source = dataset.repeat()  # the workers share an endless stream: every count reads `steps`
    for count in counts:
        with DataService(workers=count, verbose=False) as service:
            iterator = iter(service.serve(source))
            next(iterator)  # the workers' start-up and first fill are not the rate
            start = time.perf_counter()
            for _ in range(steps):
                next(iterator)
            rates[count] = steps / max(time.perf_counter() - start, 1e-9)
            del iterator
            gc.collect()  # the reader ends before the service (else it calls a gone dispatcher)
    result.service_rates = rates
    if not rates:
        return
    target = result.target_steps_per_second
    reaching = [n for n in sorted(rates) if target and rates[n] >= target]
    if target:
        result.service_workers = reaching[0] if reaching else None
    else:
        best = max(rates.values())
        result.service_workers = min(n for n in rates if rates[n] >= 0.9 * best)
