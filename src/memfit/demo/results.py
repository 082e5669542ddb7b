"""What the demo showed: each step's claim, verdict and figures, and the whole run's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit.serialize import json_dict


@dataclass
class StepResult:
    """One demo step: what it claims, whether the run showed it, and its figures."""

    name: str
    claim: str
    ok: bool
    seconds: float
    command: str
    details: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None


@dataclass
class DemoResult:
    """Every step's result, the report's path, and the verdict."""

    steps: list[StepResult]
    report_path: str | None
    memory: str
    seconds: float

    @property
    def ok(self) -> bool:
        """Whether every step showed what it claims."""
        return all(s.ok for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return json_dict(
            self, "ok memory report_path demo_seconds steps", demo_seconds=round(self.seconds, 1)
        )
