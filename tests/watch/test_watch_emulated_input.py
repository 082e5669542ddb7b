"""memfit.Watch on a CPU-emulated card: plain model.fit's pipeline on the card, said once."""

from __future__ import annotations

from pathlib import Path

from helpers import run_isolated

from memfit.watch.emulated_input import pipeline_warning, variable_bytes

CHILDREN = Path(__file__).resolve().parent / "children"


class _Variable:
    def __init__(self, shape: tuple[int, ...], dtype: str = "float32") -> None:
        self.shape, self.dtype = shape, dtype


class _Model:
    def __init__(self) -> None:
        shared = _Variable((10, 10))
        self.variables = [shared, _Variable((4,), "float16")]
        self.optimizer = type("Optimizer", (), {"variables": [shared, _Variable((3,), "int64")]})


def test_variables_count_once_and_no_card_says_nothing() -> None:
    assert variable_bytes(_Model()) == 400 + 8 + 24
    # No emulated card in this process: nothing to say, whatever is in use.
    assert pipeline_warning(_Model(), 10 << 20, 1 << 20) is None


def test_plain_fit_is_warned_once_and_memfit_fit_not() -> None:
    result = run_isolated(CHILDREN / "emulated_input.py", env={"MEMFIT_MEMORY": "400MiB"})
    assert len(result["plain"]) == 1, result
    assert "the input pipeline holds" in result["plain"][0]
    assert "batches) on the emulated card" in result["plain"][0]
    assert "memfit.fit runs the pipeline off the card" in result["plain"][0]
    assert result["memfit"] == []
