"""Entry point of memfit's child processes (see memfit.isolate). Not public."""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any


def measure_spec(
    spec: str,
    batch_size: int,
    data: str | None,
    input_shape: list[list[int]] | None,
    optimizer: str | None,
    loss: str | None,
    repeats: int,
    worst_case: bool = False,
    micro_batches: int = 1,
    precision: str | None = None,
    remat: str | None = None,
    classes: int | None = None,
    safe_mode: bool = True,
) -> dict[str, Any]:
    """Load a MODEL spec and measure it in this (fresh) process.

    `precision` and `remat` apply to the layers the spec builds (a dtype policy and a
    `keras.RematScope` around the build); `classes` and `safe_mode` as in `load_model`.
    """
    measure = open_measurer(
        spec,
        data,
        input_shape,
        optimizer,
        loss,
        worst_case,
        micro_batches,
        precision,
        remat,
        classes=classes,
        safe_mode=safe_mode,
    )
    return measure(batch_size=batch_size, repeats=repeats)


def open_measurer(
    spec: str,
    data: str | None,
    input_shape: list[list[int]] | None,
    optimizer: str | None,
    loss: str | None,
    worst_case: bool = False,
    micro_batches: int = 1,
    precision: str | None = None,
    remat: str | None = None,
    saved_data: str | None = None,
    imports: list[str] | None = None,
    warm_relaxed: bool = False,
    classes: int | None = None,
    safe_mode: bool = True,
) -> Callable[..., dict[str, Any]]:
    """Load a MODEL spec once; return `measure(batch_size, repeats)` for this process.

    `classes` (a built-in's classes) and `safe_mode` (False: a trusted `.keras` file may
    run its Python code, such as a Lambda layer) are passed to `load_model`.

    `saved_data` is a folder written by `tf.data.Dataset.save` (samples a parent process
    chose), used instead of a `data` spec. `imports`: packages to import first, so that a
    saved model's classes are registered (keras_hub models, say). `warm_relaxed`: trace the
    shared relaxed step now (`Workload.warm_relaxed`), so that a first
    `measure(..., exact=False)` costs only the graph's optimisation and its steps.
    """
    for name in imports or []:
        importlib.import_module(name)
    import contextlib

    from memfit.backend import tf as tfb
    from memfit.errors import MemfitError
    from memfit.isolate import RESIDENT_MARK
    from memfit.measure import _check_batch_size, measure_workload
    from memfit.models import load_model
    from memfit.workload import Workload

    shape = input_shape[0] if input_shape and len(input_shape) == 1 else input_shape
    keras = tfb.import_keras()
    if precision:
        keras.mixed_precision.set_dtype_policy(precision)
    scope = keras.RematScope(mode=remat) if remat else contextlib.nullcontext()
    dataset = load_dataset(data) if data else None
    if saved_data:
        dataset = tfb.import_tf().data.Dataset.load(saved_data)
    try:
        with scope:
            model = load_model(spec, input_shape=shape, classes=classes, safe_mode=safe_mode)
        workload = Workload(
            model,
            optimizer=optimizer,
            loss=loss,
            input_shape=shape,
            data=dataset,
            worst_case=worst_case,
        )
        if workload.model.optimizer is not None and not workload.model.optimizer.built:
            workload.model.optimizer.build(workload.model.trainable_variables)
        if warm_relaxed:
            workload.warm_relaxed()
    except Exception as exc:
        if not tfb.is_oom(exc):
            raise
        from memfit.budget import emulated_budget

        budget = emulated_budget()
        raise MemfitError(
            f"the model's weights and optimizer state alone do not fit in "
            f"{budget.name if budget else 'the budget'}: creating them ran out of memory "
            f"({tfb.oom_summary(exc)}). No batch size can fit; use a card with more memory, a "
            f"smaller model, or an optimizer with less state (SGD keeps none, Adam two copies "
            f"of the weights)"
        ) from None
    device = tfb.default_device()
    info = tfb.memory_info(device)
    if info is not None:
        # Tell the parent what is resident, in case a step fails slowly (see isolate.py).
        print(f"{RESIDENT_MARK}{info['current']}", file=sys.stderr, flush=True)
    from memfit.budget import emulated_budget

    budget = emulated_budget()

    def measure(
        batch_size: int,
        repeats: int,
        exact: bool = True,
        restore: bool = True,
        warm_up: bool = True,
        warm_up_batch: int | None = None,
    ) -> dict[str, Any]:
        _check_batch_size(batch_size)
        tfb.require_memory_stats(device)
        with _stall_exits(device, info["current"] if info else 0):
            return measure_workload(
                workload,
                int(batch_size),
                repeats=repeats,
                device=device,
                budget=budget,
                micro_batches=micro_batches,
                exact=exact,
                restore=restore,
                warm_up=warm_up,
                warm_up_batch=warm_up_batch,
            ).to_dict()

    return measure


