"""TensorFlow's CPU kernels and runtime, as the allocator sees them: aliases, scratch, threads.

Which ops make views of an input (`ALIAS_OPS`), may take over an input buffer
(`FORWARDING_OPS`), write a variable in place (`ASSIGN_OPS`) or allocate nothing
(`NO_ALLOC_OPS`); the scratch memory of Conv2D backprop and of XLA-compiled grouped
convolutions; the thread pools' sizes.

The kernel facts encoded here are from TensorFlow 2.21's CPU kernels (oneDNN off, as under
emulation) and were checked against allocator traces (`tf.profiler` `MemoryAllocation` events,
region `temp`): see `conv_backprop_scratch_bytes`.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

# Ops whose output is a view of an input buffer (no allocation): output i aliases input i
# (or input 0).
ALIAS_OPS = frozenset(
    {
        "Identity",
        "IdentityN",
        "Reshape",
        "Squeeze",
        "ExpandDims",
        "StopGradient",
        "PreventGradient",
        "Snapshot",
        "EnsureShape",
        "Bitcast",
        "ReadVariableOp",
    }
)
# Kernels that reuse an input buffer for their output when nothing else holds that input
# (`OpKernelContext::forward_input_or_allocate_output`): element-wise ops and a few more.
FORWARDING_OPS = frozenset(
    {
        "Abs", "Add", "AddN", "AddV2", "BiasAdd", "Cast", "DivNoNan", "Elu", "EluGrad", "Erf",
        "Exp", "FloorDiv", "Gelu", "GeluGrad", "LeakyRelu", "LeakyReluGrad", "Log", "Maximum",
        "Minimum", "Mul", "MulNoNan", "Neg", "Pow", "RealDiv", "Reciprocal", "Relu", "Relu6",
        "Relu6Grad", "ReluGrad", "Rsqrt", "RsqrtGrad", "Select", "SelectV2", "Selu", "SeluGrad",
        "Sigmoid", "SigmoidGrad", "Sign", "Softplus", "SoftplusGrad", "Sqrt", "SqrtGrad",
        "Square", "SquaredDifference", "Sub", "Tanh", "TanhGrad", "ClipByValue", "Floor",
        "Round", "Ceil", "Inv", "InvGrad", "ReciprocalGrad", "Xdivy", "Xlogy", "Softsign",
        "SoftsignGrad", "Mish",
    }
)  # fmt: skip
# Ops that write a resource variable in place (the optimizer's update).
ASSIGN_OPS = frozenset(
    {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceScatterUpdate"}
)
# Kernels that allocate nothing the step keeps (constants live in the kernel, made once).
NO_ALLOC_OPS = frozenset({"Const", "NoOp", "Placeholder", "VarHandleOp"})

# Conv2DCustomBackprop{Input,Filter} (conv_grad_{input,filter}_ops.cc) size their im2col buffer
# by an L3 "target working set" of 30 MiB, not by the batch, and Conv2DBackpropInput skips it
# (one image at a time) when each thread's share of one image's work exceeds the L2 size that
# Eigen reports. Both constants were checked against allocator traces on this CPU.
TARGET_WORKING_SET_BYTES = 30 << 20
DEFAULT_L2_BYTES = 256 << 10


def tensor_bytes(shape: Any, dtype: Any) -> int:
    if shape.rank is None or dtype.name in ("resource", "variant", "string"):
        return 0
    dims = [d if d is not None and d >= 0 else 1 for d in shape.as_list()]
    try:
        size = dtype.size
    except (AttributeError, TypeError, ValueError):
        return 0
    return int(math.prod(dims)) * int(size)


def _l2_bytes() -> int:
    value = os.environ.get("MEMFIT_L2_BYTES")
    return int(value) if value and value.isdigit() else DEFAULT_L2_BYTES


def conv_backprop_scratch_bytes(op: Any, intra_threads: int) -> int:
    """Bytes of the im2col buffer TensorFlow's CPU Conv2D backprop kernels allocate.

    Follows `Conv2DCustomBackpropInputOp` / `Conv2DCustomBackpropFilterOp` (TF 2.21, NHWC):
    `shard = ceil(30 MiB / itemsize / work_unit)` images of `out_h*out_w x kh*kw*in_depth`,
    where `work_unit` sums the three matrices of one image's matmul; backprop-input uses one
    image at a time (shard 1) when the batch is 1 or one thread's share of the work is at
    least Eigen's L2 size.
    """
    if op.type == "Conv2DBackpropInput":
        input_shape = op.outputs[0].shape
        filter_shape = op.inputs[1].shape
    else:
        input_shape = op.inputs[0].shape
        filter_shape = op.outputs[0].shape
    backprop_shape = op.inputs[2].shape
    if not (
        input_shape.is_fully_defined()
        and filter_shape.is_fully_defined()
        and backprop_shape.is_fully_defined()
    ):
        return 0
    batch, out_h, out_w, _ = backprop_shape.as_list()
    kh, kw, in_depth, out_depth = filter_shape.as_list()
    itemsize = op.outputs[0].dtype.size
    image = out_h * out_w
    filter_total = kh * kw * in_depth
    work = image * filter_total + image * out_depth + filter_total * out_depth
    if work <= 0:
        return 0
    shard = -(-(TARGET_WORKING_SET_BYTES // itemsize) // work)
    if op.type == "Conv2DBackpropInput" and (
        batch == 1 or work // max(1, intra_threads) >= _l2_bytes() // itemsize
    ):
        shard = 1
    return int(shard * image * filter_total * itemsize)


def xla_grouped_conv_scratch_bytes(op: Any) -> int:
    """Bytes of the temporaries of an XLA-compiled call that backpropagates a grouped conv.

    Keras runs a grouped convolution (`Conv2D(groups=...)`, ConvNeXt's 7x7 "depthwise" one)
    through `tf.function(jit_compile=True)` on TensorFlow, since the CPU kernels do not take
    groups. XLA's CPU backend computes its gradients on the dense filter (kh x kw x all input
    channels x output channels, masked to the groups), holding two buffers of that size while
    the call runs (measured: 2 x 110 MiB for a 7x7, 768-channel one, whatever the batch and
    image size; the input and filter gradients of one call share them).
    """
    if op.type not in ("PartitionedCall", "StatefulPartitionedCall"):
        return 0
    try:
        if not op.get_attr("_XlaMustCompile"):
            return 0
        definition = op.graph._get_function(op.get_attr("f").name).cached_definition
    except (ValueError, AttributeError, TypeError):
        return 0
    args = [arg.name for arg in definition.signature.input_arg]

    def call_input(ref: str) -> Any:
        name = ref.split(":")[0]
        return op.inputs[args.index(name)] if name in args else None

    kernels, activations = [], []
    for node in definition.node_def:
        if node.op == "Conv2DBackpropInput" and len(node.input) > 2:
            kernels.append(call_input(node.input[1]))
            activations.append(call_input(node.input[2]))
        elif node.op == "Conv2DBackpropFilter" and len(node.input) > 2:
            activations.append(call_input(node.input[0]))
    kernel = next((k for k in kernels if k is not None and k.shape.is_fully_defined()), None)
    if kernel is None or kernel.shape.rank != 4:
        return 0
    kh, kw, in_per_group, out_depth = kernel.shape.as_list()
    channels = max(
        (a.shape.as_list()[-1] for a in activations if a is not None and a.shape.rank == 4),
        default=0,
    )
    if not channels or in_per_group >= channels:
        return 0
    return 2 * kh * kw * channels * out_depth * kernel.dtype.size


def schedulable_cpus() -> int:
    """CPUs this process may run on: TensorFlow's default for both thread pools.

    TensorFlow sizes its inter- and intra-op pools by `port::MaxParallelism()`, which counts
    the CPUs in the process's affinity mask (`sched_getaffinity`), not all CPUs of the machine:
    under `taskset -c 1` on a 2-core machine it runs one inter-op thread.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# Thread counts assumed for another machine (`assume_threads`), else None: this process's.
