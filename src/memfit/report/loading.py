"""What `memfit report` reads: a `memfit.Watch` log, or the output of `memfit measure --json`.

Example:
    ```python
    runs = load_log("run.jsonl")
    print(log_to_dict(runs)["summary"]["peak_bytes"])
    ```
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from memfit.watch.log import Run, read_log


def load_log(path: str | os.PathLike[str]) -> list[Run]:
    """Read a `memfit.Watch` JSON-lines log: one `Run` per fit it watched.

    A `MemfitError` says what is wrong with the file (missing, empty, cut off, no header).

    Args:
        path: the file `Watch(log_path=...)` wrote.

    Example:
        ```python
        runs = load_log("run.jsonl")
        print([run.summary()["peak_bytes"] for run in runs])
        ```
    """
    return read_log(path)


def log_to_dict(runs: Sequence[Run]) -> dict[str, Any]:
    """What `memfit report --json` prints: the whole log, and each fit in `runs`.

    `header` is the first fit's; `summary` covers every fit (steps added up, the highest
    peak); `findings` are all of them, each with its fit's index in `run`.
    """
    summaries = [run.summary() for run in runs]
    peaks = [s["peak_bytes"] for s in summaries if s["peak_bytes"]]
    first = summaries[0]
    summary = {
        **first,
        "fits": len(runs),
        "steps": sum(s["steps"] for s in summaries),
        "epochs": sum(s["epochs"] for s in summaries),
        "finished": all(s["finished"] for s in summaries),
        "peak_bytes": max(peaks) if peaks else None,
        "findings": sum(s["findings"] for s in summaries),
    }
    if len(runs) > 1:
        for key in ("mean_step_seconds", "input_wait_fraction", "estimate_error_fraction"):
            summary[key] = None  # per fit: see runs
    return {
        "log_path": runs[0].path,
        "header": runs[0].header,
        "summary": summary,
        "findings": [{**f, "run": run.index} for run in runs for f in run.findings],
        "runs": [run.to_dict() for run in runs],
    }


def load_measurements(path: str | os.PathLike[str]) -> list[dict[str, Any]] | None:
    """The measurements of a `memfit measure --json` file; None when `path` is not one.

    Such a file is one JSON object (a measurement, or `{"measurements": [...]}`); a watch
    log is JSON lines. With `--explain`, each measurement holds its `explanation`.

    Args:
        path: the file `memfit measure ... --json > FILE` wrote.

    Example:
        ```python
        found = load_measurements("measure.json")
        ```
    """
    try:
        with open(os.fspath(path), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(data, dict) and isinstance(data.get("measurements"), list):
        data = data["measurements"]
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(m, dict) and "peak_bytes" in m for m in items):
        return None
    return items
