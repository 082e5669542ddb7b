"""`memfit.doctor()`: facts and findings, and it never initialises TensorFlow."""

from pathlib import Path

from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"


def test_doctor_reports_cpu_and_leaves_tensorflow_uninitialised():
    out = run_isolated(CHILDREN / "uninitialised.py")
    assert out["initialised_after"] is False
    assert out["logical_cpus"] == 2
    cpu = next(d for d in out["devices"] if d["name"] == "CPU:0")
    assert cpu["total_bytes"] > 0 and 0 < cpu["free_bytes"] <= cpu["total_bytes"]
    assert out["versions"]["tensorflow"]
    assert out["ok"] is True and out["problems"] == 0
    assert {f["level"] for f in out["findings"]} <= {"ok", "warning", "problem"}
    assert out["emulated_budget"] is None


def test_doctor_flags_an_emulation_that_came_too_late():
    out = run_isolated(CHILDREN / "too_late.py")
    assert out["ok"] is False
    problem = next(f for f in out["findings"] if f["level"] == "problem")
    assert problem["topic"] == "emulation" and "memfit.emulate()" in problem["fix"]


def test_a_card_larger_than_the_host_is_one_warning_line():
    # A new user's finding: `--memory 999999999TiB` on a CPU was accepted without a
    # word about the host's RAM.
    import json

    from helpers import run_cli

    proc = run_cli("doctor", "--memory", "999999999TiB", "--json")
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if line.startswith("memfit: warning:")]
    assert len(warned) == 1, proc.stderr
    assert "of RAM" in warned[0] and "Emulate a budget under" in warned[0]
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    emulation = next(f for f in report["findings"] if f["topic"] == "emulation")
    assert emulation["level"] == "warning", emulation
    assert "more than this machine's" in emulation["message"]


def test_emulate_warns_in_python_when_the_card_is_larger_than_the_host():
    out = run_isolated(CHILDREN / "larger_than_host.py")
    assert len(out) == 1 and "of RAM" in out[0], out


def test_doctor_reports_keras_2_absent_and_a_legacy_switch_without_it():
    # tf_keras is not installed in this environment (tests/garden/test_tf_keras_doctor.py has it).
    out = run_isolated(CHILDREN / "legacy_keras.py")
    assert out["initialised"] is False and out["imported"] is False
    plain, switched = out["plain"], out["switched"]
    assert plain["legacy_keras"] == {
        "tf_keras_version": None,
        "tf_use_legacy_keras": False,
        "model_garden_version": None,
    }
    assert plain["versions"]["tf_keras"] is None
    assert not [f for f in plain["findings"] if f["topic"] in ("tf_keras", "model garden")]
    assert switched["legacy_keras"]["tf_use_legacy_keras"] is True
    (problem,) = [f for f in switched["findings"] if f["topic"] == "tf_keras"]
    assert problem["level"] == "problem" and "tf_keras is not installed" in problem["message"]
    assert "pip install tf_keras" in problem["fix"] and switched["ok"] is False
