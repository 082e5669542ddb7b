"""memfit.Watch on a CPU-emulated card: plain model.fit's pipeline on the card, said once."""

from __future__ import annotations

from helpers import run_isolated

from memfit.watch.emulated_input import pipeline_warning, variable_bytes


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
    result = run_isolated(
        """
import contextlib, io, sys
import memfit
import numpy as np, keras

def run(plain):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((96, 96, 3)), keras.layers.Conv2D(16, 3),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.rand(256, 96, 96, 3).astype("float32")
    y = np.random.randint(0, 10, 256)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        kw = dict(batch_size=8, epochs=2, verbose=0, callbacks=[memfit.Watch(verbose=1)])
        model.fit(x, y, **kw) if plain else memfit.fit(model, x, y, **kw)
    return [l for l in err.getvalue().splitlines() if l.startswith("memfit: warning:")]

emit({"plain": run(True), "memfit": run(False)})
""",
        env={"MEMFIT_MEMORY": "400MiB"},
    )
    assert len(result["plain"]) == 1, result
    assert "the input pipeline holds" in result["plain"][0]
    assert "batches) on the emulated card" in result["plain"][0]
    assert "memfit.fit runs the pipeline off the card" in result["plain"][0]
    assert result["memfit"] == []