# Where the call being answered writes its result. `main` runs as `__main__` and fills the
# list of the imported `memfit._child`, the module the handlers come from.
_answer_path: list[str] = []


def _stall_exits(device: str, resident: int) -> Any:
    """Around a measurement in this child: when the step stalls in TensorFlow's allocator
    retry (an OOM is then certain, see `AllocatorStallWatch`), answer OOM now and end the
    process instead of waiting out the 10 s retry. The child is used up after an OOM anyway."""
    import contextlib

    from memfit.backend import tf as tfb
    from memfit.sizes import format_size

    if not _answer_path or not tfb.allocator_stall_detectable(device):
        return contextlib.nullcontext()

    def answer_oom() -> None:
        info = tfb.memory_info(device) or {}
        _write(
            _answer_path[-1],
            {
                "result": {
                    "hung_after_oom": True,
                    "allocator_stall": True,
                    "max_in_use_bytes": info.get("peak"),
                    "resident_bytes": resident,
                    "oom_message": (
                        f"an allocation waited for memory with "
                        f"{format_size(info.get('current', 0))} in use and nothing left "
                        f"running to free any"
                    ),
                }
            },
        )
        sys.stderr.flush()
        os._exit(0)

    return tfb.AllocatorStallWatch(answer_oom)


def dataset_size(spec: str) -> int:
    """Number of samples a `package.module:dataset_fn` dataset yields (reads it once)."""
    dataset = load_dataset(spec)
    count = int(dataset.cardinality())
    if count >= 0:
        return count
    return sum(1 for _ in dataset)


def load_dataset(spec: str) -> Any:
    """Call a `package.module:dataset_fn` that returns a tf.data.Dataset of (x, y) samples."""
    from memfit.models import _call_factory

    return _call_factory(spec)


def _payload(call: Callable[[], Any]) -> dict[str, Any]:
    """Run `call`; its result, or its error as the parent re-raises it."""
    try:
        return {"result": call()}
    except Exception as exc:  # noqa: BLE001 - everything goes back to the parent
        is_memfit = "memfit.errors" in sys.modules and isinstance(
            exc, sys.modules["memfit.errors"].MemfitError
        )
        return {
            "error": {
                "type": type(exc).__name__,
                "message": str(exc),
                "memfit": is_memfit,
                "traceback": traceback.format_exc(),
            }
        }


def _write(path: str, payload: dict[str, Any]) -> None:
    # Written whole, then renamed: the parent polls for the file and must never see half.
    with open(path + ".part", "w") as handle:
        json.dump(payload, handle)
    os.replace(path + ".part", path)


def _function(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def main(argv: list[str]) -> int:
    with open(argv[1]) as handle:
        job = json.load(handle)
    answer_path = importlib.import_module("memfit._child")._answer_path

    def prepare() -> Any:
        import memfit  # noqa: F401 - applies MEMFIT_MEMORY before TensorFlow initialises
        from memfit.emulate import ensure_memory_statistics

        ensure_memory_statistics()
        return _function(job["function"])(**job["kwargs"])

    if not job.get("serve"):
        answer_path.append(job["result"])
        _write(job["result"], _payload(prepare))
        return 0
    # Serving: the function returned a handler; answer one request per stdin line.
    handler: list[Any] = []
    ready = _payload(lambda: handler.append(prepare()))
    _write(job["result"], ready)
    if "error" in ready:
        return 0
    for line in sys.stdin:
        request = json.loads(line)
        answer_path.append(request["result"])
        _write(request["result"], _payload(lambda r=request: handler[0](**r["kwargs"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
