"""Replicas: a global batch split over data-parallel replicas, and what each replica holds.

Under a data-parallel `tf.distribute` strategy (`MirroredStrategy`,
`MultiWorkerMirroredStrategy`) each replica holds a full copy of the weights and optimizer
state and runs the training step on `global_batch / N` samples, so one replica's step is the
single-device step at that batch: memfit measures it so. On top of it comes the gradient
all-reduce. With the default `CommunicationOptions` (`bytes_per_pack=0`) TensorFlow's
collective all-reduce (`cross_device_utils.CollectiveReplicaLauncher.batch_all_reduce`, used
by `MultiWorkerMirroredStrategy` and by `MirroredStrategy` with collective ops) puts every
dense gradient of a replica in one pack, concatenates it into a single flat tensor, reduces
it and splits the result back into views; `MirroredStrategy`'s default NCCL all-reduce
(`_ConcatAndSplitPacker`, `num_packs=1`) concatenates the same way. That flat tensor is one
extra gradient-sized buffer per replica (the trainable weights' bytes), alive beside the
gradients it was made from. memfit takes it off the tightest replica's budget before
measuring, so the step's peak plus the buffer fits the budget.

Example:
    >>> per_replica_batch(256, 4)
    64
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from memfit.budget.budget import Budget
from memfit.checks import check_batch_size, check_replicas
from memfit.errors import MemfitError
from memfit.process.runner import run_in_child
from memfit.sizes import format_size
from memfit.workload.models import load_model
from memfit.workload.workload import shape_list

if TYPE_CHECKING:
    from memfit.workload.spec import WorkloadSpec


def replica_count(replicas: int | None = None, strategy: Any = None, budgets: int = 1) -> int:
    """The number of data-parallel replicas: `replicas`, else the strategy's, else the
    number of budgets given (one per replica), else 1.

    Args:
        replicas: the count the user gave, or None.
        strategy: a `tf.distribute` strategy (its `num_replicas_in_sync`), or None.
        budgets: how many budgets were given (more than one: one per replica).

    Raises:
        MemfitError: a count below 1, or counts that disagree.
    """
    counts = []
    if replicas is not None:
        counts.append(("--replicas / replicas=", check_replicas(replicas)))
    if strategy is not None:
        counts.append(("the strategy's num_replicas_in_sync", int(strategy.num_replicas_in_sync)))
    if budgets > 1:
        counts.append(("budgets given (one per replica)", budgets))
    values = {count for _, count in counts}
    if len(values) > 1:
        said = ", ".join(f"{count} {what}" for what, count in counts)
        raise MemfitError(
            f"the replica counts disagree: {said}; give one budget per replica, or a single "
            f"budget all replicas share"
        )
    return values.pop() if values else 1


def per_replica_batch(global_batch: int, replicas: int) -> int:
    """Each replica's share of a global batch, when the replicas can share it evenly.

    Raises:
        MemfitError: `global_batch` is not divisible by `replicas` (with the nearest sizes
            that are).
    """
    global_batch, replicas = check_batch_size(global_batch), check_replicas(replicas)
    if global_batch % replicas:
        below = global_batch - global_batch % replicas
        above = below + replicas
        nearest = f"{below} or {above}" if below else f"{above}"
        raise MemfitError(
            f"global batch {global_batch} is not divisible by {replicas} replicas: each replica "
            f"must get the same number of samples; use {nearest}"
        )
    return global_batch // replicas


def replica_budget(budget: Budget, allreduce_bytes: int, replicas: int) -> Budget:
    """What one replica's training step may use: `budget` less the all-reduce buffer.

    With one replica there is no all-reduce and `budget` is returned as it is.

    Raises:
        MemfitError: the all-reduce buffer alone takes the whole budget.
    """
    if replicas <= 1 or allreduce_bytes <= 0:
        return budget
    usable = budget.usable_bytes - allreduce_bytes
    if usable <= 0:
        raise MemfitError(
            f"the gradient all-reduce buffer alone ({format_size(allreduce_bytes)}) takes the "
            f"{format_size(budget.usable_bytes)} budget ({budget.name}); use cards with more "
            f"memory or a smaller model"
        )
    return Budget(
        usable_bytes=usable,
        name=f"{budget.name} less the {format_size(allreduce_bytes)} all-reduce buffer",
        source=budget.source,
        total_bytes=budget.total_bytes,
        device=budget.device,
        notes=(
            *budget.notes,
            f"{format_size(allreduce_bytes)} kept for the gradient all-reduce "
            f"({replicas} replicas: one gradient-sized buffer each)",
        ),
    )


def workload_replica_budget(
    budget: Budget, replicas: int, workload: WorkloadSpec, model: Any = None
) -> tuple[Budget, int]:
    """One replica's budget for a workload, and the all-reduce buffer taken off it.

    Args:
        budget: the tightest replica's budget.
        replicas: data-parallel replicas (1: the budget as it is, no buffer).
        workload: what is trained (its MODEL string is built in a child process).
        model: a Keras model given beside the workload, read here instead.

    Returns:
        `(budget, allreduce_bytes)`: `replica_budget`'s budget and the buffer (0 with one
        replica).
    """
    if replicas <= 1:
        return budget, 0
    buffer = allreduce_bytes(
        workload.model if model is None else model,
        input_shape=workload.sample_shape,
        classes=workload.classes,
        safe_mode=workload.safe_mode,
    )
    return replica_budget(budget, buffer, replicas), buffer


def trainable_bytes(
    spec: str,
    input_shape: Any = None,
    classes: int | None = None,
    safe_mode: bool = True,
) -> int:
    """Bytes of MODEL's trainable weights (its gradients'), building it from its MODEL string.

    Run in a child process by `allreduce_bytes` (it imports TensorFlow).
    """

    shape = input_shape[0] if input_shape and isinstance(input_shape[0], list) else input_shape
    model = load_model(spec, input_shape=shape, classes=classes, safe_mode=safe_mode)
    return model_trainable_bytes(model)


def model_trainable_bytes(model: Any) -> int:
    """Bytes of a built Keras model's trainable weights (the size of its gradients)."""
    total = 0
    for variable in model.trainable_variables:
        itemsize = getattr(getattr(variable, "dtype", None), "size", None)
        if not isinstance(itemsize, int):
            import numpy as np

            itemsize = np.dtype(str(variable.dtype)).itemsize
        total += int(math.prod(variable.shape)) * itemsize
    return total


def allreduce_bytes(
    model: Any,
    *,
    input_shape: Any = None,
    classes: int | None = None,
    safe_mode: bool = True,
) -> int:
    """The gradient all-reduce's extra buffer on each replica: the trainable weights' bytes.

    A model object is read here; a MODEL string is built in a child process, so this process
    stays free of TensorFlow state.

    Args:
        model: a built Keras model, or a MODEL string.
        input_shape: one sample's shape, for MODEL strings with undefined inputs.
        classes: classes of a built-in MODEL string.
        safe_mode: False loads a trusted `.keras` file that runs Python code.
    """
    if not isinstance(model, str):
        return model_trainable_bytes(model)

    return int(
        run_in_child(
            trainable_bytes,
            {
                "spec": model,
                "input_shape": [list(s) for s in shape_list(input_shape)] if input_shape else None,
                "classes": classes,
                "safe_mode": bool(safe_mode),
            },
        )
    )
