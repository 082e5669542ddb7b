"""GuardedStep and memfit.fit on tf_keras (Keras 2) models and optimizers, legacy and new."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"


def _max_rel(a: list, b: list) -> float:
    x = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in a])
    y = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in b])
    return float(np.linalg.norm(x - y) / (np.linalg.norm(y) + 1e-30))


def test_fit_and_custom_loop_match_tf_keras_own_step() -> None:
    result = run_isolated(CHILDREN / "fit_and_loop.py")
    for name, run in result.items():
        assert run["optimizer"].startswith("tf_keras"), name
        assert run["updates"] == run["iterations"] == 4
        assert run["loop_iterations"] == 4
        assert np.isfinite(run["loss"])
        # K micro-batches against tf_keras' own fit: float noise only (no per-batch norm).
        assert _max_rel(run["fit"], run["plain"]) < 1e-5, name
        assert _max_rel(run["loop"], run["plain"]) < 1e-5, name


def test_step_fn_and_loss_scale_optimizer_under_mixed_precision() -> None:
    result = run_isolated(CHILDREN / "mixed_precision.py")
    assert result["iterations"] == 3
    assert all(np.isfinite(result["losses"]))
    assert result["losses"][-1] < result["losses"][0]  # it trains
    assert result["guarded"] == 3
    # The loss scale is part of the state a guarded update saves and puts back.
    assert any("loss_scale" in name for name in result["names"]), result["names"]


def test_bad_steps_are_one_clear_error() -> None:
    result = run_isolated(CHILDREN / "bad_steps.py")
    assert "returned no loss (its keys: total)" in result["no_loss"]
    assert "apply_gradients 0 times" in result["no_update"]
    assert "not both" in result["both"]
    assert "expected a TF Model Garden task" in result["task"]
    assert "keras.Model or tf_keras.Model" in result["model"]
    assert all("\n" not in text for text in result.values())


@pytest.mark.slow
def test_fit_on_tf_keras_survives_an_oom_that_kills_tf_keras_fit() -> None:
    code = CHILDREN / "shards.py"
    tight = run_isolated(code, env={"MEMFIT_MEMORY": "40MiB"}, args={"mode": "tight"})
    roomy = run_isolated(code, env={"MEMFIT_MEMORY": "2GiB"}, args={"mode": "roomy"})
    assert tight["plain"] == "ResourceExhaustedError"
    assert tight["iterations"] == roomy["iterations"] == 4
    recoveries = tight["summary"]["recoveries"]
    assert recoveries and recoveries[0]["input_shapes"][0][1:] == [128, 128, 3]
    assert roomy["summary"]["recoveries"] == []
    assert _max_rel(tight["weights"], roomy["weights"]) < 1e-5
