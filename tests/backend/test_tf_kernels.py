"""memfit.backend.tf_kernels: the im2col scratch of TensorFlow's CPU Conv2D backprop kernels.

The expected sizes are the `temp` allocations TensorFlow 2.21's own allocator profile recorded
for these convolutions (`memfit.measure(..., explain=True)`, CPU BFC, 2 CPUs; shapes as TF
named them). `Conv2DCustomBackprop{Filter,Input}` size the buffer by a 30 MiB working set,
not by the batch: a batch of 2 gets a buffer of hundreds of images.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from memfit.backend.tf_kernels import conv_backprop_scratch_bytes


@dataclass
class _Shape:
    dims: list[int]

    def is_fully_defined(self) -> bool:
        return True

    def as_list(self) -> list[int]:
        return list(self.dims)


@dataclass
class _DType:
    size: int = 4


@dataclass
class _Tensor:
    shape: _Shape
    dtype: _DType


@dataclass
class _Op:
    type: str
    inputs: list[_Tensor]
    outputs: list[_Tensor]


def _conv_grad(kind: str, image: list[int], kernel: list[int], grad: list[int]) -> _Op:
    """A Conv2DBackpropFilter or Conv2DBackpropInput op as a traced step describes it."""

    def t(dims: list[int]) -> _Tensor:
        return _Tensor(_Shape(dims), _DType())

    if kind == "Conv2DBackpropFilter":
        return _Op(kind, [t(image), t([4]), t(grad)], [t(kernel)])
    return _Op(kind, [t([4]), t(kernel), t(grad)], [t(image)])


# (kernel, input, filter, out_backprop, TF's col buffer shape [shard, out_h*out_w, kh*kw*in]).
PROFILED = [
    # A 3x3 head on an 8x8x64 map, batch 2: 102 images' columns for 2 images.
    ("Conv2DBackpropFilter", [2, 8, 8, 64], [3, 3, 64, 64], [2, 8, 8, 64], [102, 64, 576]),
    ("Conv2DBackpropInput", [2, 8, 8, 64], [3, 3, 64, 64], [2, 8, 8, 64], [102, 64, 576]),
    # A strided 3x3 stem, 16x16x8 in, batch 2.
    ("Conv2DBackpropFilter", [2, 16, 16, 8], [3, 3, 8, 32], [2, 8, 8, 32], [878, 64, 72]),
    # A 1x1 convolution on a 2x2 map, batch 2.
    ("Conv2DBackpropInput", [2, 2, 2, 32], [1, 1, 32, 64], [2, 2, 2, 64], [3234, 4, 32]),
    # tests' small_cnn at batch 16, 64x64: its two largest buffers at the measured peak.
    ("Conv2DBackpropFilter", [16, 64, 64, 32], [3, 3, 32, 32], [16, 64, 64, 32], [6, 4096, 288]),
    ("Conv2DBackpropFilter", [16, 64, 64, 3], [3, 3, 3, 32], [16, 64, 64, 32], [33, 4096, 27]),
]


@pytest.mark.parametrize("kind, image, kernel, grad, col", PROFILED)
def test_scratch_is_the_buffer_tensorflow_allocated(kind, image, kernel, grad, col):
    op = _conv_grad(kind, image, kernel, grad)
    assert conv_backprop_scratch_bytes(op, intra_threads=2) == col[0] * col[1] * col[2] * 4


def test_backprop_input_takes_one_image_at_a_time_for_a_batch_of_one():
    op = _conv_grad("Conv2DBackpropInput", [1, 8, 8, 64], [3, 3, 64, 64], [1, 8, 8, 64])
    assert conv_backprop_scratch_bytes(op, intra_threads=2) == 64 * 576 * 4


def test_backprop_input_takes_one_image_when_a_thread_share_exceeds_l2():
    # 56x56x64 with a 3x3x64x64 kernel: one image's work is 4.3 M floats, above 256 KiB.
    op = _conv_grad("Conv2DBackpropInput", [8, 56, 56, 64], [3, 3, 64, 64], [8, 56, 56, 64])
    assert conv_backprop_scratch_bytes(op, intra_threads=2) == 56 * 56 * 576 * 4
    # The filter gradient has no such rule: ceil(30 MiB / 4 B / 2,043,904 floats) = 4 images.
    op = _conv_grad("Conv2DBackpropFilter", [8, 56, 56, 64], [3, 3, 64, 64], [8, 56, 56, 64])
    assert conv_backprop_scratch_bytes(op, intra_threads=2) == 4 * 56 * 56 * 576 * 4


def test_thread_counts_follow_tensorflows_environment_variables(monkeypatch):
    """`TF_NUM_INTEROP_THREADS` / `TF_NUM_INTRAOP_THREADS` size TensorFlow's pools where
    `tf.config.threading` sets nothing, so the replay and the Conv2D scratch follow them."""
    from types import SimpleNamespace

    from memfit.backend import tf_kernels

    configured = {"inter": 0, "intra": 0}
    threading = SimpleNamespace(
        get_inter_op_parallelism_threads=lambda: configured["inter"],
        get_intra_op_parallelism_threads=lambda: configured["intra"],
    )
    tf = SimpleNamespace(config=SimpleNamespace(threading=threading))
    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
    cpus = tf_kernels.schedulable_cpus()
    assert tf_kernels.inter_threads(tf) == cpus and tf_kernels.intra_threads(tf) == cpus
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "1")
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "3")
    assert tf_kernels.inter_threads(tf) == 1
    assert tf_kernels.intra_threads(tf) == 3
    assert tf_kernels.concurrent_ops(tf) == 1
    configured["inter"] = 2  # tf.config.threading, where set, comes first
    assert tf_kernels.inter_threads(tf) == 2
    configured["inter"] = 0
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "many")  # not a number: TensorFlow ignores it
    assert tf_kernels.inter_threads(tf) == cpus
