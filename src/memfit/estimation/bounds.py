"""The high bound of an estimate: the step's peak in the processes TensorFlow could run.

One process's peak is not the step's: with one inter-op thread, TensorFlow's executor meets
the consumers of an op with more than four out-edges in address order, and with several
inter-op threads which of the ops made ready together runs first is a race, so the order of
the step (and with it which tensors are live together) changes from one process to the next.
What ran before the step (the allocator's history: which free chunks lie where) decides
which chunk each request gets, and in one region a chunk less than twice the request is
handed out whole. The likely peak (`memfit.estimation.simulate.replay`) plays grappler's node
order from a fresh allocator; the high bound replays `samples` other processes, each with its
own history (warm-up steps in drawn orders) and its own order for the measured steps, and
takes the highest peak, plus an allowance for the histories the samples do not reach.

With several inter-op threads each thread runs depth first, as the single thread does, and
hands the other ready ops to the pool, where an idle thread takes them: half the samples
replay that depth-first order (the likely peak's model), the other half the ready-queue
model of several threads (`replay(..., race=True)`: which ready op runs first is a race).

Under several inter-op threads, ops that run side by side also race for the allocator: which
of them asks first decides which free chunk each request finds. A small CNN's step (64 px,
batch 16, Adam, default threading) measured 77.1 MB in most processes and 80.3 to 90.3 MB in
some, with the same tensors live at the peak: the 28.3 MB im2col scratch of a
`Conv2DBackpropFilter`, run beside the `Conv2DBackpropInput` of the same layer, asked before
that op's output and took a free chunk of 41.6 or 49.9 MB whole, where it usually gets one of
34.7 or 36.8 MB. So each sample also plays that race (`BFC.raced_peak`: a request may be
handed whole any chunk under twice its size that the free bytes below the region's
high-water mark could form; two requests, of ops on two threads, may each win such a race),
and under several inter-op threads the bound covers the highest raced peak. VGG16 (96 px,
batch 2, Adam) updates its two largest variables side by side, and in its profiles one or
two of those 64-72 MiB buffers held a larger chunk whole at the peak (794 to 990 MiB in 15
processes, 805 pinned to one thread).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memfit.estimation.simulate import Replay, replay

# Processes replayed beside the likely one (each a warm-up history and an executor order).
SAMPLES = 4
# Warm-up steps before the measured ones in each sampled process: its allocator history.
WARMUPS = 2
# Measured steps in each sampled process (the highest counts, as `memfit.measure` reports).
STEPS = 3
# Allowance above the highest sampled peak for histories and orders the samples miss,
# calibrated on the accuracy benchmark's 18 model families held out one at a time
# (`bench.calibration`, split-conformal at 95%): the largest allowance any held-out fold was
# given (4.2%, pinned, with MobileNetV2 held out) rounded up to a whole percent. Calibrated on
# every family at once it comes out at 1.03% pinned (0 at default threading, where the raced
# peak covers every case), but that value rests on one case and moved from 4.2% as ten cases
# came in. At 5% the bound covered 42 of 42 cases under each threading, at a median margin of
# +10.2% (default) and +10.8% (pinned) (docs/design/estimate.md, "The range").
ALLOWANCE = 0.05
# The steps the sampled bound stands for: the highest of this many steps after a warm-up in
# a fresh process (as the accuracy benchmark measures it).
BOUND_STEPS = 5
# Steps of training the high bound covers by default: a run, not a handful of steps.
RUN_STEPS = 200
# How far the highest step of a run of N steps lies above the highest of its first
# `BOUND_STEPS` (steps 2-6 after a warm-up): N -> ratio, the most over the 7 cases of
# `bench.step_rise` (3 fresh processes of 200 steps of plain `model.fit` each, default
# threading, one-region card; MobileNetV2 96 px b8 rose most at 200 steps, MobileNet 128 px
# b16 at 20). Between two N it follows the logarithm of the steps; past the last (not
# measured), the rise per doubling from the first to the last goes on.
RUN_RISE = {20: 1.087, 50: 1.089, 100: 1.096, 200: 1.128}


@dataclass
class PeakRange:
    """The likely peak, the high bound, and each sampled process's peak (bytes).

    `highest` is the replay of the sampled process with the highest peak (its live set at
    that peak; its order left out), None without samples.
    """

    likely_bytes: int
    high_bytes: int
    sample_bytes: list[int] = field(default_factory=list)
    highest: Replay | None = None


def peak_range(
    graph: Any,
    likely_bytes: int,
    *,
    region_bytes: int | None = None,
    samples: int = SAMPLES,
    seed: int = 0,
    on_sample: Callable[[int, int], None] | None = None,
) -> PeakRange:
    """The high bound of a traced step's peak over the processes TensorFlow could run.

    Args:
        graph: the traced step (`memfit.backend.tf_graph.StepGraph`).
        likely_bytes: the likely peak (`replay(graph).peak_bytes`); the bound is never
            below it.
        region_bytes: the emulated card's one region, as for `replay`.
        samples: processes to replay (0: the bound is the likely peak plus the allowance).
        seed: the first sample's seed; the same seed gives the same bound.
        on_sample: called with (samples done, samples) after each.

    Returns:
        A `PeakRange`.

    Example:
        ```python
        graph = tf_trace.trace_step(workload, 32)
        likely = replay(graph).peak_bytes
        print(peak_range(graph, likely).high_bytes)
        ```
    """
    peaks: list[int] = []
    raced = 0
    top: Replay | None = None
    for i in range(samples):
        result = replay(
            graph,
            steps=STEPS,
            region_bytes=region_bytes,
            order_seed=seed + i,
            warmups=WARMUPS,
            race=i % 2 == 1,
        )
        peaks.append(result.peak_bytes)
        if top is None or result.peak_bytes > top.peak_bytes:
            result.order = []  # thousands of names nobody reads again (and the child pickles)
            top = result
        if int(getattr(graph, "inter_op_threads", 1)) > 1:
            raced = max(raced, result.raced_peak_bytes)
        if on_sample is not None:
            on_sample(i + 1, samples)
    highest = max([likely_bytes, *peaks])
    return PeakRange(likely_bytes, max(int(highest * (1 + ALLOWANCE)), raced), peaks, top)


def run_rise(steps: int) -> float:
    """How far the highest step of `steps` steps of training lies above the highest of 5.

    Over a run the allocator's free chunks split up (in one region a chunk less than twice
    a request is handed out whole) and, under several inter-op threads, each step's order
    is a race: the highest step rises with the steps run, most in the first tens of steps.
    The rise is `RUN_RISE`, measured (`bench.step_rise`; docs/design/estimate.md, "A run,
    not five steps"), followed on the logarithm of the steps between the measured lengths; past the
    longest, the rise per doubling from the shortest to the longest goes on; 1 for 5 steps
    or fewer.

    Args:
        steps: steps of training the bound is for (at least 1).

    Example:
        >>> run_rise(5)
        1.0
        >>> run_rise(2000) >= run_rise(200) >= run_rise(20) >= 1.0
        True
    """
    points = [(BOUND_STEPS, 1.0), *sorted(RUN_RISE.items())]
    if steps <= BOUND_STEPS:
        return 1.0
    for (a, rise_a), (b, rise_b) in zip(points, points[1:], strict=False):
        if steps <= b:
            return rise_a + (rise_b - rise_a) * math.log2(steps / a) / math.log2(b / a)
    (a, rise_a), (b, rise_b) = points[1], points[-1]
    return rise_b + (rise_b - rise_a) * math.log2(steps / b) / math.log2(b / a)
