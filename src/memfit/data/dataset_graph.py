"""Reading a tf.data graph: the dataset chain, the ops its functions run, its constants, files."""

from __future__ import annotations

import os
from typing import Any

FILE_SOURCES = (
    "TFRecordDataset",
    "TFRecordDatasetV2",
    "FixedLengthRecordDatasetV2",
    "TextLineDataset",
)
SOURCES = {"TFRecordDataset", "FixedLengthRecordDataset", "TextLineDataset"}
PASS_THROUGH = (
    "OptionsDataset",
    "ModelDataset",
    "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset",
    "AssertCardinalityDataset",
)
_DTYPE_BYTES = {1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 9: 8, 10: 1, 14: 2, 17: 2, 19: 2, 22: 4, 23: 8}


def base_op(op: str) -> str:
    """`ParallelMapDatasetV2` → `ParallelMapDataset` (drop the version suffix)."""
    while op[-1:].isdigit():
        op = op[:-1]
    return op[:-1] if op.endswith("V") else op


def dataset_chain(graph: Any) -> list[Any]:
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


def node_functions(graph: Any, node: Any) -> list[Any]:
    """The functions (`FunctionDef`s) a node runs, nested functions included, each once."""
    library = {f.signature.name: f for f in graph.library.function}
    seen: set[str] = set()
    functions = []
    pending = [v.func.name for v in node.attr.values() if v.HasField("func")]
    while pending:
        name = pending.pop()
        if name in seen or name not in library:
            continue
        seen.add(name)
        functions.append(library[name])
        for inner in library[name].node_def:
            pending.extend(v.func.name for v in inner.attr.values() if v.HasField("func"))
            if inner.op in library:
                pending.append(inner.op)
    return functions


def function_ops(graph: Any, node: Any) -> set[str]:
    """Ops the functions a node runs contain (nested functions included)."""
    return {inner.op for function in node_functions(graph, node) for inner in function.node_def}


def const_bytes(node: Any) -> int:
    """The bytes a `Const` node's tensor holds."""
    tensor = node.attr["value"].tensor
    count = 1
    for dim in tensor.tensor_shape.dim:
        count *= max(dim.size, 0)
    if tensor.tensor_content:
        return len(tensor.tensor_content)
    if tensor.string_val:
        return sum(len(s) for s in tensor.string_val)
    return count * _DTYPE_BYTES.get(tensor.dtype, 4)


def const_strings(node: Any) -> list[str]:
    """The strings a `Const` node holds (e.g. file names); [] for another dtype."""
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


def pretty_op(op: str) -> str:
    """`ParallelMapDataset` → `parallel_map`: a dataset op as its transformation's name."""
    name = op[: -len("Dataset")] if op.endswith("Dataset") else op
    out = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    return out


def const_input(nodes: dict[str, Any], name: str) -> Any:
    """The Const node behind an input (through Identity nodes), or None."""
    node = nodes.get(name.split(":")[0].lstrip("^"))
    while node is not None and node.op == "Identity" and node.input:
        node = nodes.get(node.input[0].split(":")[0])
    return node if node is not None and node.op == "Const" else None


def source_files(nodes: dict[str, Any], node: Any) -> list[str]:
    """The file names a file source node (e.g. `TFRecordDataset`) reads, when constant."""
    const = const_input(nodes, node.input[0]) if node.input else None
    return const_strings(const) if const is not None else []


def read_files(graph: Any, nodes: dict[str, Any]) -> list[str]:
    """Files the pipeline reads: file sources' names, and names an interleave reads from."""
    files: list[str] = []
    for node in graph.node:
        op = base_op(node.op)
        if op in map(base_op, FILE_SOURCES):
            files.extend(source_files(nodes, node))
    if files:
        return files
    # Interleave over file names: the names are a TensorSliceDataset of strings feeding it.
    sources = SOURCES
    readers = [
        n
        for n in graph.node
        if base_op(n.op) in ("InterleaveDataset", "ParallelInterleaveDataset", "FlatMapDataset")
        and {base_op(o) for o in function_ops(graph, n)} & sources
    ]
    if not readers:
        return []
    for node in graph.node:
        if base_op(node.op) == "TensorSliceDataset":
            for name in node.input:
                const = const_input(nodes, name)
                if const is not None:
                    files.extend(s for s in const_strings(const) if os.path.isfile(s))
    return files
