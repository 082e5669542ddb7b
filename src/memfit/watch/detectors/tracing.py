"""Retracing: the train function traced again and again after warm-up, and why.

Each trace keeps its graph and buffers, so retracing is also a cause of memory growth
(`memfit.watch.detectors.growth` words its cause with `retrace_cause`).
"""

from __future__ import annotations

from memfit.watch.findings import WatchFinding


def retrace_cause(guarded: bool) -> str:
    """Why a train function is traced again and again."""
    if guarded:
        return (
            "memfit.fit traces its step for each new input shape exactly, and batches keep "
            "arriving with new shapes (each traced function keeps its graph and buffers)"
        )
    return (
        "tf.function traces again for each new input signature: batches with varying shapes "
        "(variable image sizes or sequence lengths, a last smaller batch), Python numbers "
        "passed as arguments, or the model recompiled / train_function reset"
    )


def retrace_fix(guarded: bool) -> str:
    """What to do about retracing (memfit.fit traces per shape and K, Keras per signature)."""
    if guarded:
        return (
            "give batches a few fixed shapes (memfit.fit keeps one traced step per input shape "
            "and micro-batch count): resize or pad images to a few size buckets, batch with "
            "`drop_remainder=True`; or pass micro_batches= up front so an out-of-memory retry "
            "does not trace the step again"
        )
    return (
        "give batches a few fixed shapes: resize or pad to size buckets "
        "(`padded_batch`, `tf.data.experimental.bucket_by_sequence_length`), batch with "
        "`drop_remainder=True`, pass tensors rather than Python numbers, and do not compile "
        "or reset the train function inside the loop"
    )


def retracing(
    step: int,
    traces: int | None,
    traces_at_warmup: int | None,
    warmup_steps: int,
    *,
    guarded: bool = False,
    min_retraces: int = 5,
) -> WatchFinding | None:
    """`retracing` when the train function was traced `min_retraces` times since warm-up.

    Args:
        step: the current step.
        traces: how often the train function has been traced so far.
        traces_at_warmup: the count at the end of warm-up.
        warmup_steps: the warm-up's length in steps.
        guarded: the step is memfit.fit's (its cause and fix differ).
        min_retraces: traces after warm-up that make a finding.
    """
    if traces is None or traces_at_warmup is None:
        return None
    retraces = traces - traces_at_warmup
    if retraces < min_retraces:
        return None
    return WatchFinding(
        kind="retracing",
        step=step,
        epoch=None,
        message=(
            f"the train function was traced again {retraces} times after warm-up "
            f"(in {step - warmup_steps} steps)"
        ),
        cause=retrace_cause(guarded),
        fix=retrace_fix(guarded),
        evidence={
            "traces": traces,
            "retraces_after_warmup": retraces,
            "steps_after_warmup": step - warmup_steps,
        },
    )
