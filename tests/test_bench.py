"""The benchmarks' own parts: baseline strategies, the ground truth's search, the answer check.

The baselines are pure strategies over `runs(size)`, so they are tested with a fake oracle
(no TensorFlow): the exact sizes they try and the size they answer, against Lightning 2.6.5's
`batch_size_scaling.py` and Accelerate's `find_executable_batch_size`, traced by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.baselines import binsearch_scaling, find_executable_batch_size, power_scaling
from bench.baselines.lightning import VERSION

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def oracle(limit: int) -> tuple[Callable[[int], bool], list[int]]:
    """`runs(size)`: True up to `limit`; and the list of sizes it was asked, in order."""
    asked: list[int] = []

    def runs(size: int) -> bool:
        asked.append(size)
        return size <= limit

    return runs, asked


def test_lightning_version_is_the_one_followed() -> None:
    assert VERSION == "2.6.5"


# -- Lightning power -------------------------------------------------------------------------
def test_power_doubles_to_the_first_oom_and_halves_once() -> None:
    runs, asked = oracle(40)
    assert power_scaling(runs) == 32
    assert asked == [2, 4, 8, 16, 32, 64]


def test_power_goes_on_after_a_first_oom_until_a_success_then_stops_at_the_next_oom() -> None:
    # 2 fails: halve to 1 and go on (no success yet); 1 runs: double to 2 (again); 2 fails
    # after a success: halve and stop.
    runs, asked = oracle(1)
    assert power_scaling(runs) == 1
    assert asked == [2, 1, 2]


def test_power_answers_0_when_even_1_fails() -> None:
    runs, asked = oracle(0)
    assert power_scaling(runs) == 0
    assert asked == [2, 1]


def test_power_stops_untried_at_max_val() -> None:
    runs, asked = oracle(10_000)
    assert power_scaling(runs, max_val=64) == 64
    assert asked == [2, 4, 8, 16, 32]


def test_power_counts_every_trial_against_max_trials() -> None:
    runs, asked = oracle(10_000)
    assert power_scaling(runs, max_trials=3) == 8
    assert asked == [2, 4, 8]
    runs, asked = oracle(1)
    assert power_scaling(runs, max_trials=2) == 1  # 2 failed, 1 ran on the last trial: kept
    assert asked == [2, 1]


def test_power_doubling_is_capped_at_8192_whatever_max_val() -> None:
    runs, asked = oracle(10_000)
    assert power_scaling(runs, init_val=6000, max_val=10_000) == 8192
    assert asked == [6000, 8192]


# -- Lightning binsearch ---------------------------------------------------------------------
def test_binsearch_bisects_to_a_one_size_bracket_then_takes_the_margin_off() -> None:
    runs, asked = oracle(40)
    assert binsearch_scaling(runs) == 38  # int(40 * 0.95)
    assert asked == [2, 4, 8, 16, 32, 64, 48, 40, 44, 42, 41]
    runs, _ = oracle(40)
    assert binsearch_scaling(runs, margin=0.0) == 40


def test_binsearch_ends_on_the_last_failure_halved_as_lightning_does() -> None:
    # The loop ends on the OOM at 34 with new_size = (34 + 33) // 2 = 33: the last success.
    runs, asked = oracle(33)
    assert binsearch_scaling(runs, margin=0.0) == 33
    assert asked == [2, 4, 8, 16, 32, 64, 48, 40, 36, 34, 33]


def test_binsearch_oom_at_init_ends_on_1_untried() -> None:
    runs, asked = oracle(1)
    assert binsearch_scaling(runs) == 1
    assert asked == [2]


def test_binsearch_stops_untried_at_max_val_and_applies_the_margin() -> None:
    runs, asked = oracle(10_000)
    assert binsearch_scaling(runs, max_val=50) == 47  # 64 capped to 50, untried; 50 * 0.95
    assert asked == [2, 4, 8, 16, 32]


def test_binsearch_counts_only_successes_against_max_trials() -> None:
    runs, asked = oracle(10_000)
    assert binsearch_scaling(runs, max_trials=3, margin=0.0) == 8
    assert asked == [2, 4, 8]


def test_binsearch_stops_growing_at_the_dataset_length() -> None:
    runs, asked = oracle(10_000)
    assert binsearch_scaling(runs, margin=0.0, dataset_length=20) == 32
    assert asked == [2, 4, 8, 16, 32]


def test_binsearch_refuses_a_margin_outside_0_1() -> None:
    with pytest.raises(ValueError, match="margin"):
        binsearch_scaling(lambda size: True, margin=1.0)


# -- Accelerate ------------------------------------------------------------------------------
def test_accelerate_backs_off_by_a_tenth_from_128() -> None:
    runs, asked = oracle(40)
    assert find_executable_batch_size(runs) == 36
    assert asked == [128, 115, 103, 92, 82, 73, 65, 58, 52, 46, 41, 36]


# -- the 20-step max -------------------------------------------------------------------------
def test_largest_passing_bisects_from_known_outcomes_and_confirms() -> None:
    from bench.batch_search import largest_passing

    runs, asked = oracle(13)
    known = {10: [True], 16: [False]}
    found = largest_passing(runs, known, start=10)
    assert found["largest"] == 13 and found["smallest_failing"] == 14 and found["settled"]
    assert asked == [13, 14, 13]  # bisect 10..16, then 13 again (its second pass)
    assert known[13] == [True, True]


def test_largest_passing_gallops_up_and_down() -> None:
    from bench.batch_search import largest_passing

    runs, asked = oracle(20)
    assert largest_passing(runs, {}, start=10)["largest"] == 20
    assert asked[:5] == [10, 11, 13, 17, 25]  # +1, +2, +4, +8 from the largest pass
    runs, asked = oracle(5)
    assert largest_passing(runs, {}, start=10)["largest"] == 5
    assert asked[:4] == [10, 9, 7, 3]  # -1, -2, -4 from the smallest failure


def test_largest_passing_a_size_that_fails_once_does_not_count() -> None:
    from bench.batch_search import largest_passing

    outcomes = {13: [True, False]}  # 13 passes, then fails its confirmation

    def flaky(size: int) -> bool:
        if size in outcomes and outcomes[size]:
            return outcomes[size].pop(0)
        return size <= 13

    found = largest_passing(flaky, {10: [True], 16: [False]}, start=10)
    assert found["largest"] == 12
    assert found["smallest_failing"] == 13


def test_largest_passing_none_pass_and_the_run_limit() -> None:
    from bench.batch_search import largest_passing

    runs, _ = oracle(0)
    found = largest_passing(runs, {}, start=4)
    assert found["largest"] == 0 and found["smallest_failing"] == 1 and found["settled"]
    runs, asked = oracle(1000)
    found = largest_passing(runs, {}, start=1, max_runs=3)
    assert not found["settled"] and len(asked) == 3


# -- memfit's variants, shares and the table -------------------------------------------------
def test_memfit_options_come_from_memfit_batch_defaults() -> None:
    from bench.batch_search import MEMFIT_FLAGS, memfit_options

    default = memfit_options(MEMFIT_FLAGS["memfit"])
    assert default["margin"] == pytest.approx(0.05)
    assert default["soak_steps"] > 0 and default["in_process"] is False
    assert memfit_options(MEMFIT_FLAGS["memfit_no_soak"])["soak_steps"] == 0
    assert memfit_options(MEMFIT_FLAGS["memfit_in_process"])["in_process"] is True
    with pytest.raises(RuntimeError, match="no longer takes"):
        memfit_options(["--no-such-flag"])


def test_summarise_and_table() -> None:
    from rich.console import Console

    from bench.batch_search import summarise, table

    results = {
        "memfit": {"found": 19, "trains": True, "trials": [{}] * 6, "steps": 8, "seconds": 30},
        "lightning_binsearch": {
            "found": 21,
            "trains": False,
            "trials": [{}] * 11,
            "steps": 33,
            "seconds": 60,
        },
        "accelerate": {"found": None, "trials": [], "steps": 0, "seconds": 5, "failed": "x"},
    }
    summarise(results, fit_max=20, three_step_max=22)
    assert results["memfit"]["share_of_fit_max"] == pytest.approx(0.95)
    assert results["memfit"]["time_vs_binsearch"] == pytest.approx(0.5)
    assert results["lightning_binsearch"]["share_of_three_step_max"] == pytest.approx(21 / 22)
    assert results["accelerate"]["time_vs_binsearch"] is None
    report = {"models": {"M": {"fit_max": 20, "three_step_max": 22, "methods": results}}}
    console = Console(width=200, record=True)
    console.print(table(report))
    text = console.export_text()
    assert "trains?" in text and "yes" in text and "no" in text and "failed" in text
    assert "95%" in text and "0.50" in text


# -- the check: plain model.fit in a fresh process -------------------------------------------
@pytest.mark.slow
def test_fit_steps_trains_a_small_batch_and_runs_out_of_memory_on_a_large_one() -> None:
    from bench.trials import FIT_STEPS, ChildTrials
    from memfit.budget.budget import Budget

    seen: dict[int, list[bool]] = {}
    check = ChildTrials(
        "tests.factories:small_cnn", Budget.from_size("160MiB"), 20, None, None, seen,
        function=FIT_STEPS,
    )  # fmt: skip
    assert check(4) is True
    assert check(1024) is False
    assert seen == {4: [True], 1024: [False]}
    assert check.log.steps == 40


# -- gpu_check -------------------------------------------------------------------------------
def test_gpu_check_without_a_gpu_says_so_and_exits_0(tmp_path: os.PathLike[str]) -> None:
    from memfit.budget.devices import nvml_gpus

    if nvml_gpus()[0]:
        pytest.skip("this machine has an NVIDIA GPU")
    out = os.path.join(tmp_path, "gpu.json")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--out", out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no NVIDIA GPU found" in proc.stdout
    assert not os.path.exists(out)


def test_gpu_check_rows_compare_the_two_sides() -> None:
    from bench.gpu_check import rows

    side = {
        "measure": {
            "budget": {"usable_bytes": 2**30},
            "models": {
                "MobileNetV2": {
                    "batch_size": 32,
                    "peak_bytes": 400 * 2**20,
                    "estimate_bytes": 420 * 2**20,
                    "step_seconds": 0.05,
                }
            },
        },
        "batch": {"batch_size": 40, "trains": True, "seconds": 20},
        "recovery": {"plain_fit": "out of memory", "epochs": 2, "recoveries": 1},
    }
    report = {
        "models": ["MobileNetV2"],
        "doctor": {"devices": [{"type": "GPU", "description": "T", "total_bytes": 2**34}]},
        "sides": {"gpu": side, "cpu": {"batch": {"error": "TimeoutExpired: x"}}},
    }
    table = {row[0]: row[1:] for row in rows(report)}
    assert table["device"][0] == "T (16384 MiB)"
    assert table["MobileNetV2 b32: measured peak"] == ("400 MiB", "-")
    assert table["MobileNetV2 b32: estimate (/ measured)"][0] == "420 MiB (1.05x)"
    assert table["memfit batch under 1GiB, 20-step model.fit"] == (
        "40, trains (20 s)",
        "TimeoutExpired: x",
    )
    assert "plain: out of memory" in table["recovery under 256MiB"][0]


def test_estimate_accuracy_summary_signs_errors_and_reads_the_range() -> None:
    from bench.estimate_accuracy import error, in_range, summarise

    mib = 2**20

    def row(estimate: int, high: int | None, measured: int) -> dict[str, object]:
        return {
            "measured": measured * mib,
            "memfit": estimate * mib,
            "memfit_high": None if high is None else high * mib,
            "memfit_error": error(estimate * mib, measured * mib),
            "stackoverflow_error": 0.5,
            "grappler_error": None,
        }

    # Under by 10%, over by 5%, under by 20% (outside its range), under by 2%.
    rows = [row(90, 110, 100), row(105, 120, 100), row(80, 90, 100), row(98, 130, 100)]
    memfit = summarise(rows)["memfit"]
    assert memfit["median"] == pytest.approx(0.075)
    assert memfit["max"] == pytest.approx(0.2)
    assert memfit["worst_signed"] == pytest.approx(-0.2)
    assert memfit["unsafe"] == 0.75
    assert memfit["coverage"] == 0.75
    assert memfit["in_range"] == 0.5  # the estimate itself is above 100 in one of the covered
    assert memfit["high_margin_median"] == pytest.approx(0.15)
    assert summarise(rows)["grappler"] is None
    assert in_range(90, None, 100) is None
    # Before the estimate has a high bound: the error still counts, the range is n/a.
    without = summarise([row(90, None, 100)])["memfit"]
    assert without["unsafe"] == 1.0
    assert without["coverage"] is None and without["high_margin_median"] is None


def test_estimate_accuracy_cases_cover_both_groups_and_threadings() -> None:
    from bench.estimate_accuracy import HOLDOUT, QUICK, TUNED_ON, UNSEEN, cases_for, one_batch

    assert {s.group for s in QUICK} == {"tuned-on", "unseen"}
    assert not {s.model for s in UNSEEN} - {"RetinaNet"} & {s.model for s in TUNED_ON}
    # The holdout shares no family with the sets the estimate was worked on.
    assert not {s.model for s in HOLDOUT} & {s.model for s in TUNED_ON + UNSEEN}
    cases = cases_for(UNSEEN[:1], ["adam", "sgd"], ["default", "pinned"], batches=[3])
    assert [(c["optimizer"], c["threads"], c["batch_size"]) for c in cases] == [
        ("adam", "default", 3),
        ("adam", "pinned", 3),
        ("sgd", "default", 3),
        ("sgd", "pinned", 3),
    ]
    # --one-batch and --largest-batch: the full benchmark's two ends, run apart.
    assert [s.batches for s in one_batch(TUNED_ON[:1] + UNSEEN[:1])] == [(2,), (8,)]
    assert [s.batches for s in one_batch(TUNED_ON[:1] + UNSEEN[:1], largest=True)] == [(8,), (16,)]


def test_estimate_accuracy_reuses_measured_rows_by_case(tmp_path: Path) -> None:
    from bench.estimate_accuracy import QUICK, case_key, cases_for, measured_rows

    cases = cases_for(QUICK, ["adam"], ["default", "pinned"])
    rows = [{**c, "measured_each": [7, 9], "peaks": [7, 9], "resident": 1} for c in cases[:2]]
    earlier = tmp_path / "m.json"
    earlier.write_text(json.dumps({"rows": rows}))
    found = measured_rows(str(earlier))
    assert set(found) == {case_key(c) for c in cases[:2]}
    assert case_key(cases[2]) not in found
    # A file that is not the benchmark's output: one line saying so, no traceback.
    (tmp_path / "bad.json").write_text("[1, 2]")
    for path in (tmp_path / "bad.json", tmp_path / "missing.json"):
        with pytest.raises(SystemExit, match="not a bench.estimate_accuracy --out file"):
            measured_rows(str(path))


def test_reliability_arguments_rows_table_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    import bench.machine
    from bench import reliability

    full = reliability.parse_args([])
    assert (full.quick, full.out, full.seed) == (False, None, 0)
    assert full.parts == list(reliability.PARTS)
    assert full.sizes.preemptions == full.sizes.kills == 10 and full.sizes.watch_steps == 2000
    quick = reliability.parse_args(["--quick", "--out", "r.json", "--parts", "oom", "watch"])
    assert quick.sizes is reliability.QUICK and quick.out == "r.json"
    assert quick.parts == ["oom", "watch"]
    with pytest.raises(SystemExit):
        reliability.parse_args(["--parts", "everything"])

    rows = [
        reliability.row("oom", 20, 20, 301.26, "14 in the gradients", recoveries=[]),
        reliability.row("kill9", 10, 9, 12.0, "one lost"),
    ]
    assert rows[0]["outcome"] == "survived" and rows[0]["lost"] == 0
    assert rows[0]["seconds"] == 301.3 and rows[0]["recoveries"] == []
    assert (rows[1]["outcome"], rows[1]["lost"]) == ("recoverable", 1)
    assert reliability.planned(reliability.QUICK, "kill9") == 3
    assert reliability.planned(reliability.FULL, "watch") == 1
    with pytest.raises(ValueError, match="11 of 10"):
        reliability.row("sigterm", 10, 11, 1.0, "")

    console = Console(record=True, width=200)
    console.print(reliability.table(rows))
    text = console.export_text()
    assert "20 survived" in text and "9 recoverable" in text and "301" in text

    monkeypatch.setattr(bench.machine, "describe", lambda allocator=None: {"cpus": 2})
    document = reliability.report(quick, rows, 400.0)
    assert document["command"] == "python -m bench.reliability --quick"
    assert document["sizes"]["kills"] == 3 and document["machine"] == {"cpus": 2}
    assert [r["part"] for r in document["parts"]] == ["oom", "kill9"]
    assert document["all_ok"] is False

    # The children's output: the result line, the announced updates, the resume.
    line = reliability.RESULT_MARK + '{"a": 1}'
    assert reliability.parse_result(0, f"x\n{line}\n", "") == {"a": 1}
    with pytest.raises(RuntimeError, match="child exited 1"):
        reliability.parse_result(1, "", "Traceback")
    stdout = "UPDATE 17\nUPDATE 18\n"
    said = "memfit: resuming from /b/memfit-backup.npz at update 16 (epoch 2)"
    assert reliability.resumed_at(stdout, said, 16)
    assert not reliability.resumed_at(stdout, "", 16)  # it never said so
    assert not reliability.resumed_at("UPDATE 1\n", said, 16)  # it started again
    assert reliability.last_update(stdout) == 18


def test_unet_is_a_segmenter_trained_on_integer_masks() -> None:
    """The holdout's U-Net: per-pixel softmax, and memfit synthesises `(b, h, w)` masks."""
    from bench.models import accuracy_model
    from memfit.workload.workload import Workload

    model, data = accuracy_model("UNet", 32, 2, None)
    assert data is None and tuple(model.output.shape) == (None, 32, 32, 4)
    assert {layer.__class__.__name__ for layer in model.layers} >= {
        "Conv2DTranspose",
        "Concatenate",
    }
    workload = Workload(model, optimizer="adam", loss="sparse_categorical_crossentropy")
    x, y = workload.batch(2)
    assert tuple(x.shape) == (2, 32, 32, 3) and tuple(y.shape) == (2, 32, 32)


