"""Test utilities: run code in a fresh Python process (own TensorFlow, own emulated budget)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from child import RESULT_MARK

TESTS = Path(__file__).resolve().parent


def run_isolated(
    code: str | Path,
    env: dict[str, str] | None = None,
    timeout: int = 600,
    args: dict[str, Any] | None = None,
) -> Any:
    """Run `code` in a child Python process and return what it passed to `emit(...)`.

    `code` is a child script's path (a file that imports `emit` from `tests/child.py`, so
    ruff checks it), or Python source, which gets a function `emit(obj)` of its own. Either
    sends one JSON-serialisable result back. A script's parameters go in as `args`, a
    JSON-serialisable dict it reads with `child.arguments()`. Budgets go in through `env`
    (e.g. {"MEMFIT_MEMORY": "384MiB"}) so they are applied before TensorFlow initialises. A
    child that fails raises AssertionError with its stderr.
    """
    prelude = textwrap.dedent(
        f"""
        import json as _json
        def emit(obj):
            print({RESULT_MARK!r} + _json.dumps(obj), flush=True)
        """
    )
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMFIT_", "TF_CPU_BFC"))}
    child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    child_env.update(env or {})
    if isinstance(code, Path):
        path = child_env.get("PYTHONPATH", "")
        child_env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *([path] if path else [])])
        command = [sys.executable, str(code)]
        if args is not None:
            command.append(json.dumps(args))
    else:
        if args is not None:
            raise TypeError("run_isolated: args are for a child script's path, not source")
        command = [sys.executable, "-c", prelude + textwrap.dedent(code)]
    proc = subprocess.run(
        command,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    results = [
        line[len(RESULT_MARK) :]
        for line in proc.stdout.splitlines()
        if line.startswith(RESULT_MARK)
    ]
    if proc.returncode != 0 or not results:
        raise AssertionError(
            f"child exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
            f"--- stderr\n{proc.stderr[-5000:]}"
        )
    return json.loads(results[-1])


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    """Run `memfit ARGS...` as a user would, in a fresh process."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMFIT_", "TF_CPU_BFC"))}
    child_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "memfit", *args],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
