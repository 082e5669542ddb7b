"""Call a user's `package.module:factory`: import its module, call it, say clearly what failed.

Models, datasets and Model Garden configs are all named this way on the command line and in
child processes.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from memfit.errors import ModelLoadError


def call_factory(spec: str) -> Any:
    """Import `package.module` of a `package.module:factory` spec and return `factory()`.

    The current directory is put on the import path. Whatever the import or the call raises, and a
    missing or uncallable `factory`, becomes a `ModelLoadError` that says which.
    """
    module_name, _, attr = spec.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ModelLoadError(
                f"cannot import module {module_name!r} for {spec!r}: no such module (searched "
                f"the current directory and the installed packages)"
            ) from None
        raise ModelLoadError(f"importing {module_name!r} failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - user code: report, don't crash
        raise ModelLoadError(
            f"importing {module_name!r} raised {type(exc).__name__}: {first_line(str(exc))}"
        ) from None
    factory = getattr(module, attr, None)
    if factory is None:
        public = sorted(
            name
            for name, value in vars(module).items()
            if callable(value)
            and not name.startswith("_")
            and getattr(value, "__module__", None) == module.__name__
        )
        listing = f"; callables there: {', '.join(public)}" if public else ""
        raise ModelLoadError(f"module {module_name!r} has no {attr!r}{listing}")
    if not callable(factory):
        raise ModelLoadError(f"{spec!r} is a {type(factory).__name__}, not a callable factory")
    try:
        return factory()
    except Exception as exc:  # noqa: BLE001 - user code: report, don't crash
        raise ModelLoadError(
            f"factory {spec!r} raised {type(exc).__name__}: {first_line(str(exc))}"
        ) from None


def first_line(text: str) -> str:
    """The first non-blank line of an error text, stripped, at most 400 characters."""
    return next((line.strip() for line in text.splitlines() if line.strip()), text)[:400]
