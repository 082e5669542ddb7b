"""The audit's lint: what in a tf.data graph makes an input pipeline slow or fragile."""

from __future__ import annotations

import os
from typing import Any

from memfit.data.audit_result import AuditFinding
from memfit.data.dataset_graph import (
    FILE_SOURCES,
    PASS_THROUGH,
    SOURCES,
    base_op,
    const_bytes,
    const_input,
    dataset_chain,
    function_ops,
    pretty_op,
    read_files,
    source_files,
)
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


def lint(graph: Any, large_bytes: int, cache_bytes: int) -> tuple[list[AuditFinding], list[str]]:
    """Lint a dataset's graph: the findings, and the transformations from source to output.

    Args:
        graph: the dataset's `GraphDef` (`memfit.backend.tf.dataset_graph`).
        large_bytes: `from_tensor_slices` constants above this are `large_tensor_slices`.
        cache_bytes: files read from disk totalling less than this should be cached.
    """
    nodes = {n.name: n for n in graph.node}
    chain = dataset_chain(graph)
    ops = [base_op(n.op) for n in chain]
    pretty = [pretty_op(op) for op in reversed(ops)]
    findings: list[AuditFinding] = []
    every = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    all_ops = {base_op(n.op) for n in every}
    fn_ops = {n.name: function_ops(graph, n) for n in chain}

    # Output end: prefetch last (ignoring options and autotuning wrappers).
    last = next((n for n in chain if base_op(n.op) not in map(base_op, PASS_THROUGH)), None)
    if last is not None and base_op(last.op) != "PrefetchDataset":
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
        if base_op(node.op) in ("BatchDataset", "PaddedBatchDataset", "ParallelBatchDataset"):
            seen_batch = True

    for node in chain:
        op = base_op(node.op)
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
        if op == "FlatMapDataset" and {base_op(o) for o in fn_ops[node.name]} & SOURCES:
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
        op = base_op(node.op)
        if op == "TensorSliceDataset":
            consts = [const_input(nodes, name) for name in node.input]
            size = sum(const_bytes(c) for c in consts if c is not None)
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
        if op in map(base_op, FILE_SOURCES):
            files = source_files(nodes, node)
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

    reads = read_files(graph, nodes)
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
