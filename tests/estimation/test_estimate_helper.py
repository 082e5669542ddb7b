"""memfit.estimation.helper: a second process takes what-ifs from the estimate's queue."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import whatif_handlers
from helpers import run_isolated

from memfit.estimation.helper import WhatIfQueue

CHILDREN = Path(__file__).resolve().parent / "children"

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = [(f"what-if {i}", {"index": i}) for i in range(4)]


def _drain(queue: WhatIfQueue) -> tuple[list[str], dict[str, dict]]:
    """Make here what the queue gives back, as `memfit.estimate` does; then its child's rows."""
    here = []
    while (task := queue.take() or queue.wait()) is not None:
        here.append(task[0])
    return here, queue.finish()


def _until(condition, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the child never took a what-if"
        time.sleep(0.05)


@pytest.fixture
def handlers_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))


def test_each_what_if_is_made_once_here_or_in_the_child(handlers_importable: None) -> None:
    queue = WhatIfQueue({}, handler=whatif_handlers.open_echo)
    queue.add(TASKS)
    _until(lambda: queue.busy or queue.made)  # the child is ready and took the first
    here, made = _drain(queue)
    assert sorted(here + list(made)) == sorted(change for change, _ in TASKS)
    assert made and not set(here) & set(made)
    for change, figures in made.items():
        assert figures["variant"] == dict(TASKS)[change]
        assert figures["pid"] != os.getpid()
        assert figures["gpus"] == "-1"  # it traces on the CPU: the card's memory is left alone


def test_a_child_that_dies_gives_its_what_if_back(handlers_importable: None) -> None:
    queue = WhatIfQueue({}, handler=whatif_handlers.open_dying)
    queue.add(TASKS)
    _until(lambda: not queue.helping)
    here, made = _drain(queue)
    assert made == {}
    assert sorted(here) == sorted(change for change, _ in TASKS)


def test_a_child_that_cannot_start_leaves_every_what_if_here(handlers_importable: None) -> None:
    queue = WhatIfQueue({}, handler=whatif_handlers.open_failing)
    queue.add(TASKS)
    _until(lambda: not queue.helping)
    here, made = _drain(queue)
    assert made == {} and here == [change for change, _ in TASKS]


def test_without_a_child_the_queue_is_this_process_to_do_list() -> None:
    queue = WhatIfQueue(None)
    queue.add(TASKS)
    here, made = _drain(queue)
    assert here == [change for change, _ in TASKS] and made == {}


SAME_ROWS = CHILDREN / "same_rows.py"


def _named(rows: list[dict]) -> list[dict]:
    """Rows with Keras' numbered names (`functional_5`) unnumbered: each process counts its own."""
    return [{k: re.sub(r"_\d+", "", v) if k == "error" else v for k, v in r.items()} for r in rows]


def test_the_helper_makes_the_rows_this_process_makes() -> None:
    results = run_isolated(SAME_ROWS, env={"PYTHONPATH": TESTS})
    made, rows = results["made"], results["rows"]
    assert sorted(made) == sorted(results["variants"])
    assert {"precision mixed_float16", "optimizer sgd", "input 48x48"} == set(made)
    for change, figures in made.items():
        # samples=0: a row is its step's likely peak (the base's ratios are 1).
        assert _named([figures]) == _named([{key: rows[change][key] for key in figures}])
    assert _named(results["helped"]) == _named(results["alone"])
    # Keras' RematScope is not traced: its row says why and how to estimate a mode.
    note = rows["remat (keras.RematScope)"]["note"]
    assert "raised the peak" in note and "--remat MODE" in note
