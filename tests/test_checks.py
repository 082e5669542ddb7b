"""The shared argument checks: one text per mistake, the same wherever it is made (no TF)."""

import importlib

import numpy as np
import pytest
from click.testing import CliRunner

import memfit
from memfit import checks
from memfit.checks import takes_options
from memfit.errors import DataError, MemfitError, WorkloadError

BATCH = "batch size must be a whole number of at least 1, got "
MARGIN = "margin must be a share of the budget from 0 to below 1, got "


@pytest.mark.parametrize("good", [1, 32, np.int64(8), np.int32(1)])
def test_a_batch_size_is_a_whole_number_of_at_least_1(good):
    assert checks.check_batch_size(good) == int(good)
    assert type(checks.check_batch_size(good)) is int


@pytest.mark.parametrize(
    ("bad", "shown"),
    [
        (0, "0"),
        (-3, "-3"),
        (2.5, "2.5"),
        (8.0, "8.0"),
        ("8", "'8'"),
        (True, "True"),
        (None, "None"),
    ],
)
def test_a_bad_batch_size_has_one_text(bad, shown):
    with pytest.raises(WorkloadError) as caught:
        checks.check_batch_size(bad)
    assert str(caught.value) == BATCH + shown


def test_a_caller_keeps_its_error_class():
    with pytest.raises(DataError, match="^" + BATCH + "0$"):
        checks.check_batch_size(0, error=DataError)
    with pytest.raises(DataError, match="^max_objects must be a whole number of at least 1"):
        checks.check_positive_int(0, "max_objects", error=DataError)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", False])
def test_a_count_names_itself(bad):
    with pytest.raises(WorkloadError) as caught:
        checks.check_positive_int(bad, "micro_batches")
    assert str(caught.value) == f"micro_batches must be a whole number of at least 1, got {bad!r}"
    assert checks.check_positive_int(np.int16(3), "micro_batches") == 3


def test_soak_steps_may_be_0():
    assert checks.check_soak_steps(0) == 0
    assert checks.check_soak_steps(20) == 20
    for bad in (-1, 2.0, "20", True):
        with pytest.raises(WorkloadError) as caught:
            checks.check_soak_steps(bad)
        assert str(caught.value) == f"soak_steps must be a whole number of at least 0, got {bad!r}"


@pytest.mark.parametrize("good", [0, 0.0, 0.05, 0.999, np.float32(0.1)])
def test_a_margin_is_a_share_from_0_to_below_1(good):
    assert checks.check_margin(good) == pytest.approx(float(good))
    assert type(checks.check_margin(good)) is float


@pytest.mark.parametrize("bad", [1, 1.0, 1.5, -0.01, float("nan"), "0.05", None, True])
def test_a_bad_margin_has_one_text(bad):
    with pytest.raises(MemfitError) as caught:
        checks.check_margin(bad)
    assert str(caught.value) == MARGIN + repr(bad)


def test_the_default_margin_is_defined_once():
    assert checks.DEFAULT_MARGIN == 0.05
    for name in ("memfit.planning", "memfit.search"):
        assert importlib.import_module(name).DEFAULT_MARGIN is checks.DEFAULT_MARGIN


# -- the same text from every entry point (each checks before it loads anything) --------------
def test_the_python_api_says_the_same_about_a_bad_batch_size():
    calls = {
        "measure": lambda: memfit.measure(object(), 0),
        "measure_many": lambda: memfit.measure_many(object(), [4, 0]),
        "estimate": lambda: memfit.estimate("keras.applications.MobileNetV2", 0),
        "plan": lambda: memfit.plan("keras.applications.MobileNetV2", 0, budget="1GiB"),
    }
    for name, call in calls.items():
        with pytest.raises(WorkloadError) as caught:
            call()
        assert str(caught.value) == BATCH + "0", name
    with pytest.raises(DataError, match="^" + BATCH + "0$"):
        memfit.data.check("no-such-*.tfrecord", batch_size=0)


