"""memfit.watch.detectors on synthetic series: fast, no TensorFlow.

Healthy runs (noisy losses of several kinds, flat memory, noisy step times) must stay quiet;
planted problems must be found, with the right numbers.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from memfit.watch import detectors
from memfit.watch.detectors import Floors, LossMonitor, diagnose_oom

MIB = 2**20


def _losses(series: np.ndarray | list[float], **kw: float) -> list:
    monitor = LossMonitor(**kw)
    return [f for step, v in enumerate(series) if (f := monitor.add(step, float(v)))]


# -- healthy loss series: quiet ----------------------------------------------------------------
def batch4_random_regression(seed: int, steps: int = 60) -> np.ndarray:
    """Batch-4 MSE on random N(0,1) targets: the model fits the targets' scale, no more."""
    rng = np.random.default_rng(seed)
    scale = 1.0 + 0.5 * np.exp(-np.arange(steps) / 10)  # from 1.5 down to the noise floor
    errors = rng.normal(size=(steps, 4)) * np.sqrt(scale)[:, None]
    return (errors**2).mean(axis=1)


def warmup_spikes(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(400)
    loss = 0.2 + 2.1 * np.exp(-t / 80) * rng.lognormal(0, 0.1, t.size)
    for step, factor in ((3, 4.0), (7, 6.0), (12, 3.0), (20, 3.0), (21, 3.5), (30, 2.5)):
        loss[step] *= factor
    return loss


def cyclic_lr(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(800)
    trend = 0.3 + 2.0 * np.exp(-t / 150)
    return trend * (1 + 0.4 * np.sin(2 * np.pi * t / 50)) * rng.lognormal(0, 0.05, t.size)


def cyclic_lr_long_period(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(1200)
    trend = 0.3 + 2.0 * np.exp(-t / 300)
    return trend * (1 + 0.35 * np.sin(2 * np.pi * t / 300)) * rng.lognormal(0, 0.08, t.size)


def heavy_tailed_classification(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(600)
    noise = np.exp(0.25 * rng.standard_t(3, t.size))  # Student-t: occasional big batches
    return (0.4 + 1.9 * np.exp(-t / 120)) * noise


def converged_tiny_loss(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(500)
    loss = (1e-2 * np.exp(-t / 20) + 1e-4) * rng.lognormal(0, 0.5, t.size)
    loss[rng.choice(np.arange(100, 500), 8, replace=False)] *= 10  # rare outlier batches
    return loss


def epoch_sawtooth(seed: int) -> np.ndarray:
    """Each new epoch starts a notch lower and creeps up a little within the epoch."""
    rng = np.random.default_rng(seed)
    out = []
    for epoch in range(8):
        level = 1.5 * 0.8**epoch
        within = np.linspace(0, 0.15 * level, 50)
        out.extend((level + within) * rng.lognormal(0, 0.15, 50))
    return np.array(out)


HEALTHY = {
    "batch4_random_regression": batch4_random_regression,
    "warmup_spikes": warmup_spikes,
    "cyclic_lr": cyclic_lr,
    "cyclic_lr_long_period": cyclic_lr_long_period,
    "heavy_tailed_classification": heavy_tailed_classification,
    "converged_tiny_loss": converged_tiny_loss,
    "epoch_sawtooth": epoch_sawtooth,
}


@pytest.mark.parametrize("kind", sorted(HEALTHY))
@pytest.mark.parametrize("seed", range(10))
def test_healthy_noisy_losses_raise_nothing(kind: str, seed: int) -> None:
    series = HEALTHY[kind](seed)
    assert _losses(series) == []


def test_the_old_spike_rule_fired_on_batch4_noise() -> None:
    """The control: 3x the recent median happens in batch-4 noise (the issue's false alarm)."""
    fired = 0
    for seed in range(10):
        series = batch4_random_regression(seed)
        for i in range(3, len(series)):
            recent = float(np.median(series[max(0, i - 20) : i]))
            if series[i] > 3 * recent and series[i] > 1.5 * np.median(series[:3]):
                fired += 1
                break
    assert fired >= 3, fired


# -- planted loss problems: found ----------------------------------------------------------------
def _falling(seed: int, steps: int, noise: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    return (0.3 + 2.0 * np.exp(-t / 60)) * rng.lognormal(0, noise, steps)


@pytest.mark.parametrize("seed", range(5))
def test_exploding_loss_is_found_at_once(seed: int) -> None:
    loss = _falling(seed, 60)
    loss[40:] = loss[39] * 3.0 ** np.arange(1, 21)
    found = _losses(loss)
    assert [f.evidence["pattern"] for f in found] == ["explosion"]
    assert found[0].step in (41, 42) and found[0].severity == "problem"


@pytest.mark.parametrize("seed", range(5))
def test_a_jump_that_stays_is_a_spike(seed: int) -> None:
    loss = _falling(seed, 200)
    loss[100:] = 6 * loss[60] * np.random.default_rng(seed).lognormal(0, 0.1, 100)
    found = _losses(loss)
    assert [f.evidence["pattern"] for f in found] == ["spike"]
    assert found[0].step == 100 and "stayed up" in found[0].message


@pytest.mark.parametrize("seed", range(5))
def test_a_steady_climb_is_an_increase_even_in_batch4_noise(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scale = np.concatenate([np.linspace(1.0, 0.8, 50), np.linspace(0.8, 4.0, 150)])
    loss = ((rng.normal(size=(200, 4)) ** 2).mean(axis=1)) * scale
    found = _losses(loss)
    assert [f.evidence["pattern"] for f in found] == ["increase"], found
    assert 60 <= found[0].step <= 200


@pytest.mark.parametrize("seed", range(5))
def test_a_flat_loss_is_a_plateau(seed: int) -> None:
    loss = 2.3 * np.random.default_rng(seed).lognormal(0, 0.05, 300)
    found = _losses(loss)
    assert [f.evidence["pattern"] for f in found] == ["plateau"]
    assert found[0].step == 199


def test_nan_is_non_finite_loss_and_the_learning_rate_is_evidence() -> None:
    monitor = LossMonitor()
    for step, value in enumerate(_falling(0, 30)):
        assert monitor.add(step, float(value)) is None
    found = monitor.add(30, math.nan, epoch=1, extra={"learning_rate": 0.5})
    assert found is not None and found.kind == "non_finite_loss" and found.epoch == 1
    assert found.evidence["learning_rate"] == 0.5 and "learning rate" in found.fix
    assert monitor.add(31, math.inf) is None  # once


# -- memory ------------------------------------------------------------------------------------
def _records(
    n: int,
    *,
    current: float = 100 * MIB,
    peak: float = 400 * MIB,
    shape: list[int] | None = None,
    seconds: float = 0.05,
    seed: int = 0,
    current_per_step: float = 0.0,
    peak_noise: float = 0.01,
) -> list[dict]:
    rng = np.random.default_rng(seed)
    shape = shape or [16, 128, 128, 3]
    out = []
    for step in range(n):
        cur = current + current_per_step * step + rng.normal(0, 0.002 * current)
        out.append(
            {
                "step": step,
                "step_seconds": seconds * rng.lognormal(0, 0.1),
                "input_wait_seconds": 0.001,
                "memory_current_bytes": int(cur),
                "memory_peak_bytes": int(cur + (peak - current) * rng.lognormal(0, peak_noise)),
                "traces": 1,
                "batch_size": shape[0],
                "input_shape": shape,
            }
        )
    return out


def _floors(records: list[dict]) -> Floors:
    floors = Floors()
    for r in records:
        floors.add(r["step"], r["memory_current_bytes"], r["traces"])
    return floors


def test_a_leak_is_memory_growth_and_flat_memory_is_not() -> None:
    leak = _records(200, current_per_step=256 * 1024)
    found = detectors.memory_growth(_floors(leak), 199, budget_bytes=2**30)
    assert found is not None and found.evidence["cause"] == "python_references"
    assert found.evidence["growth_bytes_per_step"] == pytest.approx(256 * 1024, rel=0.15)
    flat = _records(200)
    flat[100]["memory_current_bytes"] += 30 * MIB  # one jump (validation's first run)
    for r in flat[101:]:
        r["memory_current_bytes"] += 30 * MIB
    assert detectors.memory_growth(_floors(flat), 199, budget_bytes=2**30) is None


def test_near_budget_predicts_the_step_of_the_oom_from_the_trend() -> None:
    budget = 1024 * MIB
    per_step = 100 * 1024
    records = _records(400, current=200 * MIB, peak=600 * MIB, current_per_step=per_step)
    found = detectors.near_budget(
        records, 399, budget_bytes=budget, floors=_floors(records), planned_steps=5000
    )
    assert found is not None
    peak = max(r["memory_peak_bytes"] for r in records[-5:])
    expected = (budget - peak) / per_step
    assert found.evidence["steps_to_oom"] == pytest.approx(expected, rel=0.15)
    assert "out of memory in about" in found.message
    # The same memory without the trend, far from the budget: quiet; with a trend whose OOM
    # lies past the end of training: quiet.
    flat = _records(400, current=200 * MIB, peak=600 * MIB)
    quiet = detectors.near_budget(
        flat, 399, budget_bytes=budget, floors=_floors(flat), planned_steps=5000
    )
    assert quiet is None
    assert (
        detectors.near_budget(
            records, 399, budget_bytes=budget, floors=_floors(records), planned_steps=1000
        )
        is None
    )


def test_near_budget_at_the_edge_names_the_batch_that_would_not_fit() -> None:
    records = _records(20, current=100 * MIB, peak=470 * MIB)
    found = detectors.near_budget(records, 19, budget_bytes=500 * MIB, floors=_floors(records))
    assert found is not None and "steps_to_oom" not in found.evidence
    # 370 MiB for 16 samples: 23.1 MiB a sample; (500 - 100) / 23.1 = 17.3 -> 18 does not fit
    assert found.evidence["oom_batch_size"] in (17, 18)


def test_thrashing_needs_the_edge_and_a_slowdown_together() -> None:
    budget = 500 * MIB
    records = _records(120, current=100 * MIB, peak=400 * MIB, seconds=0.05)
    for r in records[60::3]:  # every third step: at the edge and twice as slow
        r["memory_peak_bytes"] = int(0.97 * budget)
        r["step_seconds"] *= 2.2
    found = detectors.thrashing(records, 119, budget_bytes=budget)
    assert found is not None and found.evidence["slowdown"] >= 1.8
    assert found.evidence["edge_steps"] == 20
    # At the edge but not slower: quiet.
    calm = _records(120, current=100 * MIB, peak=400 * MIB)
    for r in calm[60::3]:
        r["memory_peak_bytes"] = int(0.97 * budget)
    assert detectors.thrashing(calm, 119, budget_bytes=budget) is None
    # Noisy step times (lognormal 0.5) with edge steps drawn from the same times: quiet.
    noisy = _records(200, current=100 * MIB, peak=400 * MIB, seed=3)
    rng = np.random.default_rng(3)
    for r in noisy:
        r["step_seconds"] = 0.05 * rng.lognormal(0, 0.5)
    for r in noisy[::4]:
        r["memory_peak_bytes"] = int(0.97 * budget)
    assert detectors.thrashing(noisy, 199, budget_bytes=budget) is None


def test_input_bound_and_retracing() -> None:
    records = _records(60, seconds=0.02)
    assert detectors.input_bound(records, 59) is None
    for r in records:
        r["input_wait_seconds"] = 0.4 * r["step_seconds"]
    found = detectors.input_bound(records, 59)
    assert found is not None and found.evidence["input_wait_fraction"] == pytest.approx(0.4)
    # A batch takes 1/0.6 of a step's compute: two tf.data service workers keep up.
    assert found.evidence["data_service_workers"] == 2
    assert "memfit.fit(..., data_service=2)" in found.fix
    assert detectors.retracing(30, 5, 1, 5) is None
    found = detectors.retracing(30, 6, 1, 5, guarded=True)
    assert found is not None and "micro_batches" in found.fix  # memfit.fit's own fix
    assert "micro_batches" not in detectors.retracing(30, 6, 1, 5).fix


def test_repeated_fits_rising_is_growth_and_steady_is_not() -> None:
    assert detectors.repeated_fits([100 * MIB, 100 * MIB, 101 * MIB], 0) is None
    found = detectors.repeated_fits([100 * MIB, 130 * MIB, 160 * MIB], 0)
    assert found is not None and found.evidence["cause"] == "repeated_fit"


# -- out of memory: cause from the steps before -------------------------------------------------
def test_oom_on_larger_images_names_the_shape_and_the_fix_in_numbers() -> None:
    records = _records(20, current=100 * MIB, peak=400 * MIB, peak_noise=0.0)
    d = diagnose_oom(
        records, input_shape=[16, 256, 256, 3], batch_size=16, budget_bytes=700 * MIB
    )
    assert d.cause == "input_shape"
    assert "16x256x256x3, 4x the pixels of the earlier 16x128x128x3 batches" in d.text
    # 300 MiB for 16 samples of 128x128 -> 75 MiB a sample of 256x256; (630 - 100) / 75 = 7.07
    assert d.evidence["per_sample_bytes"] == pytest.approx(75 * MIB, rel=0.02)
    assert d.evidence["largest_batch_size"] == 7
    assert d.evidence["micro_batches"] == 3  # ceil(16 / 7)
    # side: 256 * sqrt(530 / 1200) = 170.1 -> 168 (a multiple of 8)
    assert d.evidence["fitting_side"] == [168, 168]
    assert "about 7" in d.fix and "168x168" in d.fix and "micro_batches=3" in d.fix
    guarded = diagnose_oom(
        records, input_shape=[16, 256, 256, 3], batch_size=16, budget_bytes=700 * MIB, guarded=True
    )
    assert "nothing is lost" in guarded.fix and "micro_batches=3" in guarded.fix


def test_oom_causes_batch_growth_budget_first_step_and_the_edge() -> None:
    records = _records(20, current=100 * MIB, peak=400 * MIB, peak_noise=0.0)
    batch = diagnose_oom(
        records, input_shape=[32, 128, 128, 3], batch_size=32, budget_bytes=700 * MIB
    )
    assert batch.cause == "batch_size" and "from 16 to 32" in batch.text
    # (630 - 100) / 18.75 = 28.3
    assert batch.evidence["largest_batch_size"] == 28 and batch.evidence["micro_batches"] == 2

    leak = _records(60, current=100 * MIB, peak=400 * MIB, current_per_step=5 * MIB)
    grown = diagnose_oom(leak, input_shape=[16, 128, 128, 3], batch_size=16, budget_bytes=700 * MIB)
    assert grown.cause == "memory_growth" and "memory in use before the step rose" in grown.text
    assert "keeps memory" in grown.fix
    # At the memory in use when training began the step fits: no K, no smaller side to offer.
    assert grown.evidence["largest_batch_size"] >= 16 and "fitting_side" not in grown.evidence
    assert "micro_batches=" not in grown.fix

    budget = diagnose_oom(
        records,
        input_shape=[16, 128, 128, 3],
        batch_size=16,
        budget_bytes=380 * MIB,
        start_budget_bytes=700 * MIB,
    )
    assert budget.cause == "budget" and "another process" in budget.text

    first = diagnose_oom([], input_shape=[16, 512, 512, 3], batch_size=16, budget_bytes=700 * MIB)
    assert first.cause == "first_step" and "never fitted" in first.text
    assert "memfit batch" in first.fix

    def first_estimated(**estimated: object) -> object:
        return diagnose_oom(
            [], input_shape=[16, 512, 512, 3], batch_size=16, budget_bytes=700 * MIB,
            estimated=estimated,
        )

    fits = first_estimated(estimated_batch_size=5, estimated_high_bytes=600 * MIB)
    assert "by the estimate, batch 5 fits" in fits.text
    assert "train at batch_size=5" in fits.fix and "micro_batches=4" in fits.fix
    assert fits.evidence["largest_batch_size"] == 5
    none = first_estimated(estimated_batch_size=0, estimated_high_bytes=None)
    assert "not even one sample" in none.text and "batch_size=" not in none.fix
    # The estimate says the failing batch fits: no number, the device had less room.
    odd = first_estimated(estimated_batch_size=16, estimated_high_bytes=650 * MIB)
    assert "less free memory" in odd.text and "largest_batch_size" not in odd.evidence
    failed = first_estimated(estimate_error="WorkloadError: x")
    assert "memfit batch" in failed.fix and failed.evidence["estimate_error"]

    edge = diagnose_oom(
        records, input_shape=[16, 128, 128, 3], batch_size=16, budget_bytes=420 * MIB
    )
    assert edge.cause == "near_limit" and "nothing changed" in edge.text


def test_detectors_do_not_import_tensorflow() -> None:
    import subprocess  # a fresh interpreter: other tests import TensorFlow in this one

    code = (
        "import sys; import memfit.watch.detectors, memfit.watch.log, memfit.report; "
        "print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
