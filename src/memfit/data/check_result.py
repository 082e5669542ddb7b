"""What `memfit.data.check` reports: `Problem`s, `ImageInfo`s and the `CheckResult`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from memfit.serialize import json_dict

DEFAULT_BATCH_SIZE = 8


@dataclass
class Problem:
    """One thing wrong with one record (or with a file, when `index` is -1).

    Attributes:
        kind: what is wrong, e.g. `"truncated_record"`, `"decode_error"`, `"inverted_box"`.
        file: the file's path.
        index: the record's position in the file (0-based); -1 for the file as a whole.
        message: what is wrong, in words.
        severity: `"error"` (makes `check` fail) or `"warning"` (reported only).
    """

    kind: str
    file: str
    index: int
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.file}" + (f" record {self.index}" if self.index >= 0 else "")
        return f"{where}: {self.message}"


@dataclass
class ImageInfo:
    """Where an image is and how large it is.

    Attributes:
        file: the file's path.
        index: the record's position in the file.
        height: pixels (decoded, or as declared when the image does not decode).
        width: pixels.
        decoded_bytes: the image decoded as uint8 (height × width × 3).
    """

    file: str
    index: int
    height: int
    width: int
    decoded_bytes: int


@dataclass
class CheckResult:
    """What `check()` found.

    Attributes:
        files: the files read.
        records: records read (sound or not).
        valid_records: records without an error.
        objects: objects (boxes) in all records.
        problems: every problem, in file and record order.
        resolution_histogram: images per longer-side bin (`"<=256"`, `"257-512"`, ...).
        resolutions: the most common `"WxH"` resolutions and their counts.
        objects_histogram: images per objects-per-image bin (`"0"`, `"1"`, `"2"`, `"3-4"`, ...).
        largest: the largest images, largest first.
        batch_size: the batch size the memory figures are for.
        memory: what the largest image means for memory (see `check`); None without a model.
        seconds: how long the check took.
    """

    files: list[str]
    records: int = 0
    valid_records: int = 0
    objects: int = 0
    problems: list[Problem] = field(default_factory=list)
    resolution_histogram: dict[str, int] = field(default_factory=dict)
    resolutions: dict[str, int] = field(default_factory=dict)
    objects_histogram: dict[str, int] = field(default_factory=dict)
    largest: list[ImageInfo] = field(default_factory=list)
    batch_size: int = DEFAULT_BATCH_SIZE
    memory: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def errors(self) -> list[Problem]:
        """Problems of severity `"error"`."""
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        """Problems of severity `"warning"`."""
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        """Whether no record has an error (warnings allowed)."""
        return not self.errors

    def counts(self) -> dict[str, int]:
        """Problems per kind."""
        return dict(Counter(p.kind for p in self.problems))

    def largest_batch_bytes(self) -> int | None:
        """A batch of `batch_size` copies of the largest image, decoded as float32."""
        if not self.largest:
            return None
        return self.largest[0].decoded_bytes * 4 * self.batch_size

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (snake_case keys, sizes in `*_bytes`, times in `*_seconds`)."""
        return json_dict(
            self,
            "ok files records valid_records invalid_records objects errors warnings "
            "problem_counts problems resolution_histogram resolutions objects_histogram largest "
            "batch_size largest_batch_float32_bytes memory check_seconds",
            invalid_records=self.records - self.valid_records,
            errors=len(self.errors),
            warnings=len(self.warnings),
            problem_counts=self.counts(),
            largest_batch_float32_bytes=self.largest_batch_bytes(),
            check_seconds=round(self.seconds, 3),
        )

    def summary(self) -> str:
        """One line: records, problems, verdict."""
        verdict = "no problems" if self.ok else f"{len(self.errors)} problem(s)"
        return (
            f"{self.records} records in {len(self.files)} file(s), {self.valid_records} valid, "
            f"{self.objects} objects: {verdict}, {len(self.warnings)} warning(s)"
        )
