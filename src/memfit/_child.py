"""Entry point of memfit's child processes (see memfit.isolate). Not public."""

from __future__ import annotations

import importlib
import json
import sys
import traceback
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
) -> dict[str, Any]:
    """Load a MODEL spec and measure it in this (fresh) process.

    `precision` and `remat` apply to the layers the spec builds (a dtype policy and a
    `keras.RematScope` around the build).
    """
    import contextlib

    from memfit.backend import tf as tfb
    from memfit.errors import MemfitError
    from memfit.isolate import RESIDENT_MARK
    from memfit.measure import measure
    from memfit.models import load_model
    from memfit.workload import Workload

    shape = input_shape[0] if input_shape and len(input_shape) == 1 else input_shape
    keras = tfb.import_keras()
    if precision:
        keras.mixed_precision.set_dtype_policy(precision)
    scope = keras.RematScope(mode=remat) if remat else contextlib.nullcontext()
    try:
        with scope:
            model = load_model(spec, input_shape=shape)
        # Tell the parent what is resident, in case the step fails slowly (see isolate.py).
        workload = Workload(model, optimizer=optimizer, loss=loss, input_shape=shape)
        if workload.model.optimizer is not None and not workload.model.optimizer.built:
            workload.model.optimizer.build(workload.model.trainable_variables)
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
    dataset = load_dataset(data) if data else None
    info = tfb.memory_info(tfb.default_device())
    if info is not None:
        print(f"{RESIDENT_MARK}{info['current']}", file=sys.stderr, flush=True)
    return measure(
        model,
        batch_size,
        data=dataset,
        input_shape=shape,
        optimizer=optimizer,
        loss=loss,
        repeats=repeats,
        worst_case=worst_case,
        micro_batches=micro_batches,
    ).to_dict()


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


def main(argv: list[str]) -> int:
    with open(argv[1]) as handle:
        job = json.load(handle)
    payload: dict[str, Any]
    try:
        import memfit  # noqa: F401 - applies MEMFIT_MEMORY before TensorFlow initialises
        from memfit.emulate import ensure_memory_statistics

        ensure_memory_statistics()

        module_name, _, attr = job["function"].partition(":")
        function = getattr(importlib.import_module(module_name), attr)
        payload = {"result": function(**job["kwargs"])}
    except Exception as exc:  # noqa: BLE001 - everything goes back to the parent
        is_memfit = "memfit.errors" in sys.modules and isinstance(
            exc, sys.modules["memfit.errors"].MemfitError
        )
        payload = {
            "error": {
                "type": type(exc).__name__,
                "message": str(exc),
                "memfit": is_memfit,
                "traceback": traceback.format_exc(),
            }
        }
    with open(job["result"], "w") as handle:
        json.dump(payload, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
