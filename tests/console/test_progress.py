"""memfit.console.progress: the analyses show what they do in Python, as the CLI does."""

from __future__ import annotations

import inspect
import warnings

import pytest

import memfit
from memfit.checks import keyword_only
from memfit.console.progress import candidate_line, shows_progress, trial_line
from memfit.errors import MemfitError


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


def test_public_entry_points_take_progress_and_budget_by_name():
    for function in (memfit.measure, memfit.estimate, memfit.find_batch_size, memfit.plan):
        parameters = inspect.signature(function).parameters
        assert parameters["progress"].default is None
        assert parameters["budget"].kind is inspect.Parameter.KEYWORD_ONLY
        assert "progress:" in function.__doc__


@shows_progress("on_progress", lambda a: f"estimating batch {a['batch_size']}", "phase")
def _phases(batch_size, *, on_progress=None, progress=None):
    """Stands for estimate: reports its phases as texts."""
    for text in ("tracing the step", "the high bound"):
        if on_progress is not None:
            on_progress(text)
    return batch_size


def test_phases_replace_the_spinner_text_and_reach_a_callable(capsys):
    got = []
    assert _phases(8, progress=got.append) == 8
    assert got == ["tracing the step", "the high bound"]
    assert _phases(8, progress=True) == 8
    err = capsys.readouterr().err
    assert "memfit: estimating batch 8" in err and "memfit: done in" in err
    assert "tracing the step" not in err  # a phase is the spinner's text, not a line


@shows_progress("on_trial", lambda a: "searching", "trial", deprecated=True)
def _old_search(model, *, on_trial=None, progress=None):
    return _search(model, on_trial=on_trial, progress=False)


def test_the_old_callbacks_still_work_with_a_deprecation_warning():
    seen = []
    with pytest.warns(DeprecationWarning, match=r"on_trial=\.\.\.\) is deprecated.*progress="):
        _old_search("m", on_trial=seen.append)
    assert [t.batch_size for t in seen] == [4, 8]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _old_search("m", progress=seen.append)  # the new spelling: no warning


def test_a_budget_given_by_position_still_works_with_a_deprecation_warning():
    @keyword_only("budget")
    def search(model, *, budget=None, margin=0.05):
        return model, budget, margin

    with pytest.warns(DeprecationWarning, match="pass budget= by name"):
        assert search("m", "1GiB") == ("m", "1GiB", 0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert search("m", budget="T4", margin=0.1) == ("m", "T4", 0.1)
    with pytest.raises(TypeError, match="multiple values for argument 'budget'"):
        search("m", "1GiB", budget="T4")
    with pytest.raises(TypeError, match="takes 1 positional arguments but 3 were given"):
        search("m", "1GiB", 0.1)
    # The real entry points keep the old order.
    with pytest.warns(DeprecationWarning), pytest.raises(MemfitError):
        memfit.find_batch_size(object(), "1GiB", options=memfit.Options(isolated=True))


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
