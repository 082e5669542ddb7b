"""The watch log: JSON lines that `memfit.Watch` writes and `memfit report` reads.

One file holds one or more runs (one per `fit` a `Watch` watched). Each run starts with a
`header` line (`"tool": "memfit.watch"`, the format, the device, the budget, the run's
configuration), then `step` lines, `finding` lines and `epoch` lines in the order they
happened, and an `end` line with the run's summary when it ended cleanly. Sizes are bytes
(`_bytes`), times seconds (`_seconds`).

The summary of a run (`summarize`) is computed here, from the step records, for both the
callback's `Watch.summary()` and the report.

Example:
    ```python
    from memfit.watch.log import read_log

    for run in read_log("run.jsonl"):
        print(run.name, run.summary()["peak_bytes"], [f["kind"] for f in run.findings])
    ```
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from memfit.errors import MemfitError
from memfit.serialize import json_dict

# 2: a file may hold several runs, each from its own header line; steps carry input_shape.
LOG_FORMAT = 2
TOOL = "memfit.watch"
_HINT = "give the file memfit.Watch(log_path=...) wrote"


def number(value: Any) -> Any:
    """A float for JSON, or its text when it is not finite (`"nan"`, `"inf"`)."""
    try:
        result = float(value)
    except (TypeError, ValueError):
        return str(value)
    return result if math.isfinite(result) else str(result)


def json_default(value: Any) -> Any:
    """`json.dumps` fallback: numbers (NumPy, tensors) as floats, the rest as text."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def summarize(steps: Sequence[dict[str, Any]], warmup_steps: int = 5) -> dict[str, Any]:
    """Totals over step records: steps, mean step time, input-wait share, peak memory.

    Step time and input wait leave out the first `warmup_steps` (tracing), unless the run
    is shorter.

    Args:
        steps: the step records (log step lines).
        warmup_steps: steps at the start left out of the time figures.

    Example:
        ```python
        summarize([{"step": 0, "step_seconds": 0.1, "memory_peak_bytes": 2**20}])["peak_bytes"]
        ```
    """
    timed = [s for s in steps[warmup_steps:] if _num(s.get("step_seconds"))] or [
        s for s in steps if _num(s.get("step_seconds"))
    ]
    total = sum(s["step_seconds"] for s in timed)
    waits = [s["input_wait_seconds"] for s in timed if _num(s.get("input_wait_seconds"))]
    peaks = [s["memory_peak_bytes"] for s in steps if _num(s.get("memory_peak_bytes"))]
    return {
        "steps": len(steps),
        "mean_step_seconds": round(total / len(timed), 6) if timed else None,
        "input_wait_fraction": round(sum(waits) / total, 4) if waits and total else None,
        "peak_bytes": max(peaks) if peaks else None,
    }


