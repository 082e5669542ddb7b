"""Images a pipeline enlarges: the shapes it produces against the sizes stored in its files."""

from __future__ import annotations

from collections import Counter
from typing import Any

from memfit.backend import tf as tfb
from memfit.data.audit_result import AuditFinding, AuditResult
from memfit.data.dataset_graph import base_op, dataset_chain, function_ops, node_functions
from memfit.data.memory import enlarge_memory
from memfit.sizes import format_size

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


def count_image_shape(tf: Any, element: Any, batched: bool, shapes: Counter) -> None:
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


def check_enlarged(graph: Any, result: AuditResult, model: Any) -> None:
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
    chain = dataset_chain(graph)
    maps = [
        n
        for n in chain
        if base_op(n.op) in ("MapDataset", "ParallelMapDataset", "MapAndBatchDataset")
        and function_ops(graph, n) & _RESIZE_OPS
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
        result.memory = enlarge_memory(
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
    computed = padded = False
    for function in node_functions(graph, node):
        inner = {n.name: n for n in function.node_def}
        for n in function.node_def:
            padded = padded or n.op in ("Pad", "PadV2", "MirrorPad")
            if n.op not in _RESIZE_OPS or len(n.input) < 2:
                continue
            source = inner.get(n.input[1].split(":")[0])
            while source is not None and source.op == "Identity" and source.input:
                source = inner.get(source.input[0].split(":")[0])
            computed = computed or source is None or source.op != "Const"
    return computed and not padded
