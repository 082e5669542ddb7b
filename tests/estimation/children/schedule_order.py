"""Child of test_estimate_schedule.py: the order of traces and grappler's passes when what-ifs
are made.
"""

from child import emit

import memfit
from memfit.backend import tf_trace
import factories

events = []
start, result = tf_trace.start_trace, tf_trace.TracedStep.result

def traced(workload, batch_size):
    pending = start(workload, batch_size)
    pending.batch = batch_size
    events.append(("trace", batch_size))
    return pending

def waited(self):
    if not self._done:
        events.append(("grappler", self.batch))
    return result(self)

tf_trace.start_trace, tf_trace.TracedStep.result = traced, waited
model = factories.small_cnn()
plain = memfit.estimate(model, 8, options=memfit.Options(samples=2))
plain_events, events[:] = list(events), []
est = memfit.estimate(model, 8, what_ifs=True, options=memfit.Options(samples=2))
rows = {row["change"]: row.get("peak_bytes") for row in est.what_ifs}
what_if_events = list(events)
fresh = memfit.estimate(model, 16, options=memfit.Options(samples=0)).peak_bytes
emit({
    "plain": plain_events, "events": what_if_events, "peak": est.peak_bytes,
    "plain_peak": plain.peak_bytes, "high": est.high_bytes, "plain_high": plain.high_bytes,
    "rows": rows, "fresh16": fresh, "trace_seconds": est.trace_seconds,
    "run": est.peak_bytes / est.order_peak_bytes,
})
