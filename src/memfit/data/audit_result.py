"""What `memfit.data.audit` reports: `AuditFinding`s and the `AuditResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit.serialize import json_dict


@dataclass
class AuditFinding:
    """One thing the audit found in a pipeline.

    Attributes:
        kind: e.g. `"map_not_parallel"`, `"no_prefetch"`, `"input_bound"`.
        node: the graph node it concerns (`MapDataset/_2`), or "" for the whole pipeline.
        message: what is wrong and why it matters.
        fix: the change that removes it.
        severity: `"warning"` (slows or endangers training) or `"info"` (a decision to make).
    """

    kind: str
    node: str
    message: str
    fix: str
    severity: str = "warning"


@dataclass
class AuditResult:
    """What `audit()` found and measured.

    Attributes:
        findings: lint findings (and `input_bound` when a target rate is missed).
        ops: the dataset ops from source to output.
        steps: elements measured.
        first_element_seconds: time to the first element (start-up: opening files, fill-up).
        elements_per_second: elements after the first, per second.
        samples_per_second: samples per second (elements × batch size, when batched).
        batch_size: leading dimension of an element when the pipeline batches, else None.
        target_steps_per_second: the rate asked for, if any.
        element_shapes: the distinct image shapes of the timed elements (`[N, H, W, C]`
            when batched), most common first.
        stored_sizes: `"HxW"` -> images, for the images stored in the TFRecords the
            pipeline reads (from `image/height`/`image/width`, or the encoded image).
        memory: with a model, a training step's peak at the produced and the stored size.
        service_rates: with `workers`, elements/s read from that many local tf.data
            service workers (0: in this process).
        service_workers: the fewest workers that reach the target rate (without a target:
            within 10% of the fastest); None when none does.
        service_note: why the workers were not timed, if they were not.
    """

    findings: list[AuditFinding] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    steps: int = 0
    first_element_seconds: float | None = None
    elements_per_second: float | None = None
    samples_per_second: float | None = None
    batch_size: int | None = None
    target_steps_per_second: float | None = None
    element_shapes: list[list[int | None]] = field(default_factory=list)
    stored_sizes: dict[str, int] = field(default_factory=dict)
    memory: dict[str, Any] | None = None
    service_rates: dict[int, float] = field(default_factory=dict)
    service_workers: int | None = None
    service_note: str | None = None

    @property
    def ok(self) -> bool:
        """Whether no finding is a warning."""
        return not any(f.severity == "warning" for f in self.findings)

    def kinds(self) -> list[str]:
        """The kinds of the findings, in order."""
        return [f.kind for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (snake_case keys, times in `*_seconds`)."""
        return json_dict(
            self,
            ok=self.ok,
            batches_per_second=self.elements_per_second if self.batch_size else None,
        )
