"""The child side of `memfit.process.run_in_child`: call the job's function, write its answer.

Run as `python -m memfit.process JOB` (the runner starts it): the job names a function by its
module and name (`ChildWorker` and `run_in_child` take the function itself and name it).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

# Where the call being answered writes its result (the last path): a handler that must end
# its process early writes its answer there itself (`memfit.measuring.child`).
answer_paths: list[str] = []


def _clean(text: str) -> str:
    """A model's error message on one line (its layer and cause), as `memfit.errors` makes it."""
    try:
        from memfit.errors import clean_message
    except ImportError:  # pragma: no cover - the child runs in memfit's environment
        return text
    return clean_message(text) or text


def _payload(call: Callable[[], Any]) -> dict[str, Any]:
    """Run `call`; its result, or its error as the parent re-raises it."""
    try:
        return {"result": call()}
    except Exception as exc:  # noqa: BLE001 - everything goes back to the parent
        is_memfit = "memfit.errors" in sys.modules and isinstance(
            exc, sys.modules["memfit.errors"].MemfitError
        )
        return {
            "error": {
                "type": type(exc).__name__,
                "message": str(exc) if is_memfit else _clean(str(exc)),
                "memfit": is_memfit,
                "traceback": traceback.format_exc(),
            }
        }


def write_answer(path: str, payload: dict[str, Any]) -> None:
    # Written whole, then renamed: the parent polls for the file and must never see half.
    with open(path + ".part", "w") as handle:
        json.dump(payload, handle)
    os.replace(path + ".part", path)


def _function(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def main(argv: list[str]) -> int:
    with open(argv[1]) as handle:
        job = json.load(handle)

    def prepare() -> Any:
        # Importing any memfit module ran `memfit/__init__`, which applied MEMFIT_MEMORY before
        # TensorFlow initialises.
        from memfit.budget.emulation import ensure_memory_statistics

        ensure_memory_statistics()
        return _function(job["function"])(**job["kwargs"])

    if not job.get("serve"):
        answer_paths.append(job["result"])
        write_answer(job["result"], _payload(prepare))
        return 0
    # Serving: the function returned a handler; answer one request per stdin line.
    handler: list[Any] = []
    ready = _payload(lambda: handler.append(prepare()))
    write_answer(job["result"], ready)
    if "error" in ready:
        return 0
    for line in sys.stdin:
        request = json.loads(line)
        answer_paths.append(request["result"])
        write_answer(request["result"], _payload(lambda r=request: handler[0](**r["kwargs"])))
    return 0