def test_the_python_api_says_the_same_about_a_bad_margin_and_counts():
    model = "keras.applications.MobileNetV2"
    for call in (
        lambda: memfit.plan(model, 8, budget="1GiB", margin=1.5),
        lambda: memfit.find_batch_size(
            model, budget="1GiB", margin=1.5, options=memfit.Options(isolated=True)
        ),
    ):
        with pytest.raises(MemfitError) as caught:
            call()
        assert str(caught.value) == MARGIN + "1.5"
    with pytest.raises(WorkloadError, match="^repeats must be a whole number of at least 1"):
        memfit.measure(object(), 4, options=memfit.Options(repeats=0))
    with pytest.raises(WorkloadError, match="^confirm_steps must be a whole number of at least"):
        memfit.plan(model, 8, budget="1GiB", options=memfit.Options(confirm_steps=0))
    with pytest.raises(WorkloadError, match="^max_batch must be a whole number of at least 1"):
        memfit.find_batch_size(
            model, budget="1GiB", max_batch=0, options=memfit.Options(isolated=True)
        )
    with pytest.raises(WorkloadError, match="^soak_steps must be a whole number of at least 0"):
        memfit.find_batch_size(
            model, budget="1GiB", options=memfit.Options(soak_steps=-1, isolated=True)
        )


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["measure", "keras.applications.MobileNetV2", "-b", "0"], BATCH + "0"),
        (["measure", "keras.applications.MobileNetV2", "-b", "4,x"], BATCH + "'x'"),
        (["batch", "keras.applications.MobileNetV2", "--margin", "1.5"], MARGIN + "1.5"),
        (
            ["batch", "keras.applications.MobileNetV2", "--max-batch", "0"],
            "max_batch must be a whole number of at least 1, got 0",
        ),
        (["plan", "keras.applications.MobileNetV2", "-b", "8", "--margin", "1"], MARGIN + "1.0"),
    ],
)
def test_the_cli_options_say_the_same(args, text):
    from memfit.cli import cli

    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert text in " ".join(result.output.split()), result.output


def test_the_cli_estimate_says_the_same():
    from memfit.cli import cli

    result = CliRunner().invoke(cli, ["estimate", "keras.applications.MobileNetV2", "-b", "0"])
    assert isinstance(result.exception, WorkloadError)
    assert str(result.exception) == BATCH + "0"


@pytest.mark.parametrize("good", ["1,2", (4, 8), [2, 16]])
def test_threads_are_two_whole_numbers(good):
    inter, intra = checks.check_threads(good)
    assert inter >= 1 and intra >= 1


@pytest.mark.parametrize("bad", ["2", "0,2", "a,b", (1, 2, 3), (1.5, 2), None])
def test_bad_threads_have_one_text(bad):
    with pytest.raises(WorkloadError, match="threads must be INTER,INTRA"):
        checks.check_threads(bad)


def test_options_knobs_given_as_keywords_still_work_with_a_deprecation_warning():
    with (
        pytest.deprecated_call(match=r"pass options=memfit.Options\(isolated=True, soak_steps=-1"),
        pytest.raises(WorkloadError, match="^soak_steps must be a whole number"),
    ):
        memfit.find_batch_size("keras.applications.MobileNetV2", isolated=True, soak_steps=-1)

    @takes_options("repeats", "isolated")
    def measure(model, *, options=None):
        return options

    with pytest.deprecated_call(match="stop working in the next release"):
        given = measure("m", repeats=2, options=memfit.Options(isolated=True))
    assert given == memfit.Options(repeats=2, isolated=True)
    assert measure("m") is None
    with pytest.raises(ValueError, match="not Options fields"):
        takes_options("no_such_knob")


def test_options_check_their_values_when_made():
    assert memfit.Options().samples is None  # None: the analysis's own default
    assert memfit.Options(threads="2,4").threads == (2, 4)
    assert memfit.Options(samples=0, soak_steps=0).soak_steps == 0
    with pytest.raises(WorkloadError, match="^samples must be a whole number of at least 0"):
        memfit.Options(samples=-1)
    with pytest.raises(WorkloadError, match="^threads must be INTER,INTRA"):
        memfit.Options(threads="two")
