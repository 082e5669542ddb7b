"""memfit.estimate with what-ifs: the next step is traced while grappler works on this one."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ORDER = CHILDREN / "schedule_order.py"


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
