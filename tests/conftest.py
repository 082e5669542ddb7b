import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# The test files that take longest, longest first (measured with `--durations=0`).
# `make test` hands whole files to its workers (`--dist loadfile --no-loadscope-reorder`) in
# collection order: started first, the long files run beside each other and the short ones
# fill in after, instead of one long file starting last and running alone at the end.
LONGEST_FIRST = (
    "garden/test_garden_recovery.py",  # the garden suite's own order (its environment)
    "garden/test_garden_maskrcnn.py",
    "garden/test_garden_task.py",
    "detectors/test_detectors_dfine.py",
    "search/test_search.py",
    "detectors/test_detectors_yolo.py",
    "demo/test_demo.py",
    "cli/test_cli.py",
    "training/test_fit.py",
    "measuring/test_measure.py",
    "watch/test_watch_oom.py",
    "test_docstring_examples.py",
    "budget/test_emulate.py",
    "planning/test_plan.py",
    "process/test_child_options.py",
    "training/test_backup.py",
    "recomputation/test_recompute.py",
    "estimation/test_estimate_bounds.py",
    "measuring/test_isolate.py",
    "watch/test_watch.py",
    "measuring/test_replicas.py",
    "test_readme.py",
    "estimation/test_estimate.py",
    "data/test_data_audit_images.py",
    "training/test_accumulate_detectors.py",
)


# A test file that starts processes (TensorFlow children, the CLI) says so with one of these;
# its tests are marked `child`, and `make test-fast` leaves them out.
CHILD_PROCESS_CALLS = ("run_isolated", "run_cli", "subprocess", "isolated=True", "Popen")
_starts_children: dict[str, bool] = {}


def _file_starts_children(path: str) -> bool:
    if path not in _starts_children:
        with open(path) as handle:
            source = handle.read()
        _starts_children[path] = any(call in source for call in CHILD_PROCESS_CALLS)
    return _starts_children[path]


def pytest_collection_modifyitems(items: list) -> None:
    """Mark the tests of files that start processes `child`; put the longest files first,
    keeping the order of tests within each file."""
    tests = os.path.dirname(__file__)
    for item in items:
        if _file_starts_children(str(item.path)):
            item.add_marker(pytest.mark.child)

    def rank(item: object) -> int:
        path = os.path.relpath(str(item.path), tests).replace(os.sep, "/")
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)
