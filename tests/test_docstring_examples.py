"""Every public docstring example runs, as written.

The examples are collected from the docstrings (`docstring_examples.collect`: every name in
`memfit.__all__` and the public methods of its classes), so a new one is covered without
editing this file. They run for real in child processes, one per emulated budget (emulation
is fixed once TensorFlow initialises), with the placeholder names they use (`model`, `x`,
`train_ds`, `mypkg.models:build`, ...) supplied as `docstring_examples` documents.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from docstring_examples import Example, collect, emulation_key, run_example

import memfit

TESTS = Path(__file__).resolve().parent
EXAMPLES = collect()


def example_param(example: Example) -> Any:
    return pytest.param(example.name, marks=[pytest.mark.slow], id=example.name)


def documented_examples() -> set[str]:
    """Public names whose own docstring has an "Example:" section, found independently."""
    heading = re.compile(r"^\s*Examples?:\s*$", re.M)
    found = set()
    for name in memfit.__all__:
        obj = getattr(memfit, name)
        if heading.search(getattr(obj, "__doc__", None) or ""):
            found.add(name)
        if isinstance(obj, type):
            for attr, member in vars(obj).items():
                member = getattr(member, "fget", getattr(member, "__func__", member))
                doc = getattr(member, "__doc__", None) or ""
                if not attr.startswith("_") and heading.search(doc):
                    found.add(f"{name}.{attr}")
    return found


def test_every_public_example_is_collected():
    collected = {example.name for example in EXAMPLES}
    documented = documented_examples()
    assert documented, "no public docstring has an Example section"
    assert documented <= collected, f"not collected: {sorted(documented - collected)}"
    for example in EXAMPLES:
        compile(example.code, f"<{example.name} example>", "exec")
        assert example.code.strip(), f"{example.name}: an Example section with no code"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every example's outcome: the children, one per emulated budget, run side by side."""
    groups: dict[str, list[str]] = {}
    for example in EXAMPLES:
        groups.setdefault(emulation_key(example), []).append(example.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMFIT_", "TF_CPU_BFC"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    # mypkg (tests/mypkg) for the examples and for the children memfit starts from them.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    started = time.perf_counter()
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = []
    for i, (key, names) in enumerate(groups.items()):
        cwd = tmp_path_factory.mktemp(f"examples{i}")  # files they write (run.jsonl) go here
        results, log = cwd / "results.json", cwd / "stderr.txt"
        with open(log, "w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, str(TESTS / "docstring_examples.py"), str(results), key, *names],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        children.append((proc, results, log, names))
    outcomes: dict[str, Any] = {}
    for proc, results, log, names in children:
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        got = json.loads(results.read_text()) if results.exists() else {}
        for name in names:
            outcomes[name] = got.get(name) or {
                "ok": False,
                "error": f"the child exited {proc.returncode} before it ran:\n"
                + log.read_text()[-4000:],
            }
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
    slowest = sorted(outcomes, key=lambda name: -outcomes[name].get("seconds", 0))[:4]
    print(
        f"\ndocstring examples: {len(outcomes)} in {time.perf_counter() - started:.1f} s "
        f"({cpu_s:.1f} s CPU, {len(children)} processes); slowest: "
        + ", ".join(f"{name} {outcomes[name].get('seconds', 0)} s" for name in slowest)
    )
    return outcomes


def failure(name: str, outcome: dict[str, Any]) -> str | None:
    """What a test says of an example that failed (its name and its error), else None."""
    return None if outcome["ok"] else f"the {name} docstring example fails:\n{outcome['error']}"


def test_a_broken_example_fails_with_its_name_and_error():
    broken = Example("parse_size", "memfit.sizes", "```python\nparse_size('two gigs')\n```")
    message = failure(broken.name, run_example(broken))
    assert message and "the parse_size docstring example fails" in message
    assert "SizeError" in message and "two gigs" in message
    wrong = Example("format_size", "memfit.sizes", ">>> format_size(1024)\n'2.00 KiB'")
    message = failure(wrong.name, run_example(wrong))
    assert message and "Expected:" in message and "1.00 KiB" in message
    passing = Example("get_card", "memfit.budget.cards", ">>> 1\n1")
    assert failure("get_card", run_example(passing)) is None


@pytest.mark.parametrize("name", [example_param(example) for example in EXAMPLES])
def test_example_runs(name: str, outcomes: dict[str, Any]):
    message = failure(name, outcomes[name])
    if message:
        pytest.fail(message, pytrace=False)
