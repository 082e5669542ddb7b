"""The batch search's answer: `BatchSearchResult` and each `Trial` it ran."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit.budget.budget import Budget
from memfit.serialize import json_dict
from memfit.sizes import format_size


@dataclass
class Trial:
    """One measured batch size in a search.

    `fresh`: the first trial of a fresh process (later ones run on an allocator that earlier
    trials used). `deciding`: one of the two trials the answer rests on (the largest size
    that fits, the smallest that fails). `steps`: training steps run (a warm-up in a fresh
    process, then the measured ones; the peak is the largest of the measured). `soak`: the
    steps that check a size found holds over more steps of training, from a fresh start.
    """

    batch_size: int
    oom: bool
    peak_bytes: int | None
    seconds: float
    predicted_peak_bytes: int | None = None
    fits: bool = False
    deciding: bool = False
    fresh: bool = False
    steps: int = 2
    soak: bool = False


@dataclass
class BatchSearchResult:
    """The largest batch that fits, and how it was found.

    Attributes:
        batch_size: the largest batch whose measured peak stays within the budget less the
            margin; 0 when even batch 1 does not fit.
        margin: share of the step's own bytes (peak less what is resident before it)
            kept free under the budget (0.05: `peak + 0.05 * (peak - resident) <= budget`).
        peak_bytes: measured peak at `batch_size` (at batch 1 when nothing fits).
        budget: the budget searched against.
        trials: every measured size in order, with peak or OOM and time.
        limit_bytes: the most a fitting peak may reach: `(budget + margin * resident) /
            (1 + margin)`, with `resident` the bytes in use before a step (weights,
            optimizer state) as the first trial measured them.
        failing_batch_size: the smallest size seen failing (OOM or over the limit), if any.
        stopped_by: why the search ended: `"bracket"` (a passing and a failing size next to
            each other or within the margin), `"max_batch"`, `"dataset_size"`, `"nothing_fits"`.
        worst_case_samples: trials used the dataset's largest samples.
        largest_sample: shapes of that largest sample, when a dataset was given.
        samples_read: the dataset repeats for ever (or its length is unknown and longer):
            its largest samples were picked among its first `samples_read`; None when the
            whole dataset was read.
        seconds: wall time of the search.
        decided_in: `"child_process"` (the trials ran in a child process, replaced after an
            OOM) or `"this_process"` (the model could not be saved for a child).
        soak_steps: measured steps the answer trained before it was given (0: not soaked).
        replicas: data-parallel replicas the batch is for; `batch_size` is then each
            replica's batch and `budget` the tightest replica's, less `allreduce_bytes`.
        allreduce_bytes: the gradient all-reduce's extra buffer on each replica, kept off
            the budget (0 with one replica).
    """

    @property
    def confirmed_by(self) -> str:
        """How the answer was checked before it was given, for people and JSON."""
        if not self.fits:
            return "nothing fits"
        if self.soak_steps:
            return (
                f"trained {self.soak_steps} steps of model.fit's train function back to back "
                f"in a fresh process, after a warm-up step, peaking at "
                f"{format_size(self.peak_bytes)}: within {format_size(self.limit_bytes)} "
                f"(the budget less a {self.margin:.0%} margin on the step's own bytes)"
            )
        return "not confirmed: answered from the search's one-step trials (soak steps 0)"

    batch_size: int
    margin: float
    peak_bytes: int | None
    budget: Budget
    trials: list[Trial] = field(default_factory=list)
    limit_bytes: int = 0
    failing_batch_size: int | None = None
    stopped_by: str = "bracket"
    worst_case_samples: bool = False
    largest_sample: dict[str, Any] | None = None
    samples_read: int | None = None
    seconds: float = 0.0
    decided_in: str = "child_process"
    soak_steps: int = 0
    replicas: int = 1
    allreduce_bytes: int = 0

    @property
    def global_batch_size(self) -> int:
        """The global batch: each replica's `batch_size` times `replicas`."""
        return self.batch_size * self.replicas

    @property
    def headroom_bytes(self) -> int | None:
        """Budget left above the peak at `batch_size`."""
        if self.peak_bytes is None or self.batch_size == 0:
            return None
        return self.budget.usable_bytes - self.peak_bytes

    @property
    def fits(self) -> bool:
        """Whether any batch size fits."""
        return self.batch_size > 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (sizes in bytes, times in seconds)."""
        return json_dict(
            self,
            "batch_size margin peak_bytes headroom_bytes limit_bytes budget failing_batch_size "
            "stopped_by worst_case_samples largest_sample samples_read trials decided_in "
            "soak_steps confirmed_by search_seconds replicas global_batch_size allreduce_bytes",
            search_seconds=self.seconds,
        )

    def summary(self) -> str:
        """One or two sentences for people."""
        if not self.fits:
            return (
                f"even batch size 1 does not fit: it needs {at_least(self)} and the budget "
                f"is {format_size(self.budget.usable_bytes)} ({self.budget.name}). Run "
                f"`memfit plan` to see what would make it fit (mixed precision, recompute, "
                f"a smaller input)."
            )
        replicas = (
            f" per replica, global batch {self.global_batch_size} over {self.replicas} "
            f"replicas ({self.replicas} x {self.batch_size}; "
            f"{format_size(self.allreduce_bytes)} kept per replica for the gradient all-reduce)"
            if self.replicas > 1
            else ""
        )
        text = (
            f"largest batch: {self.batch_size}{replicas} (peak {format_size(self.peak_bytes)}, "
            f"{format_size(self.headroom_bytes)} headroom in "
            f"{format_size(self.budget.usable_bytes)} with a {self.margin:.0%} margin; "
            f"{len(self.trials)} trials)"
        )
        if self.soak_steps:
            text += (
                f"; confirmed: it trained {self.soak_steps} steps as model.fit runs them, in "
                f"a fresh process"
            )
        if self.worst_case_samples and self.samples_read:
            text += (
                f"; measured on the largest of the dataset's first {self.samples_read} samples "
                f"(it repeats for ever, or its length is unknown: only those were read)"
            )
        elif self.worst_case_samples:
            text += "; measured on the dataset's largest samples, so it holds for all of them"
        if self.stopped_by == "dataset_size":
            text += (
                f"; the dataset holds only {self.batch_size} samples, so no larger batch was "
                f"tried: a larger dataset may fit more"
            )
        elif self.stopped_by == "max_batch":
            text += f"; the search stopped at its maximum ({self.batch_size}, --max-batch)"
        return text


def at_least(result: BatchSearchResult) -> str:
    first = result.trials[0] if result.trials else None
    if first is None or first.peak_bytes is None:
        return "more than the budget"
    return ("more than " if first.oom else "") + format_size(first.peak_bytes)
