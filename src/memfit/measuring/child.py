"""The measurement's side of a child process: build a workload and measure its step here.

`memfit.measuring.isolate` and the batch search (`memfit.search.trials`) run these in a fresh
process (`memfit.process.run_in_child`, `ChildWorker`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

from memfit.backend import tf as tfb
from memfit.budget.budget import emulated_budget
from memfit.checks import check_batch_size
from memfit.errors import MemfitError
from memfit.process.child import answer_paths, write_answer
from memfit.process.runner import RESIDENT_MARK
from memfit.recomputation.remat import recompute as segmented
from memfit.recomputation.remat import remat_recompute
from memfit.sizes import format_size
from memfit.workload.spec import WorkloadSpec
from memfit.workload.step import refuse_for_step


def measure_spec(
    workload: dict[str, Any],
    batch_size: int,
    repeats: int,
    micro_batches: int = 1,
    recompute: Any = None,
    explain: bool = False,
) -> dict[str, Any]:
    """Build a workload (`WorkloadSpec.to_json`) and measure it in this (fresh) process.

    `micro_batches`, `recompute` and `explain` as in `memfit.measure`.
    """
    measure = open_measurer(workload, micro_batches=micro_batches, recompute=recompute)
    return measure(batch_size=batch_size, repeats=repeats, explain=explain)


def open_measurer(
    workload: dict[str, Any],
    micro_batches: int = 1,
    warm_relaxed: bool = False,
    recompute: Any = None,
) -> Callable[..., dict[str, Any]]:
    """Build a workload (`WorkloadSpec.to_json`) once; return `measure(batch_size, repeats)`.

    The model is built under the spec's precision (left set: the process is thrown away) and
    recompute. `warm_relaxed`: trace the shared relaxed step now (`Workload.warm_relaxed`),
    so that a first `measure(..., exact=False)` costs only the graph's optimisation and its
    steps.
    """
    # Here, not at the top: the measurer starts this module's functions in a child
    # (`memfit.measuring.isolate`), so it imports this module first.
    from memfit.measuring.measurer import measure_workload

    spec = WorkloadSpec.from_json(workload)
    recompute = recompute or remat_recompute(spec.remat)
    try:
        if spec.is_task:
            # The task's own step: its model, optimizer and train_step (a `StepWorkload`).
            refuse_for_step(recompute=recompute)
            built = spec.task_workload()
            built.build_optimizer()
        else:
            built = spec.workload(spec.build_model(keep_policy=True))
        if (
            not spec.is_task
            and built.model.optimizer is not None
            and not built.model.optimizer.built
        ):
            built.model.optimizer.build(built.model.trainable_variables)
        if recompute:
            # memfit's recompute (`memfit.recompute`), applied for this throwaway process.
            segmented(built.model, recompute).apply()
        if warm_relaxed:
            built.warm_relaxed()
    except Exception as exc:
        if not tfb.is_oom(exc):
            raise
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
        # Tell the parent what is resident, in case a step fails slowly (see _runner.py).
        print(f"{RESIDENT_MARK}{info['current']}", file=sys.stderr, flush=True)
    budget = emulated_budget()

    def measure(
        batch_size: int,
        repeats: int,
        exact: bool = True,
        restore: bool = True,
        warm_up: bool = True,
        warm_up_batch: int | None = None,
        continuous: bool = False,
        explain: bool = False,
    ) -> dict[str, Any]:
        check_batch_size(batch_size)
        tfb.require_memory_stats(device)
        stall = _stall_exits(
            device, info["current"] if info else 0, budget.usable_bytes if budget else None
        )
        with stall:
            return measure_workload(
                built,
                int(batch_size),
                repeats=repeats,
                device=device,
                budget=budget,
                micro_batches=micro_batches,
                exact=exact,
                restore=restore,
                warm_up=warm_up,
                warm_up_batch=warm_up_batch,
                continuous=continuous,
                explain=explain,
            ).to_dict()

    return measure


# Share of the room above the resident bytes that a step must hold for a quiet child to be
# taken to wait for memory.
STALL_PRESSURE = 0.5


def _stall_exits(device: str, resident: int, limit: int | None = None) -> Any:
    """Around a measurement in this child: when the step stalls in TensorFlow's allocator
    retry (an OOM is then certain, see `AllocatorStallWatch`), answer OOM now and end the
    process instead of waiting out the 10 s retry. The child is used up after an OOM anyway.

    A quiet spell counts only while the step holds at least `STALL_PRESSURE` of the room the
    budget's `limit` leaves above the `resident` bytes: a request refused with more than that
    free would be a single tensor larger than the rest of the step, and TensorFlow then
    raises after its retry all the same. Without a limit (no emulated budget: the CPU
    allocator is not capped) there is no watch."""
    if not answer_paths or limit is None or not tfb.allocator_stall_detectable(device):
        return contextlib.nullcontext()

    def answer_oom() -> None:
        info = tfb.memory_info(device) or {}
        write_answer(
            answer_paths[-1],
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

    def pressed() -> bool:
        info = tfb.memory_info(device) or {}
        held = info.get("current", 0) - resident
        return held >= STALL_PRESSURE * (limit - resident)

    return tfb.AllocatorStallWatch(answer_oom, pressed=pressed)
