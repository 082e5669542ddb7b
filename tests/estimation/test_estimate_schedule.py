"""memfit.estimate with what-ifs: the next step is traced while grappler works on this one."""

from __future__ import annotations

import os

from helpers import run_isolated

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
what_if_events = list(events)
fresh = memfit.estimate(model, 16, samples=0).peak_bytes
emit({
    "plain": plain_events, "events": what_if_events, "peak": est.peak_bytes,
    "plain_peak": plain.peak_bytes, "high": est.high_bytes, "plain_high": plain.high_bytes,
    "rows": rows, "fresh16": fresh, "trace_seconds": est.trace_seconds,
    "run": est.peak_bytes / est.order_peak_bytes,
})
"""


def test_the_next_step_is_traced_before_waiting_for_grappler_and_twice_the_batch_is_not():
    results = run_isolated(ORDER, env={"PYTHONPATH": TESTS})
    assert results["plain"] == [["trace", 8], ["grappler", 8]]
    events = [tuple(event) for event in results["events"]]
    # The recompute what-if is traced while grappler works on the base step; twice the
    # batch, half of it and the largest batch's probes are the base trace sized again: the
    # what-ifs trace no other batch size.
    assert events[:3] == [("trace", 8), ("trace", 8), ("grappler", 8)]
    assert {batch for kind, batch in events if kind == "trace"} == {8}
    # The order changes no figure: the base step is the one estimated alone.
    assert results["peak"] == results["plain_peak"]
    assert results["high"] == results["plain_high"]
    # Sized again: the same step (a row is its likely order's peak times the base step's
    # highest replayed step over its likely order's).
    assert results["rows"]["batch size 16"] == int(results["fresh16"] * results["run"])
    assert results["trace_seconds"] > 0
