"""What large images mean for a training step's memory, measured in a child process."""

from __future__ import annotations

import math
import tempfile
from typing import Any

from memfit.backend import tf as tfb
from memfit.budget.budget import emulated_budget
from memfit.data.check_result import ImageInfo
from memfit.sizes import format_size

# A model that takes any size is measured at the largest image's own size up to this many
# pixels (640 x 640); beyond, at a reference size, scaled by pixel count.
DIRECT_PIXELS = 640 * 640


def model_memory(model: Any, largest: ImageInfo, batch_size: int) -> dict[str, Any]:
    """What the largest image means for one training step of `model` at `batch_size`.

    A model with a fixed input size is measured at that size (the pipeline resizes every image
    to it, so the largest image adds only its decoded size in host memory). A model that takes
    any size is measured at the largest image's own size when it has at most `DIRECT_PIXELS`
    pixels; a larger one at a reference shape, the largest image's shape with its longer side
    scaled to 256 (rounded to multiples of 32, or 128 for keras-hub detectors), and the step's
    own bytes (peak minus resident) are scaled by the pixel ratio to the largest image: a
    proportional estimate, since activations grow with pixels and weights do not.
    """
    # The measuring side (the runner, the workload, the estimate's modules) is imported when a
    # model is measured, not with `memfit.data`, which `import memfit` loads.
    from memfit.measuring.isolate import measurement_from_child, save_for_child
    from memfit.process.runner import run_in_child

    with tempfile.TemporaryDirectory(prefix="memfit-data-") as tmp:
        spec = model if isinstance(model, str) else save_for_child(model, tmp)
        result = run_in_child(
            measure_child,
            {
                "spec": spec,
                "batch_size": batch_size,
                "height": largest.height,
                "width": largest.width,
            },
        )
    mode = result.pop("mode")
    measured = measurement_from_child(result, batch_size, None)
    height, width = measured.input_shapes[0][:2] if measured.input_shapes else (None, None)
    memory: dict[str, Any] = {
        "model": model if isinstance(model, str) else getattr(model, "name", "model"),
        "mode": mode,
        "batch_size": batch_size,
        "measured_height": height,
        "measured_width": width,
        "measured_peak_bytes": measured.peak_bytes,
        "resident_bytes": measured.resident_bytes,
        "oom": measured.oom,
        "largest_height": largest.height,
        "largest_width": largest.width,
        "largest_batch_float32_bytes": largest.decoded_bytes * 4 * batch_size,
        "device": measured.device,
    }
    if mode == "scaled" and measured.peak_bytes is not None and height and width:
        ratio = largest.height * largest.width / (height * width)
        step = measured.peak_bytes - measured.resident_bytes
        memory["pixel_ratio"] = ratio
        memory["peak_bytes"] = int(measured.resident_bytes + step * ratio)
    else:
        memory["peak_bytes"] = measured.peak_bytes
    memory["message"] = _memory_message(memory)
    return memory


def _memory_message(m: dict[str, Any]) -> str:
    largest = f"{m['largest_width']}x{m['largest_height']}"
    batch = format_size(m["largest_batch_float32_bytes"])
    if m["mode"] == "fixed":
        return (
            f"the largest image, {largest} (W x H), makes a decoded float32 batch of "
            f"{m['batch_size']} take {batch} before resizing; a training step at the model's "
            f"input size {m['measured_width']}x{m['measured_height']}, batch {m['batch_size']}, "
            f"peaks at {format_size(m['peak_bytes'])} on {m['device']} (measured)"
            + (" — out of memory" if m["oom"] else "")
        )
    if m["mode"] == "measured":
        return (
            f"the largest image, {largest} (W x H), makes a training step of batch "
            f"{m['batch_size']} at that size peak at {format_size(m['peak_bytes'])} on "
            f"{m['device']} (measured; the model takes any size)"
            + (" — out of memory" if m["oom"] else "")
            + f", and {batch} for the decoded float32 batch alone"
        )
    return (
        f"the largest image, {largest} (W x H), makes a batch of {m['batch_size']} need "
        f"≈ {format_size(m['peak_bytes'])} for a training step at that size (the model takes "
        f"any size; measured at {m['measured_width']}x{m['measured_height']} on {m['device']} "
        f"and scaled by pixel count, x{m.get('pixel_ratio', 1):.1f}), and {batch} for the "
        f"decoded float32 batch alone"
    )


def _round(value: float, step: int) -> int:
    return max(step, int(round(value / step)) * step)


def measure_child(spec: str, batch_size: int, height: int, width: int) -> dict[str, Any]:
    """Child side of `model_memory`: load MODEL, measure one step, say how (fixed or scaled).

    `model_memory` runs it in a fresh process (`run_in_child`); it returns the measurement's
    `to_dict()` with `mode`: `"fixed"`, `"measured"` or `"scaled"`.

    Args:
        spec: the MODEL (a saved file or `package.module:factory`).
        batch_size: the batch size to measure.
        height: the largest image's height.
        width: the largest image's width.
    """
    # Imported here, in the measuring child, not with `memfit.data` (see `model_memory`).
    from memfit.measuring.measurer import measure_workload
    from memfit.workload.models import load_model
    from memfit.workload.workload import Workload
    from memfit.zoo import detection_samples

    model = load_model(spec)
    shape = None
    if getattr(model, "inputs", None):
        shape = tuple(model.inputs[0].shape[1:])
    detector = hasattr(model, "bounding_box_format")
    if shape and len(shape) == 3 and shape[0] and shape[1]:
        mode, h, w = "fixed", int(shape[0]), int(shape[1])
    elif height * width <= DIRECT_PIXELS:
        # Small enough to measure as it is: no scaling, no estimate.
        mode, h, w = "measured", height, width
    else:
        step = 128 if detector else 32
        scale = 256 / max(height, width)
        mode, h, w = "scaled", _round(height * scale, step), _round(width * scale, step)
    channels = int(shape[2]) if shape and len(shape) == 3 and shape[2] else 3
    data = None
    if detector:
        data = detection_samples(
            max(batch_size, 2), (h, w), num_classes=int(getattr(model, "num_classes", 20))
        )
    workload = Workload(model, input_shape=(h, w, channels), data=data)
    measured = measure_workload(
        workload, batch_size, repeats=2, device=tfb.default_device(), budget=emulated_budget()
    ).to_dict()
    measured["mode"] = mode
    return measured


def enlarge_memory(
    model: Any, batch_size: int, produced: tuple[int, int], stored: tuple[int, int]
) -> dict[str, Any]:
    """A step's peak at the produced and at the stored image size (`model_memory` of each).

    Args:
        model: a Keras model or MODEL spec.
        batch_size: the batch size of the step.
        produced: `(height, width)` of the images the pipeline yields.
        stored: `(height, width)` of the largest stored image.
    """
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