class LogWriter:
    """Writes a watch log: `write` one record (a dict) per line.

    The first run opens the file fresh; a later run of the same `Watch` (another `fit`)
    appends to it, from its own header line.

    Args:
        path: the log file.
        append: add to the file instead of starting it anew.

    Example:
        ```python
        writer = LogWriter("run.jsonl")
        writer.write({"type": "header", "tool": "memfit.watch", "format": LOG_FORMAT})
        writer.close()
        ```
    """

    def __init__(self, path: str, append: bool = False) -> None:
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise MemfitError(
                f"cannot write the watch log {path}: folder {directory} does not exist; "
                f"create it or choose another log_path"
            )
        self.path = path
        try:
            self._file: IO[str] | None = open(path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise MemfitError(
                f"cannot write the watch log {path} ({exc.strerror}); choose another log_path"
            ) from None

    def write(self, record: dict[str, Any]) -> None:
        """Write one record as a JSON line."""
        if self._file is not None:
            self._file.write(json.dumps(record, default=json_default) + "\n")

    def write_steps(
        self,
        records: Sequence[dict[str, Any]],
        start: int,
        loss_of: Callable[[int], float | None],
        final: bool = False,
    ) -> int:
        """Write step lines from `records[start]` on, each with its loss; returns where it stopped.

        A step's loss may come later than its record (Keras logs it after the step): the
        lines wait for it, unless `final` or 64 of them are waiting (then `"loss": null`).

        Args:
            records: the run's step records, in step order.
            start: the first record not written yet.
            loss_of: a step's own loss, or None when it has not arrived.
            final: write every record, whether its loss arrived or not.
        """
        end = len(records)
        while start < end:
            record = records[start]
            loss = loss_of(record["step"])
            if loss is None and not final and end - start < 64:
                break
            self.write({**record, "loss": None if loss is None else number(loss)})
            start += 1
        return start

    def flush(self) -> None:
        """Hand what was written to the operating system (a killed run keeps it)."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Close the file; later writes are ignored."""
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass
class Run:
    """One watched fit, as read from its part of a JSON-lines log.

    Attributes:
        path: the log file.
        header: the run's configuration (its header line).
        steps: one dict per training step.
        findings: one dict per finding.
        epochs: one dict per finished epoch.
        end: the closing summary line, when the run ended cleanly.
        index: which run of the file it is (0 for the first).
        explanations: `{"type": "explain", ...}` lines: what was alive at a measured peak
            (`memfit.measuring.explain.Explanation.to_dict()`), shown in the report.
    """

    path: str
    header: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    index: int = 0
    explanations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The run's name (the model's, unless `Watch(name=...)` gave one)."""
        return str(self.header.get("name") or "run")

    def summary(self) -> dict[str, Any]:
        """Totals: steps, mean step time, input wait share, peak memory, estimate error."""
        warmup = self.header.get("warmup_steps")
        totals = summarize(self.steps, warmup if isinstance(warmup, int) else 5)
        peak = totals["peak_bytes"]
        estimate = self.header.get("estimate_peak_bytes")
        return {
            "name": self.name,
            "run": self.index,
            **totals,
            "epochs": len(self.epochs),
            "finished": self.end is not None,
            "budget_bytes": self.header.get("budget_bytes"),
            "estimate_peak_bytes": estimate,
            "estimate_error_fraction": round((estimate - peak) / peak, 4)
            if _num(estimate) and peak
            else None,
            "watch_overhead_fraction": (self.end or {}).get("watch_overhead_fraction"),
            "findings": len(self.findings),
        }

    def to_dict(self) -> dict[str, Any]:
        """The run as JSON: header, summary, findings."""
        return json_dict(self, "header summary findings", summary=self.summary())


def read_log(path: str | os.PathLike[str]) -> list[Run]:
    """Read a watch log: one `Run` per fit; a `MemfitError` says what is wrong with it.

    Args:
        path: the file `Watch(log_path=...)` wrote.

    Example:
        ```python
        runs = read_log("run.jsonl")
        print(len(runs), runs[-1].summary()["steps"])
        ```
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MemfitError(f"no such file: {path}; {_HINT}")
    if os.path.isdir(path):
        raise MemfitError(f"{path} is a folder, not a watch log; {_HINT}")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise MemfitError(f"cannot read {path} as a watch log ({exc}); {_HINT}") from None
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise MemfitError(f"{path} is empty: the run wrote nothing (did it start?); {_HINT}")
    runs: list[Run] = []
    for number_, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            last = number_ == len(lines) and not text.endswith("\n")
            what = (
                "is cut off (the run may have been killed while writing it); delete that "
                "line to report the rest"
                if last
                else f"is not JSON ({exc.msg}); the log is damaged"
            )
            raise MemfitError(f"{path} line {number_} {what}") from None
        if not isinstance(data, dict) or "type" not in data:
            raise MemfitError(f"{path} line {number_} is not a memfit watch log line; {_HINT}")
        kind = data["type"]
        if kind == "header":
            if data.get("tool") != TOOL:
                raise MemfitError(
                    f"{path} line {number_} is a header of another tool ({data.get('tool')!r}), "
                    f"not memfit.watch; {_HINT}"
                )
            if int(data.get("format", 0) or 0) > LOG_FORMAT:
                raise MemfitError(
                    f"{path} was written by a newer memfit (log format {data.get('format')}); "
                    f"upgrade memfit to report it"
                )
            runs.append(Run(path=path, header=data, index=len(runs)))
            continue
        if not runs:
            raise MemfitError(
                f"{path} does not start with a memfit watch header (line {number_} is a "
                f"{str(kind)[:20]!r} line), so it is not a whole watch log: its header line "
                f"is missing; {_HINT}"
            )
        run = runs[-1]
        if kind == "step":
            if not isinstance(data.get("step"), int):
                raise MemfitError(f"{path} line {number_} is a step line without a step number")
            run.steps.append(data)
        elif kind == "finding":
            run.findings.append(data)
        elif kind == "epoch":
            run.epochs.append(data)
        elif kind == "end":
            run.end = data
        elif kind == "explain":  # a `Measurement.explanation.to_dict()`, shown by the report
            run.explanations.append(data)
    return runs
