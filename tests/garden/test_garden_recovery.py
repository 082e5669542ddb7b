"""The Model Garden's RetinaNet, trained through its task, recovers from OOM after OOM.

One task pipeline at global batch 10 (ResNet-18, 256 px); its first batch is fed cut to five
sizes. memfit keeps K per input shape, so each size starts at K=1, runs out of memory on the
emulated card and trains at a larger K. This is the model on which a failed step was seen to
leave grappler's gradient accumulators behind (bytes in use climbing, `AlreadyExistsError` on
the retry): see docs/design/recovery.md.

Measured on this configuration without a budget (BFC allocator, one process): the gradients
phase peaks at ~870-900 MiB at K=1 for 10 samples, ~760 at K=2, ~640 at K=5; the two phases
are dominated by three gradient-sized sets (74 MiB each: accumulators, a micro-batch's
gradients, their sum), so K pays off only where activations are larger than that (at 128 px
a larger K raises the peak). Each gradients function in use keeps 25-50 MiB of buffers for
its life (TensorFlow's, one per input shape and K), so bytes in use grow by that with each
new size whether or not it ran out of memory: the run is compared with one that never did.

Measured (one run): 5 OOMs, one per size, each trained at K=2; the weights bit for bit those
of the run at K=2 that never ran out of memory; 0.19% (norm) from K=1's; bytes in use after
each step 1.5-6 MiB above the clean run's, not growing. A step takes minutes here: each OOM
waits out the BFC allocator's 10 s retry.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import run_isolated

pytestmark = pytest.mark.slow

SIZES = [10, 9, 8, 7, 6]
# Under the K=1 peak of every size (6 samples: ~800 MiB) with room for K=4-5 (~640-690 MiB):
# at 800 MiB the K=1 step of a size sometimes fit, one OOM short of five.
BUDGET = "740MiB"

CHILDREN = Path(__file__).resolve().parent / "children"


def _run(directory: str, out: str, mode: str, memory: str) -> Any:
    args = {"directory": directory, "out": out, "mode": mode, "sizes": SIZES}
    env = {"MEMFIT_MEMORY": memory, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    return run_isolated(CHILDREN / "garden_recovery.py", env=env, args=args, timeout=1700)


def _weights(path: str) -> list[np.ndarray]:
    saved = np.load(path)
    return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def _max_relative_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """max over variables of max|a - b| / max|b|."""
    return max(
        float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-12))
        for x, y in zip(a, b, strict=True)
    )


# Each OOM waits in TensorFlow's allocator retry (10 s per failing allocation; see
# docs/design/recovery.md): 814 s alone on 2 cores, past 900 s beside the other garden files.
@pytest.mark.timeout(1800)
def test_retinanet_recovers_from_five_ooms_exactly_and_leaves_no_memory_behind(
    tmp_path: Any,
) -> None:
    directory, out = str(tmp_path / "od"), str(tmp_path / "run")
    budget = _run(directory, out, "budget", BUDGET)
    # Every size ran out of memory at K=1 and trained at a larger K: five OOMs or more, every
    # update made, none lost to an AlreadyExistsError (that would have ended the run).
    assert [row["recoveries"] >= 1 for row in budget["rows"]] == [True] * len(SIZES)
    assert sum(row["recoveries"] for row in budget["rows"]) >= 5
    assert budget["updates"] == len(SIZES) == budget["iterations"]
    assert all("AlreadyExists" not in m for m in budget["messages"])
    assert sorted(budget["micro_batches"].values()) >= [2] * len(SIZES)
    with open(out + "-k.json", "w") as handle:
        json.dump(budget["micro_batches"], handle)

    reference = _run(directory, out, "reference", "4GiB")
    same_k = reference["same_k"]
    print(json.dumps({"budget": budget, "reference": reference}))  # figures, shown with -s
    assert sum(row["recoveries"] for row in same_k["rows"]) == 0
    # Exactness. The failed tries changed no weight: the weights equal those of the run at
    # the same K (up to float32 rounding of a different summation order, 1e-5 relative).
    trained = _weights(out + "-budget.npz")
    assert _max_relative_difference(trained, _weights(out + "-same-k.npz")) <= 1e-5
    # (Against a run at K=1 the weights differ by design: RetinaNet normalises each
    # micro-batch's loss by its own positive anchors and batch norm uses each micro-batch's
    # statistics. Measured after five updates: 0.19% of the weights' norm. That run, five
    # more traces of the task's step, is left out to keep the suite's time.)
    # Bytes in use between steps, from the bytes before the first step: after each recovery
    # as after the same step in a run that never ran out of memory (same sizes, same K),
    # within 16 MiB (measured 1.5-9.0 MiB over runs, not growing from size to size). The
    # failed K's function, had it been kept, would hold 25-50 MiB.
    start, clean_start = budget["rows"][0]["before"], same_k["rows"][0]["before"]
    for failed, clean in zip(budget["rows"], same_k["rows"], strict=True):
        grown = (failed["after"] - start) - (clean["after"] - clean_start)
        assert abs(grown) <= 16 * 2**20, (failed, clean)
