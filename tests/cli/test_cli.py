"""The CLI as a user runs it: JSON outputs and one-line errors (exit 2, no traceback)."""

import json

import pytest
from helpers import run_cli


def _assert_one_line_error(proc, fragment):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("memfit: error:")
    assert fragment in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["doctor", "--memory", "banana"], "'banana' is not a memory size"),
        (["doctor", "--memory=-1"], "negative"),
        (["doctor", "--memory", "0"], "zero"),
        (["measure", "keras.applications.MobileNetV2", "--memory", "banana"], "not a memory size"),
        (["doctor", "--device", "NotACard"], "T4, L4, V100-16GB"),
        (["measure", "does/not/exist.keras"], "does not exist"),
        (["measure", "keras.applications.MobileNetV2", "--batch-size", "0"], "batch size"),
        (["measure", "keras.applications.MobileNetV2", "--batch-size", "4,x"], "batch size"),
        (["measure"], "Missing argument 'MODEL'"),
        (
            ["measure", "keras.applications.MobileNetV2", "--memory", "1GiB", "--device", "T4"],
            "not both",
        ),
    ],
)
def test_user_errors_are_one_line(args, fragment):
    _assert_one_line_error(run_cli(*args), fragment)


def test_model_errors_are_one_line(tmp_path):
    bad = tmp_path / "notes.keras"
    bad.write_text("hello")
    _assert_one_line_error(run_cli("measure", str(bad)), "not a Keras model file")
    (tmp_path / "fac.py").write_text(
        "def boom():\n    raise RuntimeError('weights file is corrupt')\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    _assert_one_line_error(
        run_cli("measure", "fac:missing_factory", env=env), "has no 'missing_factory'"
    )
    _assert_one_line_error(run_cli("measure", "fac:boom", env=env), "weights file is corrupt")


def test_every_command_has_help():
    for command in ([], ["doctor"], ["measure"]):
        proc = run_cli(*command, "--help")
        assert proc.returncode == 0 and "Usage:" in proc.stdout
    assert "--json" in run_cli("measure", "--help").stdout
    assert "--memory" in run_cli("doctor", "--help").stdout


def test_doctor_json_shows_cpu_and_the_emulated_budget():
    proc = run_cli("doctor", "--json", "--memory", "1GiB")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    cpu = next(d for d in data["devices"] if d["name"] == "CPU:0")
    assert cpu["total_bytes"] > 0 and cpu["free_bytes"] > 0
    assert data["emulated_budget"]["usable_bytes"] == 2**30
    assert data["budget"]["usable_bytes"] == 2**30


def test_doctor_table():
    proc = run_cli("doctor", "--device", "T4")
    assert proc.returncode == 0, proc.stderr
    assert "CPU:0" in proc.stdout and "emulating T4" in proc.stdout


