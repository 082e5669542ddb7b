"""What a failed step leaves inside TensorFlow: grappler's temporary accumulators after an OOM.

Grappler's memory optimizer rewrites a large sum of gradients into a `TemporaryVariable`
accumulator that only a `DestroyTemporaryVariable` later in the step frees; a step that runs
out of memory in between leaves it in the eager context's per-step container (see
docs/design/recovery.md). Each test runs in a child with its own emulated budget.
"""

from __future__ import annotations

from pathlib import Path

from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"

# A step shaped like the rewritten sum: a 4 MiB accumulator is created and filled, then a
# tensor larger than the whole budget is allocated (a real OOM) before the accumulator is
# destroyed. `clear` says whether memfit cleans up between tries.
LEAKY_STEP = CHILDREN / "leaky_step.py"


def _leaky(clear: bool) -> list:
    return run_isolated(LEAKY_STEP, env={"MEMFIT_MEMORY": "48MiB"}, args={"clear": clear})


def test_an_oom_between_accumulator_and_destroy_leaks_without_clearing() -> None:
    tries = _leaky(clear=False)
    # The first OOM leaves the 4 MiB accumulator; every later run finds it there.
    assert tries[0] == ["ResourceExhaustedError", 4 * 2**20], tries
    assert tries[1][0] == "small AlreadyExistsError", tries
    assert all(held == 4 * 2**20 for _, held in tries), tries


def test_clear_step_resources_frees_the_accumulator_after_each_oom() -> None:
    tries = _leaky(clear=True)
    assert [what for what, _ in tries] == ["ResourceExhaustedError", "small ran"] * 3, tries
    # Bytes in use between steps are back where they were after every failed try.
    assert all(held == 0 for _, held in tries[1::2]), tries
