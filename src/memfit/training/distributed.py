"""Distributed: every worker of a multi-worker strategy takes the same out-of-memory decision.

Under `tf.distribute.MultiWorkerMirroredStrategy` each worker is a process of its own, with its
own memory and its own Python. One worker that runs out of memory and retries a batch with
more micro-batches while the others wait in the gradient all-reduce deadlocks the job. So
`GuardedStep` never assumes a decision: after each worker's attempt at a phase of the step,
every worker votes through one small collective (`Agreement.agree`) — its outcome (went
through, ran out of memory, cannot go on), the K it wants and whether it wants the update
guarded — and every worker takes the worst outcome and the largest K. All retry the same
batch with the same K, or all go on, or all stop with the same `DistributedError`.

The out-of-memory error must strike outside any collective: TensorFlow aborts a worker's
collective executor when a collective op fails or is cancelled (a failed op cancels the rest
of its function), and its collectives cannot run again in that process. The step is
therefore cut where the collectives are:

1. the gradients of K micro-batches (`AccumulatingStep.gradients`): local, no collective;
2. the vote on the gradients: a collective of three numbers;
3. the gradient all-reduce (`AccumulatingStep.reduce`): the collective alone; it allocates
   one all-reduced copy of the gradients (no K makes it smaller) and cannot be made safe: an
   out-of-memory error in it is a `DistributedError` on that worker, and TensorFlow fails the
   collective on the others (or its health check does, once that worker has exited);
4. the optimizer update with the all-reduced gradients (`AccumulatingStep.apply(...,
   reduced=True)`): local, no collective;
5. the vote on the update: every worker puts back its snapshot of the update's state if
   any ran out of memory in it.

In one process (no strategy, `MirroredStrategy`) there is one allocator and one Python
decision: `Agreement.active` is False, a vote returns the worker's own, and the step is
unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memfit.backend import tf as tfb
from memfit.errors import DistributedError

# A worker's outcome of a phase of the step, worst last: the vote takes the largest.
WENT_THROUGH = 0
OUT_OF_MEMORY = 1
CANNOT_GO_ON = 2


@dataclass(frozen=True)
class Verdict:
    """What every worker agreed on after a phase of the step.

    Attributes:
        outcome: the worst outcome of any worker: `WENT_THROUGH`, `OUT_OF_MEMORY` (every
            worker retries the batch) or `CANNOT_GO_ON` (every worker stops).
        micro_batches: the largest K any worker asked for.
        guard: whether any worker wants the optimizer update guarded (its state saved).
    """

    outcome: int
    micro_batches: int
    guard: bool

    @property
    def retry(self) -> bool:
        """Whether every worker retries the batch (some worker ran out of memory)."""
        return self.outcome == OUT_OF_MEMORY


class Agreement:
    """The votes through which the workers of a strategy take each OOM decision together.

    Active only under a strategy whose replicas span several processes
    (`MultiWorkerMirroredStrategy` with more than one worker); otherwise `agree` returns this
    worker's vote and costs nothing.

    Args:
        strategy: the model's `tf.distribute.Strategy`.

    Example:
        ```python
        agreement = Agreement(model.distribute_strategy)
        verdict = agreement.agree(OUT_OF_MEMORY if failed else WENT_THROUGH, k)
        if verdict.retry:
            k = verdict.micro_batches       # the same K on every worker
        ```
    """

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy
        self.workers = worker_count(strategy)
        self.active = self.workers > 1
        self._vote_fn: Callable[..., Any] | None = None

    def agree(self, outcome: int, micro_batches: int, guard: bool = False) -> Verdict:
        """Vote this worker's outcome of a phase; return what every worker agreed on.

        Every worker must call it at the same point of the step (it is a collective).

        Args:
            outcome: `WENT_THROUGH`, `OUT_OF_MEMORY` or `CANNOT_GO_ON`.
            micro_batches: the K this worker wants for the batch.
            guard: whether this worker wants the optimizer update guarded.

        Raises:
            DistributedError: the vote itself failed (another worker is gone).
        """
        if not self.active:
            return Verdict(outcome, micro_batches, guard)
        tf = tfb.import_tf()
        if self._vote_fn is None:
            self._vote_fn = self._make_vote_fn()
        mine = tf.constant([outcome, micro_batches, int(guard)], dtype=tf.float32)
        try:
            result = self.strategy.experimental_local_results(self._vote_fn(mine))[0].numpy()
        except Exception as exc:
            raise self.collective_failed(exc, "the vote on an out-of-memory decision") from None
        return Verdict(int(result[0]), int(result[1]), bool(result[2]))

    def any(self, flag: bool, what: str) -> bool:
        """Whether `flag` is set on any worker (on one process: `flag` itself).

        Every worker must call it at the same point (it is a collective, one more vote).

        Args:
            flag: this worker's flag (say, "I was sent SIGTERM").
            what: what the vote is about, for the error when it fails.

        Raises:
            DistributedError: the vote itself failed (another worker is gone).

        Example:
            ```python
            stop = agreement.any(signalled, "the vote on stopping for a SIGTERM")
            ```
        """
        if not self.active:
            return bool(flag)
        tf = tfb.import_tf()
        if self._vote_fn is None:
            self._vote_fn = self._make_vote_fn()
        mine = tf.constant([0, 0, int(bool(flag))], dtype=tf.float32)
        try:
            result = self.strategy.experimental_local_results(self._vote_fn(mine))[0].numpy()
        except Exception as exc:
            raise self.collective_failed(exc, what) from None
        return bool(result[2])

    def abandon(self) -> None:
        """Tell the other workers that this one cannot go on (before it raises its error).

        Best effort: when the collective itself fails there is nobody left to tell.
        """
        if not self.active:
            return
        with contextlib.suppress(DistributedError):
            self.agree(CANNOT_GO_ON, 0)

    def stopped_elsewhere(self, phase: str) -> DistributedError:
        """The error a worker raises when another worker voted that it cannot go on."""
        return DistributedError(
            f"another worker stopped in the {phase} of this step (its own error is in its "
            f"log); every worker stops with it, so none waits in a collective for ever"
        )

    def collective_failed(self, exc: BaseException, what: str) -> BaseException:
        """The error for a collective that failed on this worker (TensorFlow's line inside).

        TensorFlow aborts the worker's collectives after such a failure; they cannot run
        again in this process. An error that is not TensorFlow's (one in tracing, say) is
        returned as it is.
        """
        if not isinstance(exc, tfb.import_tf().errors.OpError):
            return exc
        cause = (
            f"out of memory ({tfb.oom_summary(exc)})"
            if tfb.is_oom(exc)
            else f"{type(exc).__name__} ({_telling_line(exc)})"
        )
        return DistributedError(
            f"{what} failed across workers: {cause}. TensorFlow cannot run collectives again "
            f"in this process after that; restart the job from your last checkpoint"
            + (
                " on a budget with room for a second copy of the gradients beside the weights "
                "and optimizer slots (the all-reduce's output: no K makes it smaller)"
                if tfb.is_oom(exc)
                else ""
            )
        )

    def _make_vote_fn(self) -> Callable[..., Any]:
        tf = tfb.import_tf()
        strategy = self.strategy

        def replica_vote(mine: Any) -> Any:
            everyone = tf.distribute.get_replica_context().all_gather(mine[tf.newaxis], axis=0)
            return tf.reduce_max(everyone, axis=0)

        def vote(mine: Any) -> Any:
            return strategy.run(replica_vote, args=(mine,))

        return tf.function(vote, autograph=False)


def _telling_line(exc: BaseException) -> str:
    """The line of a TensorFlow error that says what happened (not "Graph execution error:")."""
    text = getattr(exc, "message", None) or str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if any(word in line for word in ("abort", "unhealthy", "closed", "Cancel", "Unavailable")):
            return line[:300]
    lines = [line for line in lines if not line.startswith(("Graph execution error", "Detected"))]
    return lines[0][:300] if lines else ""


def worker_count(strategy: Any) -> int:
    """How many processes (workers) the replicas of `strategy` span; 1 for one process.

    Args:
        strategy: a `tf.distribute.Strategy` (or None: the default, one process).

    Example:
        >>> worker_count(tf.distribute.MultiWorkerMirroredStrategy())   # TF_CONFIG: 2 workers
        2
    """
    if strategy is None:
        return 1
    tf = tfb.import_tf()
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return 1
    local = len(strategy.extended.worker_devices)
    return max(1, strategy.num_replicas_in_sync // max(1, local))


def fix_keras_multi_worker_build(model: Any) -> Callable[[], None]:
    """Let `model.fit` start under `MultiWorkerMirroredStrategy` (Keras 3); returns an undo.

    Keras 3's `fit` builds the model from its first batch with `strategy.reduce("MEAN",
    batch)`, which `MultiWorkerMirroredStrategy` refuses for a batch of several tensors
    (`ValueError: Attempt to convert a value (PerReplica ...)`; keras-team/keras#20585,
    tensorflow/tensorflow#72388). The build only needs the batch's shapes: this builds from
    this worker's own part of it instead, with no collective. Does nothing in one process.

    Args:
        model: the compiled Keras model `memfit.fit` trains.

    Returns:
        A function that puts Keras' own build back.
    """
    if worker_count(model.distribute_strategy) <= 1:
        return lambda: None
    tf = tfb.import_tf()
    strategy = model.distribute_strategy
    keras_build = model._maybe_symbolic_build

    def local(value: Any) -> Any:
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    def build(iterator: Any = None, data_batch: Any = None) -> Any:
        if iterator is not None and data_batch is None:
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(local, next(batches))
                break
        return keras_build(data_batch=data_batch)

    model._maybe_symbolic_build = build

    def undo() -> None:
        if model.__dict__.get("_maybe_symbolic_build") is build:
            del model._maybe_symbolic_build

    return undo
