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
- `map_enlarges_images`: the elements' images have at least 1.5x the pixels of the largest
  stored one (read from the TFRecords the pipeline reads) and a map scales them by a size it
  computes (an augmentation that doubles the resolution quadruples the step's activations);
  with a model, what that costs a step. Resizing (and padding) images of several sizes to
  one input size is what a model needs, and is not flagged.

Each finding carries its fix. When timed, the result also lists the image shapes the
pipeline produces next to the stored images' sizes.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.backend import tf as tfb
from memfit.errors import DataError
from memfit.sizes import format_size

LARGE_SLICES_BYTES = 64 * 1024**2
CACHE_BYTES = 512 * 1024**2
# Elements whose images have this many times the stored pixels were enlarged by a map.
ENLARGE_FACTOR = 1.5
# Stored sizes are read from at most this many records.
STORED_RECORDS = 2000
_RESIZE_OPS = {
    "ResizeBilinear",
    "ResizeBicubic",
    "ResizeNearestNeighbor",
    "ResizeArea",
    "ScaleAndTranslate",
    "ResizeBilinearV2",
    "ImageProjectiveTransformV3",
    "CropAndResize",
}
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
        element_shapes: the distinct image shapes of the timed elements (`[N, H, W, C]`
            when batched), most common first.
        stored_sizes: `"HxW"` -> images, for the images stored in the TFRecords the
            pipeline reads (from `image/height`/`image/width`, or the encoded image).
        memory: with a model, a training step's peak at the produced and the stored size.
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
    model: Any = None,
) -> AuditResult:
    """Lint a `tf.data.Dataset`'s graph and measure how fast it yields elements.

    Args:
        dataset: the pipeline as the model will consume it (batched, if it batches).
        steps: elements to time after the first (0: lint only).
        target_steps_per_second: the training step rate the pipeline must keep up with
            (e.g. from `memfit measure`'s step time); a slower pipeline is `input_bound`.
        large_bytes: `from_tensor_slices` constants above this are `large_tensor_slices`.
        cache_bytes: files read from disk totalling less than this should be cached.
        model: a Keras model or MODEL spec (`package.module:factory`, a `.keras` file): when
            a map enlarges images, a training step is measured (in a child process) at the
            produced and at the stored size, to say what the enlargement costs.

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
        nodes = {n.name: n for n in graph.node}
        files = [f for f in _read_files(graph, nodes) if os.path.isfile(f)]
        if files and result.element_shapes:
            result.stored_sizes = stored_sizes(files)
            _check_enlarged(graph, result, model)
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
    batched = any(f.endswith("batch") for f in result.ops)
    if batched and leaves and leaves[0].shape.rank:
        result.batch_size = int(leaves[0].shape[0])
    shapes: Counter[tuple[int | None, ...]] = Counter()
    _count_image_shape(tf, first, batched, shapes)
    count = 0
    start = time.perf_counter()
    for _ in range(steps):
        try:
            element = next(iterator)
        except StopIteration:
            break
        _count_image_shape(tf, element, batched, shapes)
        count += 1
    elapsed = time.perf_counter() - start
    result.element_shapes = [list(shape) for shape, _ in shapes.most_common(10)]
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


# -- image sizes: produced vs stored ----------------------------------------------------------
def _count_image_shape(tf: Any, element: Any, batched: bool, shapes: Counter) -> None:
    """Count the shape of an element's image (the first leaf shaped like one)."""
    rank = 4 if batched else 3
    for leaf in tf.nest.flatten(element):
        shape = getattr(leaf, "shape", None)
        if shape is not None and shape.rank == rank and shape[-1] in (1, 3, 4):
            shapes[tuple(shape.as_list())] += 1
            return


def stored_sizes(files: list[str], limit: int = STORED_RECORDS) -> dict[str, int]:
    """`"HxW"` -> count for the images stored in TFRecord files (at most `limit` records).

    Reads `image/height` and `image/width`, or else the encoded image's header
    (`image/encoded`); records that are not `tf.train.Example`s are skipped.

    Args:
        files: TFRecord files (gzip ones are detected by their `.gz` suffix).
        limit: records to read in all.
    """
    tf = tfb.import_tf()
    sizes: Counter[str] = Counter()
    read = 0
    for path in files:
        compression = "GZIP" if path.endswith(".gz") else ""
        try:
            for record in tf.data.TFRecordDataset(path, compression_type=compression):
                if read >= limit:
                    break
                read += 1
                size = _record_size(tf, record.numpy())
                if size is not None:
                    sizes[f"{size[0]}x{size[1]}"] += 1
        except tf.errors.OpError:
            continue  # a damaged file: `memfit data check` reports it
        if read >= limit:
            break
    return dict(sizes.most_common())


def _record_size(tf: Any, record: bytes) -> tuple[int, int] | None:
    try:
        example = tf.train.Example.FromString(record)
    except Exception:  # noqa: BLE001 - not an Example: no size to read
        return None
    feature = example.features.feature
    height = feature.get("image/height")
    width = feature.get("image/width")
    if height is not None and width is not None and height.int64_list.value:
        return int(height.int64_list.value[0]), int(width.int64_list.value[0])
    encoded = feature.get("image/encoded")
    if encoded is None or not encoded.bytes_list.value:
        return None
    try:
        shape = tf.io.decode_image(encoded.bytes_list.value[0], expand_animations=False).shape
    except tf.errors.OpError:
        return None
    return int(shape[0]), int(shape[1])


