"""memfit.estimate with what-ifs: the next step is traced while grappler works on this one."""

from __future__ import annotations

import os

from helpers import run_isolated

TESTS = os.path.dirname(__file__)

ORDER = """
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
plain = memfit.estimate(model, 8, samples=2)
plain_events, events[:] = list(events), []
est = memfit.estimate(model, 8, what_ifs=True, samples=2)
rows = {row["change"]: row.get("peak_bytes") for row in est.what_ifs}
fresh = memfit.estimate(model, 16, samples=0).peak_bytes
emit({
    "plain": plain_events, "events": events, "peak": est.peak_bytes,
    "plain_peak": plain.peak_bytes, "high": est.high_bytes, "plain_high": plain.high_bytes,
    "rows": rows, "fresh16": fresh, "trace_seconds": est.trace_seconds,
})
"""


def test_the_doubled_step_is_traced_before_waiting_for_the_base_steps_grappler():
    results = run_isolated(ORDER, env={"PYTHONPATH": TESTS})
    assert results["plain"] == [["trace", 8], ["grappler", 8]]
    events = [tuple(event) for event in results["events"]]
    assert events[:3] == [("trace", 8), ("trace", 16), ("grappler", 8)]
    assert ("grappler", 16) in events[3:]
    # The order changes no figure: the base step is the one estimated alone.
    assert results["peak"] == results["plain_peak"]
    assert results["high"] == results["plain_high"]
    assert results["rows"]["batch size 16"] == results["fresh16"]  # traced early, same step
    assert results["trace_seconds"] > 0
