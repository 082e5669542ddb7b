"""Child processes: results come back, errors keep their message, hangs after OOM are stopped."""

import os
import time

import pytest

from memfit import Budget, MemfitError
from memfit.measuring.child import measure_spec
from memfit.process.runner import run_in_child
from memfit.workload.spec import WorkloadSpec

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_oom_after_a_smaller_batch_comes_back_instead_of_hanging():
    # When this OOM strikes while Adam updates the variables, TensorFlow 2.21's BFC allocator
    # retries each refused allocation for 10 s and the step takes minutes to fail; the parent
    # stops such a child after oom_grace and still reports the OOM.
    start = time.monotonic()
    result = run_in_child(
        "hang_job:small_then_huge",
        {},
        budget=Budget.from_size("128MiB"),
        env={"PYTHONPATH": HERE},
        timeout=500,
        oom_grace=20,
    )
    assert time.monotonic() - start < 400
    if result.get("hung_after_oom"):
        assert "ran out of memory" in result["oom_message"] or "OOM" in result["oom_message"]
        # The allocator's own MaxInUse, read from its log: close to the 128 MiB cap.
        assert 64 * 2**20 < result["max_in_use_bytes"] <= 128 * 2**20
    else:
        assert result["first_oom"] is False
        assert result["second"]["oom"] is True


def test_child_errors_keep_their_message():
    with pytest.raises(MemfitError, match="batch size must be a whole number of at least 1"):
        run_in_child(
            measure_spec,
            {
                "workload": WorkloadSpec(
                    "keras.applications.MobileNetV2", input_shape=(32, 32, 3)
                ).to_json(),
                "batch_size": 0,
                "repeats": 1,
            },
            budget=Budget.from_size("64MiB"),
        )


def test_a_log_line_of_an_allocation_the_caller_can_do_without_is_no_oom():
    from memfit.process.runner import is_oom_line

    benign = (
        "W0000 bfc_allocator.cc:310] Allocator (bfc_cpu_allocator_for_gpu) ran out of memory "
        "trying to allocate 1.20GiB with freed_by_count=0. The caller indicates that this is "
        "not a failure, but this may mean that there could be performance gains if more "
        "memory were available."
    )
    fatal = (
        "W0000 bfc_allocator.cc:501] Allocator (bfc_cpu_allocator_for_gpu) ran out of memory "
        "trying to allocate 48.00MiB (rounded to 50331648)requested by op Conv2D"
    )
    assert not is_oom_line(benign)
    assert is_oom_line(fatal)
    assert is_oom_line("OOM when allocating tensor with shape[16,12276,20]")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread states from /proc")
def test_a_quiet_process_is_a_stall_only_while_memory_is_short():
    # Tearing down a step's iterator left a child quiet for seconds with a tenth of its budget
    # in use, and the watch answered an OOM for a step that had fitted: a quiet spell counts
    # only while `pressed()` says memory is short.
    from memfit.backend.tf import AllocatorStallWatch

    for short in (False, True):
        calls: list[float] = []
        with AllocatorStallWatch(
            lambda calls=calls: calls.append(time.monotonic()),
            window=0.3,
            interval=0.05,
            pressed=lambda short=short: short,
        ) as watch:
            time.sleep(1.0)  # this process does nothing meanwhile
        assert watch.stalled is short and len(calls) == int(short)
