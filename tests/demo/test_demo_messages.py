"""The demo's "plain model.fit" step shows a real error as one clean line."""

from __future__ import annotations

from pathlib import Path

from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"

CODE = CHILDREN / "demo_messages.py"


def test_plain_fit_errors_are_one_line_without_the_graph_traceback() -> None:
    out = run_isolated(CODE, env={"MEMFIT_MEMORY": "128MiB"})
    line, raw = out["oom"]
    assert "Detected at node" in raw and 'File "' in raw  # what the demo used to cut off
    assert line.startswith("OOM when allocating tensor with shape[32,256,256,64]"), line
    assert "\n" not in line and "Detected at node" not in line and 'File "' not in line
    line, raw = out["graph"]
    assert "\n" not in line and "Detected at node" not in line and 'File "' not in line
    assert "reshape" in line.lower() and len(line) > 20, line
    line, raw = out["layer"]
    assert line == (
        "Exception encountered when calling Anchors.call(): must be real number, "
        "not SymbolicTensor"
    ), line