def _check_enlarged(graph: Any, result: AuditResult, model: Any) -> None:
    """`map_enlarges_images` when the produced images have more pixels than any stored one."""
    if not result.stored_sizes:
        return
    produced = [s for s in result.element_shapes if all(isinstance(d, int) for d in s)]
    if not produced:
        return
    shape = max(produced, key=lambda s: s[-3] * s[-2])
    height, width = shape[-3], shape[-2]
    stored = [tuple(int(v) for v in key.split("x")) for key in result.stored_sizes]
    big_h, big_w = max(stored, key=lambda hw: hw[0] * hw[1])
    ratio = height * width / (big_h * big_w)
    if ratio < ENLARGE_FACTOR:
        return
    chain = _chain(graph)
    maps = [
        n
        for n in chain
        if _base(n.op) in ("MapDataset", "ParallelMapDataset", "MapAndBatchDataset")
        and _function_ops(graph, n) & _RESIZE_OPS
    ]
    scaling = [n.name for n in maps if _scales_by_image(graph, n)]
    if len(produced) == 1 and (len(stored) > 1 or not scaling):
        return  # images of several sizes made one: resized to the model's input size
    node = (scaling or [n.name for n in maps] or [""])[-1]  # the chain runs output -> source
    what = f"a map ({node})" if node else "a map"
    message = (
        f"the pipeline yields images of {height}x{width} (elements "
        f"{'x'.join(map(str, shape))}) from images stored at most {big_h}x{big_w}: {what} "
        f"enlarges them, {ratio:.3g}x the pixels, and a training step's activations grow with "
        f"them"
    )
    fix = (
        f"resize to the stored size or below ({big_h}x{big_w}), or crop instead of scaling "
        f"up; if the augmentation must enlarge, plan the memory for {height}x{width} "
        f"(`memfit batch MODEL --input-shape {height},{width},{shape[-1]}`) or train with "
        f"memfit.fit, which splits steps that do not fit"
    )
    if model is not None:
        result.memory = _enlarge_memory(
            model, result.batch_size or 1, (height, width), (big_h, big_w)
        )
        peak, base = result.memory["produced_peak_bytes"], result.memory["stored_peak_bytes"]
        if peak and base:
            message += (
                f"; with {result.memory['model']} a step of batch {result.batch_size or 1} "
                f"peaks at {format_size(peak)} at {height}x{width} against {format_size(base)} "
                f"at {big_h}x{big_w} (+{format_size(peak - base)})"
            )
    result.findings.append(AuditFinding("map_enlarges_images", node, message, fix))


def _scales_by_image(graph: Any, node: Any) -> bool:
    """Whether a map scales images by a size computed in the map (a factor of the image's
    own size, a random scale), rather than resizing to a constant target or resizing and
    padding to a fixed canvas (the model's input size)."""
    library = {f.signature.name: f for f in graph.library.function}
    pending = [v.func.name for v in node.attr.values() if v.HasField("func")]
    seen: set[str] = set()
    computed = padded = False
    while pending:
        name = pending.pop()
        if name in seen or name not in library:
            continue
        seen.add(name)
        function = library[name]
        inner = {n.name: n for n in function.node_def}
        for n in function.node_def:
            pending.extend(v.func.name for v in n.attr.values() if v.HasField("func"))
            if n.op in library:
                pending.append(n.op)
            padded = padded or n.op in ("Pad", "PadV2", "MirrorPad")
            if n.op not in _RESIZE_OPS or len(n.input) < 2:
                continue
            source = inner.get(n.input[1].split(":")[0])
            while source is not None and source.op == "Identity" and source.input:
                source = inner.get(source.input[0].split(":")[0])
            computed = computed or source is None or source.op != "Const"
    return computed and not padded


def _enlarge_memory(
    model: Any, batch_size: int, produced: tuple[int, int], stored: tuple[int, int]
) -> dict[str, Any]:
    """A step's peak at the produced and the stored image size (`check.model_memory`)."""
    from memfit.data.check import ImageInfo, model_memory

    out: dict[str, Any] = {"batch_size": batch_size}
    for key, (h, w) in (("produced", produced), ("stored", stored)):
        info = ImageInfo("", 0, h, w, h * w * 3)
        memory = model_memory(model, info, batch_size)
        out["model"] = memory["model"]
        out[f"{key}_height"], out[f"{key}_width"] = h, w
        out[f"{key}_peak_bytes"] = memory["peak_bytes"]
        out[f"{key}_mode"] = memory["mode"]
    produced_peak, stored_peak = out["produced_peak_bytes"], out["stored_peak_bytes"]
    out["enlargement_bytes"] = (
        produced_peak - stored_peak if produced_peak and stored_peak else None
    )
    out["pixel_ratio"] = round(produced[0] * produced[1] / math.prod(stored), 4)
    return out
