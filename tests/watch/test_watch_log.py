"""memfit.watch.log: the writer appends a run per fit, the reader splits them; bad logs."""

from __future__ import annotations

import pytest

from memfit.errors import MemfitError
from memfit.watch.log import LOG_FORMAT, TOOL, LogWriter, read_log, summarize


def _header(run: int) -> dict:
    return {"type": "header", "tool": TOOL, "format": LOG_FORMAT, "run": run, "name": f"r{run}"}


def _step(step: int, peak: int) -> dict:
    return {
        "type": "step",
        "step": step,
        "step_seconds": 0.01 * (10 if step == 0 else 1),
        "input_wait_seconds": 0.002,
        "memory_peak_bytes": peak,
    }


def test_two_runs_written_with_append_read_back_as_two(tmp_path) -> None:
    path = str(tmp_path / "run.jsonl")
    for run, append in ((0, False), (1, True)):
        writer = LogWriter(path, append=append)
        writer.write(_header(run))
        for step in range(8):
            writer.write(_step(step, 100 * (run + 1) + step))
        writer.write({"type": "finding", "kind": "near_budget", "step": 3})
        writer.write({"type": "end", "steps": 8})
        writer.close()
    runs = read_log(path)
    assert [r.name for r in runs] == ["r0", "r1"] and [r.index for r in runs] == [0, 1]
    assert [len(r.steps) for r in runs] == [8, 8] and all(r.end for r in runs)
    assert runs[1].summary()["peak_bytes"] == 207 and runs[1].summary()["run"] == 1
    # A first Watch run starts the file anew.
    LogWriter(path).close()
    assert (tmp_path / "run.jsonl").read_text() == ""


def test_summary_leaves_out_warm_up_steps() -> None:
    steps = [_step(i, 10) for i in range(8)]
    totals = summarize(steps, warmup_steps=1)
    assert totals["mean_step_seconds"] == pytest.approx(0.01)
    assert totals["input_wait_fraction"] == pytest.approx(0.2)
    assert summarize(steps[:1], warmup_steps=5)["mean_step_seconds"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (['{"type": "step", "step": 0}'], "header line is missing"),
        (['{"type": "header", "tool": "other"}'], "not memfit.watch"),
        ([f'{{"type": "header", "tool": "{TOOL}", "format": 99}}'], "newer memfit"),
        ([f'{{"type": "header", "tool": "{TOOL}"}}', '{"type": "step"}'], "without a step"),
    ],
)
def test_bad_logs_say_what_is_wrong(tmp_path, lines: list[str], expected: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(MemfitError, match=expected):
        read_log(str(path))


def test_a_log_in_a_missing_folder_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(MemfitError, match="does not exist; create it"):
        LogWriter(str(tmp_path / "no" / "run.jsonl"))
