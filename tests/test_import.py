"""memfit without TensorFlow: imports, and says which extra to install when TF is needed."""

from pathlib import Path

from helpers import run_isolated

CHILDREN = Path(__file__).resolve().parent / "children"


def test_import_without_tensorflow_names_the_extra():
    out = run_isolated(CHILDREN / "without_tensorflow.py")
    assert out is not None
    assert 'pip install "memfit[cpu]"' in out and "memfit[gpu]" in out


def test_bad_environment_budget_raises_on_import_under_python_m(tmp_path):
    # `python -m X` (pytest, a user's package) importing memfit with a bad MEMFIT_MEMORY gets
    # the error as an exception it can catch, never SystemExit from inside `import memfit`.
    import os
    import subprocess
    import sys

    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "__init__.py").write_text("")
    (probe / "__main__.py").write_text(
        "try:\n"
        "    import memfit\n"
        "except SystemExit as exc:\n"
        "    print('exited', exc.code)\n"
        "except Exception as exc:\n"
        "    print('raised', type(exc).__name__, exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMFIT_", "TF_CPU_BFC"))}
    env["MEMFIT_MEMORY"] = "banana"
    proc = subprocess.run(
        [sys.executable, "-m", "probe"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("raised SizeError MEMFIT_MEMORY=banana"), proc.stdout
    assert "memfit: error" not in proc.stderr