@pytest.mark.slow
def test_measure_json_reports_the_peak_in_bytes():
    proc = run_cli(
        "measure",
        "keras.applications.MobileNetV2",
        "--input-shape",
        "96,96,3",
        "--batch-size",
        "4",
        "--repeats",
        "2",
        "--memory",
        "1GiB",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["oom"] is False
    assert (
        isinstance(data["peak_bytes"], int) and data["resident_bytes"] < data["peak_bytes"] <= 2**30
    )
    assert data["step_seconds"] > 0
    assert data["budget"]["usable_bytes"] == 2**30


def test_measure_table_reports_oom(tmp_path):
    proc = run_cli(
        "measure",
        "keras.applications.MobileNetV2",
        "--input-shape",
        "64,64,3",
        "--batch-size",
        "2,256",
        "--memory",
        "128MiB",
        "--repeats",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    assert "out of memory" in proc.stdout and "fits" in proc.stdout


def test_bad_environment_budget_is_one_line():
    proc = run_cli("doctor", env={"MEMFIT_MEMORY": "banana"})
    _assert_one_line_error(proc, "MEMFIT_MEMORY=banana")


def test_a_what_if_row_says_whether_it_saves_or_adds_memory():
    from memfit.cli.estimation import _effect

    # A what-if can raise the peak (a smaller batch can need more convolution scratch).
    assert _effect(3 << 20) == "saves 3.00 MiB"
    assert _effect(-(768 << 10)) == "adds 768.00 KiB"
    assert _effect(None) == ""


def _leave_with(monkeypatch, code, *, tensorflow=True, threads=()):
    """`memfit.cli.app._leave(code)`, its exits recorded instead of taken."""
    import sys
    import threading
    import types

    import memfit.cli.app as cli_module

    calls = []
    if tensorflow:
        fake = sys.modules.get("tensorflow") or types.ModuleType("tensorflow")
        monkeypatch.setitem(sys.modules, "tensorflow", fake)
    else:
        monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    main = threading.main_thread()
    monkeypatch.setattr(threading, "enumerate", lambda: [main, *threads])
    monkeypatch.setattr(cli_module.atexit, "_run_exitfuncs", lambda: calls.append("atexit"))
    monkeypatch.setattr(cli_module.os, "_exit", lambda status: calls.append(("_exit", status)))
    try:
        cli_module._leave(code)
    except SystemExit as exc:
        calls.append(("sys.exit", exc.code))
    return calls


def test_leaving_runs_the_exit_handlers_then_skips_tensorflows_teardown(monkeypatch):
    assert _leave_with(monkeypatch, 3) == ["atexit", ("_exit", 3)]


def test_leaving_waits_for_other_threads_and_needs_tensorflow_to_skip(monkeypatch):
    import types

    worker = types.SimpleNamespace(daemon=False)  # a thread still writing, say
    assert _leave_with(monkeypatch, 0, threads=[worker]) == [("sys.exit", 0)]
    daemon = types.SimpleNamespace(daemon=True)
    assert _leave_with(monkeypatch, 0, threads=[daemon]) == ["atexit", ("_exit", 0)]
    assert _leave_with(monkeypatch, 2, tensorflow=False) == [("sys.exit", 2)]


def test_the_console_entry_keeps_exit_handlers_and_the_status(tmp_path):
    import subprocess
    import sys

    marker = tmp_path / "handler-ran"
    code = (
        "import atexit, sys, tensorflow\n"
        "from memfit.cli import run\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('yes'))\n"
        "sys.argv = ['memfit', 'doctor', '--memory', 'banana']\n"
        "run()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "not a memory size" in proc.stderr
    assert marker.read_text() == "yes"


def _with_tests_on_path() -> dict[str, str]:
    """PYTHONPATH for the CLI's child processes: the test modules (`option_models`) ahead of
    the memfit under test (kept, not replaced: a worktree's own memfit, say)."""
    import os

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {"PYTHONPATH": os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)}


# A dataset that repeats for ever (the Model Garden's input pipelines do) used to hang
# `memfit batch --data`: its child counted the samples one by one. Now the largest samples are
# picked among the first SAMPLES_READ (1000); a usual answer takes about 10 s.
@pytest.mark.timeout(180)
def test_batch_answers_for_a_dataset_that_repeats_for_ever():
    args = ("batch", "option_models:any_size_cnn", "--memory", "300MiB", "--max-batch", "4")
    proc = run_cli(
        *args, "--data", "option_models:repeated_samples", "--json", env=_with_tests_on_path()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["batch_size"] == 4 and data["stopped_by"] == "max_batch"
    assert data["worst_case_samples"] is True and data["samples_read"] == 1000


@pytest.mark.timeout(180)
def test_batch_answers_for_an_endless_generator_and_says_what_it_read():
    args = ("batch", "option_models:any_size_cnn", "--memory", "300MiB", "--max-batch", "2")
    data = ("--data", "option_models:endless_generator_samples", "--soak-steps", "0")
    proc = run_cli(*args, *data, env=_with_tests_on_path())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "largest batch: 2" in proc.stdout
    assert "largest of the dataset's first 1000 samples" in proc.stdout
