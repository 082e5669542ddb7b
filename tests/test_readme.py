"""The README's examples run: its "Python API" block, as it stands, in a fresh process."""

from __future__ import annotations

import os
import pty
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import click
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_api_block() -> str:
    """The first ```python block under the README's "## Python API" heading."""
    text = README.read_text()
    section = text[text.index("\n## Python API\n") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no python block under '## Python API'"
    return match.group(1)


def test_python_api_block_defines_what_it_uses():
    # The new user's NameError: `memfit.fit(model, x, y, ...)` with no x or y.
    code = python_api_block()
    compile(code, "README.md", "exec")
    assert re.search(r"^x = ", code, re.M) and re.search(r"^y = ", code, re.M)


@pytest.mark.slow
def test_python_api_block_runs_and_shows_progress_in_a_terminal(tmp_path):
    # stderr is a terminal (a pty), as for a user at a shell: find_batch_size and plan show
    # their progress by default (~7 minutes without a line).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMFIT_", "TF_CPU_BFC"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    script = tmp_path / "python_api.py"
    script.write_text(python_api_block())
    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:  # a pty holds a few KiB: read it while the child writes
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            timeout=600,
        )
    finally:
        os.close(slave)
        reader.join(timeout=10)
        os.close(master)
    err = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0, err[-3000:]
    assert "memfit: finding the largest batch size" in err, err[-3000:]
    assert re.search(r"trial +\d+: ", err), err[-3000:]
    assert "memfit: planning batch 128" in err, err[-3000:]
    assert "largest batch:" in proc.stdout and "batch 128:" in proc.stdout, proc.stdout


def readme_commands() -> list[list[str]]:
    """Every `memfit ...` line of the README's ```bash blocks, as its arguments."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    return [shlex.split(line, comments=True)[1:] for line in lines if line.startswith("memfit ")]


def parsed(command: click.Command, args: list[str], parent: Any = None, name: str = "memfit"):
    """The context click makes of `args` for `command`, down to the subcommand; nothing runs."""
    ctx = command.make_context(name, list(args), parent=parent)
    if isinstance(command, click.Group):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        sub_name, sub, rest = command.resolve_command(ctx, rest)
        return parsed(sub, rest, ctx, sub_name)
    return ctx


def test_every_readme_command_is_a_valid_command_line():
    # The commands are a user's (their .keras file, their TFRecords, a T4 plan of ResNet50 at
    # batch 256 that takes an hour on a CPU): each is parsed as `memfit` would parse it, every
    # option and value checked, without running it. The Python blocks run (test above and
    # tests/test_docstring_examples.py).
    from memfit.cli import cli

    commands = readme_commands()
    assert len(commands) >= 8, commands
    for args in commands:
        ctx = parsed(cli, args)
        assert ctx.command.name == args[0] or ctx.parent.command.name == args[0], args
    with pytest.raises(click.UsageError):  # what a wrong example would meet
        parsed(cli, ["plan", "keras.applications.ResNet50", "--batch-size", "many"])
    with pytest.raises(click.UsageError):
        parsed(cli, ["measure", "keras.applications.ResNet50", "--no-such-option"])