_assumed: tuple[int, int] | None = None


@contextlib.contextmanager
def assume_threads(inter: int, intra: int) -> Iterator[None]:
    """Describe steps as a process with `inter` inter-op and `intra` intra-op threads runs them.

    For an estimate of another machine: the replay's executor order follows `inter`, the
    Conv2D backprop scratch follows `intra`. Applies to every thread of this process while
    the context is open.

    Args:
        inter: inter-op threads (ops run at once).
        intra: intra-op threads (threads inside one kernel).

    Example:
        ```python
        with assume_threads(1, 8):
            graph = tf_trace.trace_step(workload, 32)
        ```
    """
    global _assumed
    previous, _assumed = _assumed, (int(inter), int(intra))
    try:
        yield
    finally:
        _assumed = previous


def _threads_from_environment(name: str) -> int:
    """A thread count TensorFlow takes from the environment when none is configured, else 0.

    TensorFlow reads `TF_NUM_INTEROP_THREADS` / `TF_NUM_INTRAOP_THREADS` once, when its
    thread pools are made, and uses them where `tf.config.threading` sets nothing
    (`process_util.cc`); `tf.config.threading` reports 0 for them all the same.
    """
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else 0


def intra_threads(tf: Any) -> int:
    """Intra-op threads of the process the step is described for."""
    if _assumed is not None:
        return _assumed[1]
    configured = tf.config.threading.get_intra_op_parallelism_threads()
    return configured or _threads_from_environment("TF_NUM_INTRAOP_THREADS") or schedulable_cpus()


def inter_threads(tf: Any) -> int:
    """Inter-op threads TensorFlow is set to (or assumed), before the CPUs cap them."""
    if _assumed is not None:
        return _assumed[0]
    configured = tf.config.threading.get_inter_op_parallelism_threads()
    return configured or _threads_from_environment("TF_NUM_INTEROP_THREADS") or schedulable_cpus()


def concurrent_ops(tf: Any) -> int:
    """Ops the runtime may run at once: its inter-op threads, at most the CPUs it may use.

    More threads than CPUs interleave rather than run at once; assumed thread counts
    (`assume_threads`) describe another machine and are taken as they are.
    """
    if _assumed is not None:
        return _assumed[0]
    return min(inter_threads(tf), schedulable_cpus())
