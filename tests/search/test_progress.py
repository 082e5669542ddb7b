"""memfit.search.progress: find_batch_size and plan show what they do in Python, as the CLI does."""

from __future__ import annotations

import inspect

import memfit
from memfit.search.progress import candidate_line, shows_progress, trial_line


def _trial(size: int, fits: bool) -> memfit.Trial:
    return memfit.Trial(size, oom=not fits, peak_bytes=size * 2**20, seconds=0.5, fits=fits)


@shows_progress("on_trial", lambda a: f"searching {a['model']}", "trial")
def _search(model, *, on_trial=None, progress=None):
    """Stands for find_batch_size: reports two trials through its callback."""
    assert progress is False  # the decorator handled it
    for trial in (_trial(4, True), _trial(8, False)):
        if on_trial is not None:
            on_trial(trial)
    return model


def test_progress_true_prints_a_line_per_event(capsys):
    assert _search("m", progress=True) == "m"
    err = capsys.readouterr().err
    assert "memfit: searching m" in err
    assert "trial      4: fits  peak 4.00 MiB" in err
    assert "trial      8: out of memory" in err
    assert "memfit: done in" in err


def test_progress_off_by_default_when_not_a_terminal_or_with_a_callback(capsys):
    seen = []
    _search("m")  # pytest's stderr is not a terminal
    _search("m", progress=False)
    _search("m", on_trial=seen.append, progress=None)
    assert capsys.readouterr().err == ""
    assert [t.batch_size for t in seen] == [4, 8]


def test_progress_callable_receives_the_events_and_the_callback_still_runs(capsys):
    got, own = [], []
    _search("m", on_trial=own.append, progress=got.append)
    assert [t.batch_size for t in got] == [4, 8] == [t.batch_size for t in own]
    assert capsys.readouterr().err == ""


def test_public_entry_points_take_progress():
    for function in (memfit.find_batch_size, memfit.plan):
        parameter = inspect.signature(function).parameters["progress"]
        assert parameter.default is None
        assert "progress:" in function.__doc__


def test_lines_read_like_the_cli():
    line = trial_line(memfit.Trial(16, oom=False, peak_bytes=2**28, seconds=1.5, fits=True))
    assert line == "trial     16: [green]fits[/]  peak 256.00 MiB  1.5 s"
    soak = memfit.Trial(
        12, oom=False, peak_bytes=2**28, seconds=9.0, fits=True, steps=21, soak=True
    )
    assert "(over 21 steps)" in trial_line(soak)
    c = memfit.Candidate("float32", None, 2, 8, predicted_peak_bytes=2**28)
    assert candidate_line(c).startswith("estimated  float32")
    assert "K=2" in candidate_line(c) and "peak 256.00 MiB" in candidate_line(c)