# -- grappler config check -------------------------------------------------------------------


def test_grappler_config_settings_change_memfits_config() -> None:
    from tensorflow.core.protobuf import rewriter_config_pb2

    from bench.grappler_config import changed_config, parse_settings

    settings = parse_settings(["remapping=OFF", "memory_optimization=NO_MEM_OPT"])
    rewrite = changed_config(settings).graph_options.rewrite_options
    assert rewrite.remapping == rewriter_config_pb2.RewriterConfig.OFF
    assert rewrite.memory_optimization == rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    assert rewrite.disable_tfg_optimizer  # memfit's own choices stay
    with pytest.raises(SystemExit, match="FIELD=VALUE"):
        parse_settings(["remapping"])
    with pytest.raises(ValueError, match="no field"):
        changed_config({"no_such_pass": "OFF"})


def test_every_accuracy_model_has_a_family_and_there_are_eight_or_more() -> None:
    from bench.estimate_accuracy import FAMILY, HOLDOUT, NEW, TUNED_ON, UNSEEN

    models = {s.model for s in TUNED_ON + UNSEEN + HOLDOUT + NEW}
    assert models <= set(FAMILY)
    assert len({FAMILY[m] for m in models}) >= 8


def test_calibration_holds_each_family_out_and_counts_it_alone() -> None:
    from bench.calibration import conformal_quantile, leave_one_family_out

    # 19 scores: k = ceil(20 * 0.95) = 19, the largest; 39: the 38th.
    assert conformal_quantile([float(i) for i in range(1, 20)]) == 19.0
    assert conformal_quantile([float(i) for i in range(1, 40)]) == 38.0

    def row(family: str, measured: int, highest: int, raced: int = 0) -> dict[str, object]:
        return {
            "family": family,
            "model": family,
            "size": 96,
            "batch_size": 2,
            "optimizer": "adam",
            "measured": measured,
            "memfit": highest,
            "memfit_highest": highest,
            "memfit_raced": raced,
        }

    # Family "a" needs 2% (others 10%), "b" 10% but its raced peak covers it, "c" needs 30%.
    rows = [row("a", 102, 100)] * 3 + [row("b", 110, 100, raced=111)] * 3 + [row("c", 130, 100)]
    result = leave_one_family_out(rows, "allowance on the highest replay", 0.5)
    families = result["families"]
    assert families["a"]["value"] == pytest.approx(0.0)  # from b's 0s and c's 30%: median 0
    assert families["a"]["covered"] == 0  # 2% needed, none given
    assert families["b"]["covered"] == 3  # covered by its raced peak whatever the allowance
    assert families["c"]["value"] == pytest.approx(0.02) and families["c"]["covered"] == 0
    assert result["n"] == 7 and result["covered"] == 3
