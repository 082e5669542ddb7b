"""Audit a tf.data pipeline: static lint of its graph, measured throughput, a fix per finding.

The lint reads the dataset's graph (the ops `tf.data` builds, and the functions its `map`s
run) and names what makes input pipelines slow or fragile:

- `map_not_parallel`: `map` without `num_parallel_calls`.
- `no_prefetch`: the last transformation is not `prefetch`.
- `batch_before_map`: an expensive per-image map (decode, resize, Python) after `batch`.
- `large_tensor_slices`: `from_tensor_slices` of a large in-memory array.
- `missing_cache`: files small enough for memory, read and decoded again every epoch.
- `interleave_not_parallel`: `interleave` without `num_parallel_calls`.
- `serial_file_reads`: `TFRecordDataset` over several files, read one after another.
- `no_error_policy` (info): files decoded with no decision about bad records.
- `input_bound`: measured elements/s below a target step rate.

Each finding carries its fix.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.backend import tf as tfb
from memfit.errors import DataError
from memfit.sizes import format_size

LARGE_SLICES_BYTES = 64 * 1024**2
CACHE_BYTES = 512 * 1024**2
# Ops that make a map "expensive": decoding, resizing, Python, loops over elements.
_EXPENSIVE = (
    "DecodeJpeg",
    "DecodePng",
    "DecodeImage",
    "DecodeAndCropJpeg",
    "DecodeBmp",
    "DecodeGif",
    "ResizeBilinear",
    "ResizeBicubic",
    "ResizeArea",
    "ScaleAndTranslate",
    "PyFunc",
    "EagerPyFunc",
    "ReadFile",
    "ParseExample",
    "ParseExampleV2",
    "ParseSingleExample",
)
_FILE_SOURCES = (
    "TFRecordDataset",
    "TFRecordDatasetV2",
    "FixedLengthRecordDatasetV2",
    "TextLineDataset",
)
_SOURCES = {"TFRecordDataset", "FixedLengthRecordDataset", "TextLineDataset"}
_PASS_THROUGH = (
    "OptionsDataset",
    "ModelDataset",
    "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset",
    "AssertCardinalityDataset",
)
_DTYPE_BYTES = {1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 9: 8, 10: 1, 14: 2, 17: 2, 19: 2, 22: 4, 23: 8}


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
    """

    findings: list[AuditFinding] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    steps: int = 0
    first_element_seconds: float | None = None
    elements_per_second: float | None = None
    samples_per_second: float | None = None
    batch_size: int | None = None
    target_steps_per_second: float | None = None

    @property
    def ok(self) -> bool:
        """Whether no finding is a warning."""
        return not any(f.severity == "warning" for f in self.findings)

    def kinds(self) -> list[str]:
        """The kinds of the findings, in order."""
        return [f.kind for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (snake_case keys, times in `*_seconds`)."""
        data = asdict(self)
        data["ok"] = self.ok
        data["batches_per_second"] = self.elements_per_second if self.batch_size else None
        return data


def audit(
    dataset: Any,
    steps: int = 50,
    target_steps_per_second: float | None = None,
    *,
    large_bytes: int = LARGE_SLICES_BYTES,
    cache_bytes: int = CACHE_BYTES,
) -> AuditResult:
    """Lint a `tf.data.Dataset`'s graph and measure how fast it yields elements.

    Args:
        dataset: the pipeline as the model will consume it (batched, if it batches).
        steps: elements to time after the first (0: lint only).
        target_steps_per_second: the training step rate the pipeline must keep up with
            (e.g. from `memfit measure`'s step time); a slower pipeline is `input_bound`.
        large_bytes: `from_tensor_slices` constants above this are `large_tensor_slices`.
        cache_bytes: files read from disk totalling less than this should be cached.

    Returns:
        An `AuditResult`; `result.ok` is False when a finding is a warning.

    Example:
        ```python
        result = memfit.data.audit(make_dataset(), steps=20)
        for finding in result.findings:
            print(finding.kind, finding.fix)
        ```
    """
    tf = tfb.import_tf()
    if not isinstance(dataset, tf.data.Dataset):
        raise DataError(
            f"audit takes a tf.data.Dataset, got {type(dataset).__name__}; a dataset_fn must "
            f"return the pipeline as training consumes it"
        )
    if steps < 0:
        raise DataError(f"steps must be 0 or more, got {steps}")
    graph = tfb.dataset_graph(dataset)
    result = AuditResult(target_steps_per_second=target_steps_per_second)
    result.findings, result.ops = _lint(graph, large_bytes, cache_bytes)
    if steps:
        _measure(tf, dataset, steps, result)
        if (
            target_steps_per_second
            and result.elements_per_second is not None
            and result.elements_per_second < target_steps_per_second
        ):
            others = [f.kind for f in result.findings if f.severity == "warning"]
            result.findings.append(
                AuditFinding(
                    "input_bound",
                    "",
                    f"the pipeline yields {result.elements_per_second:.1f} elements/s, below "
                    f"the target {target_steps_per_second:g} steps/s: training would wait for "
                    f"input",
                    "fix the findings above ("
                    + (", ".join(others) if others else "none found")
                    + "); then parallelise further (more files, num_parallel_calls), move "
                    "work to the accelerator, or lower the resolution",
                )
            )
    return result


def _measure(tf: Any, dataset: Any, steps: int, result: AuditResult) -> None:
    iterator = iter(dataset)
    start = time.perf_counter()
    try:
        first = next(iterator)
    except StopIteration:
        result.first_element_seconds = time.perf_counter() - start
        return
    result.first_element_seconds = time.perf_counter() - start
    leaves = tf.nest.flatten(first)
    if any(f.endswith("batch") for f in result.ops) and leaves and leaves[0].shape.rank:
        result.batch_size = int(leaves[0].shape[0])
    count = 0
    start = time.perf_counter()
    for _ in range(steps):
        try:
            next(iterator)
        except StopIteration:
            break
        count += 1
    elapsed = time.perf_counter() - start
    result.steps = count
    if count and elapsed > 0:
        result.elements_per_second = count / elapsed
        result.samples_per_second = result.elements_per_second * (result.batch_size or 1)


# -- the lint ---------------------------------------------------------------------------------
def _base(op: str) -> str:
    """`ParallelMapDatasetV2` → `ParallelMapDataset` (drop the version suffix)."""
    while op[-1:].isdigit():
        op = op[:-1]
    return op[:-1] if op.endswith("V") else op


def _chain(graph: Any) -> list[Any]:
    """Dataset nodes from the output back to the source, along each node's first input."""
    nodes = {n.name: n for n in graph.node}
    ret = next((n for n in graph.node if n.op == "_Retval"), None)
    name = ret.input[0] if ret is not None else graph.node[-1].name
    chain = []
    while name in nodes:
        node = nodes[name]
        if not node.op.endswith("Dataset") and "Dataset" not in node.op:
            break
        chain.append(node)
        inputs = [i.split(":")[0].lstrip("^") for i in node.input]
        name = inputs[0] if inputs else ""
    return chain


def _function_ops(graph: Any, node: Any) -> set[str]:
    """Ops the functions a node runs contain (nested functions included)."""
    library = {f.signature.name: f for f in graph.library.function}
    seen: set[str] = set()
    ops: set[str] = set()
    pending = [v.func.name for v in node.attr.values() if v.HasField("func")]
    while pending:
        name = pending.pop()
        if name in seen or name not in library:
            continue
        seen.add(name)
        for inner in library[name].node_def:
            ops.add(inner.op)
            pending.extend(v.func.name for v in inner.attr.values() if v.HasField("func"))
            pending.extend(inner.op for _ in [0] if inner.op in library)
    return ops


def _const_bytes(node: Any) -> int:
    tensor = node.attr["value"].tensor
    count = 1
    for dim in tensor.tensor_shape.dim:
        count *= max(dim.size, 0)
    if tensor.tensor_content:
        return len(tensor.tensor_content)
    if tensor.string_val:
        return sum(len(s) for s in tensor.string_val)
    return count * _DTYPE_BYTES.get(tensor.dtype, 4)


def _strings(node: Any) -> list[str]:
    tensor = node.attr["value"].tensor
    if tensor.dtype != 7:  # DT_STRING
        return []
    if tensor.string_val:
        return [v.decode("utf-8", "replace") for v in tensor.string_val]
    # Packed strings: one varint length per element, then the bytes of all elements.
    content = tensor.tensor_content
    count = 1
    for dim in tensor.tensor_shape.dim:
        count *= max(dim.size, 0)
    lengths, pos = [], 0
    for _ in range(count):
        length, shift = 0, 0
        while pos < len(content):
            byte = content[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        lengths.append(length)
    values = []
    for length in lengths:
        values.append(content[pos : pos + length].decode("utf-8", "replace"))
        pos += length
    return values


def _lint(graph: Any, large_bytes: int, cache_bytes: int) -> tuple[list[AuditFinding], list[str]]:
    nodes = {n.name: n for n in graph.node}
    chain = _chain(graph)
    ops = [_base(n.op) for n in chain]
    pretty = [_pretty(op) for op in reversed(ops)]
    findings: list[AuditFinding] = []
    every = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    all_ops = {_base(n.op) for n in every}
    fn_ops = {n.name: _function_ops(graph, n) for n in chain}

    # Output end: prefetch last (ignoring options and autotuning wrappers).
    last = next((n for n in chain if _base(n.op) not in map(_base, _PASS_THROUGH)), None)
    if last is not None and _base(last.op) != "PrefetchDataset":
        findings.append(
            AuditFinding(
                "no_prefetch",
                last.name,
                "the pipeline does not end with prefetch: the accelerator waits while each "
                "next batch is prepared",
                "add .prefetch(tf.data.AUTOTUNE) as the last transformation",
            )
        )

    batched_below: dict[str, bool] = {}
    seen_batch = False
    for node in reversed(chain):  # source → output
        batched_below[node.name] = seen_batch
        if _base(node.op) in ("BatchDataset", "PaddedBatchDataset", "ParallelBatchDataset"):
            seen_batch = True

    for node in chain:
        op = _base(node.op)
        if op == "MapDataset":
            findings.append(
                AuditFinding(
                    "map_not_parallel",
                    node.name,
                    "map runs one element at a time on one core",
                    "pass num_parallel_calls=tf.data.AUTOTUNE to map()",
                )
            )
        if (
            op in ("MapDataset", "ParallelMapDataset", "MapAndBatchDataset")
            and batched_below[node.name]
        ):
            costly = sorted(fn_ops[node.name] & set(_EXPENSIVE))
            if costly:
                findings.append(
                    AuditFinding(
                        "batch_before_map",
                        node.name,
                        f"an expensive per-image map ({', '.join(costly)}) runs after batch: "
                        f"each batch is prepared as one unit (often with a loop over its "
                        f"images), so the work is not spread over cores per image",
                        "map per image first (with num_parallel_calls=tf.data.AUTOTUNE), "
                        "then batch (padded_batch for varying sizes)",
                    )
                )
        if op == "FlatMapDataset" and {_base(o) for o in fn_ops[node.name]} & _SOURCES:
            findings.append(
                AuditFinding(
                    "serial_file_reads",
                    node.name,
                    "files are read one after another (TFRecordDataset over several files, "
                    "or flat_map over file names)",
                    "pass num_parallel_reads=tf.data.AUTOTUNE to TFRecordDataset, or "
                    "interleave over the files with num_parallel_calls=tf.data.AUTOTUNE",
                )
            )
        if op == "InterleaveDataset":
            findings.append(
                AuditFinding(
                    "interleave_not_parallel",
                    node.name,
                    "interleave reads its inputs one element at a time on one thread",
                    "pass num_parallel_calls=tf.data.AUTOTUNE (and deterministic=False "
                    "unless order matters) to interleave()",
                )
            )

    for node in graph.node:
        op = _base(node.op)
        if op == "TensorSliceDataset":
            consts = [_const_input(nodes, name) for name in node.input]
            size = sum(_const_bytes(c) for c in consts if c is not None)
            if size > large_bytes:
                findings.append(
                    AuditFinding(
                        "large_tensor_slices",
                        node.name,
                        f"from_tensor_slices embeds {format_size(size)} of in-memory arrays in "
                        f"the graph: they are copied into it (and held in memory twice), and "
                        f"the 2 GiB graph limit stops larger ones",
                        "write the data to TFRecord files (or keep file paths and load "
                        "per element in a parallel map); for arrays already in memory use "
                        "tf.data.Dataset.from_generator or tf.data.Dataset.save/load",
                    )
                )
        if op in map(_base, _FILE_SOURCES):
            files = _source_files(nodes, node)
            if len(files) > 1:
                findings.append(
                    AuditFinding(
                        "serial_file_reads",
                        node.name,
                        f"{len(files)} files are read one after another",
                        "pass num_parallel_reads=tf.data.AUTOTUNE to TFRecordDataset, or "
                        "interleave over the files with num_parallel_calls",
                    )
                )

    reads = _read_files(graph, nodes)
    if reads and "CacheDataset" not in all_ops:
        sizes = [os.path.getsize(f) for f in reads if os.path.isfile(f)]
        total = sum(sizes)
        if sizes and total < cache_bytes:
            findings.append(
                AuditFinding(
                    "missing_cache",
                    "",
                    f"the pipeline reads {len(sizes)} file(s), {format_size(total)} in all, from "
                    f"disk and decodes them again every epoch, yet they fit in memory",
                    "add .cache() after the parse/decode map (before random augmentation, "
                    "shuffle and batch)",
                )
            )
    decodes = bool(reads) or any(_EXPENSIVE_DECODE & ops_ for ops_ in fn_ops.values())
    if decodes and "IgnoreErrorsDataset" not in all_ops:
        findings.append(
            AuditFinding(
                "no_error_policy",
                "",
                "the pipeline reads and decodes records with no decision about bad ones: one "
                "corrupt record or undecodable image stops training mid-epoch",
                "run `memfit data check` on the files before training; if some bad records "
                "are acceptable, add .ignore_errors(log_warning=True) after the decode map",
                "info",
            )
        )
    return findings, pretty


_EXPENSIVE_DECODE = {"DecodeJpeg", "DecodePng", "DecodeImage", "DecodeAndCropJpeg", "ReadFile"}


def _pretty(op: str) -> str:
    name = op[: -len("Dataset")] if op.endswith("Dataset") else op
    out = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    return out


def _const_input(nodes: dict[str, Any], name: str) -> Any:
    """The Const node behind an input (through Identity nodes), or None."""
    node = nodes.get(name.split(":")[0].lstrip("^"))
    while node is not None and node.op == "Identity" and node.input:
        node = nodes.get(node.input[0].split(":")[0])
    return node if node is not None and node.op == "Const" else None


def _source_files(nodes: dict[str, Any], node: Any) -> list[str]:
    const = _const_input(nodes, node.input[0]) if node.input else None
    return _strings(const) if const is not None else []


def _read_files(graph: Any, nodes: dict[str, Any]) -> list[str]:
    """Files the pipeline reads: file sources' names, and names an interleave reads from."""
    files: list[str] = []
    for node in graph.node:
        op = _base(node.op)
        if op in map(_base, _FILE_SOURCES):
            files.extend(_source_files(nodes, node))
    if files:
        return files
    # Interleave over file names: the names are a TensorSliceDataset of strings feeding it.
    sources = _SOURCES
    readers = [
        n
        for n in graph.node
        if _base(n.op) in ("InterleaveDataset", "ParallelInterleaveDataset", "FlatMapDataset")
        and {_base(o) for o in _function_ops(graph, n)} & sources
    ]
    if not readers:
        return []
    for node in graph.node:
        if _base(node.op) == "TensorSliceDataset":
            for name in node.input:
                const = _const_input(nodes, name)
                if const is not None:
                    files.extend(s for s in _strings(const) if os.path.isfile(s))
    return files
