"""Convolution rules: regular, transposed, depthwise and separable.

TensorFlow's convolution gradients need the input (for the filter gradient)
and the filter (for the input gradient); the bias add keeps nothing.
"""

from __future__ import annotations

import math

import keras

from ..graph import CallRecord
from ..ir import Prim
from ..units import dtype_bytes
from . import register
from .base import Builder, activation_name, apply_activation, read_weight, weight_ref
from .core import compute_dtype, linear_prims


def _channels(shape: tuple[int, ...], data_format: str) -> int:
    return shape[1] if data_format == "channels_first" else shape[-1]


def conv_macs(call: CallRecord) -> int:
    """Regular conv: ``elements(out) x k_h x k_w x (in_channels / groups)``, i.e.
    out_channels x out_h x out_w x (k_h x k_w x in_channels) per sample."""
    kernel = tuple(call.layer.kernel.shape)  # (*k, in/groups, out)
    out = call.outputs[0].shape
    return math.prod(out) * math.prod(kernel[:-1])


def conv_transpose_macs(call: CallRecord) -> int:
    """Transposed conv: every input element is scattered through the kernel:
    ``elements(in) x k_h x k_w x out_channels``."""
    kernel = tuple(call.layer.kernel.shape)  # (*k, out, in)
    return math.prod(call.inputs[0].shape) * math.prod(kernel[:-1])


def depthwise_macs(call: CallRecord, out_shape: tuple[int, ...]) -> int:
    """Depthwise conv: ``elements(out) x k_h x k_w`` (one filter per channel)."""
    kernel = tuple(call.layer.depthwise_kernel.shape if hasattr(call.layer, "depthwise_kernel")
                   else call.layer.kernel.shape)
    return math.prod(out_shape) * math.prod(kernel[:-2])


#: TensorFlow's CPU convolution-gradient kernels size their im2col buffer to
#: fill a 30 MiB "L3 cache" working set (conv_grad_{filter,input}_ops.cc).
_TARGET_WORKING_SET_BYTES = 30 << 20
#: ... and the input gradient's kernel compares each thread's share of one
#: image's work with a fixed 256 KiB "L2 cache" (``l2_cache_size = 256LL <<
#: 10`` in conv_grad_input_ops.h), not with the machine's L2.
_TF_L2_BYTES = 256 << 10


def conv_backward_workspace(call: CallRecord) -> tuple[int, int]:
    """Temporary bytes of (filter gradient, input gradient) on the CPU for a
    convolution call in its compute dtype (see :func:`col_buffers`)."""
    layer = call.layer
    fmt = getattr(layer, "data_format", "channels_last")
    dtype = compute_dtype(call)
    return col_buffers(call.outputs[0].shape, tuple(layer.kernel.shape), fmt,
                       dtype_bytes(dtype), dtype)


def col_buffers(out_shape: tuple[int, ...], kernel_shape: tuple[int, ...],
                data_format: str = "channels_last", itemsize: int = 4,
                dtype: str = "float32") -> tuple[int, int]:
    """Temporary bytes of (filter gradient, input gradient) on the CPU.

    Both kernels run im2col over ``shard`` images at a time into a column
    buffer of ``shard x image x filter_total`` elements, where ``image`` is
    out_h*out_w and ``filter_total`` is k_h*k_w*in. With ``work`` the elements
    of the three matrices of one image's matmul, ``shard = ceil(30 MiB /
    itemsize / work)``; the input gradient uses ``shard = 1`` (one parallel
    contraction) when the batch is 1 or ``work / threads`` reaches TensorFlow's
    fixed 256 KiB "L2 cache" (an allocator trace of a ConvLSTM2D's 32 x 32
    x 16 recurrent convolution at batch 8 on a CPU with 512 KiB of L2: no
    input-gradient buffer beyond one image's, 166144 / 2 elements of work per
    thread). The filter gradient's buffer is the full shard at any batch, 1
    included (allocator traces: [1112, 196, 27] for a 16 x 16 x 3 image at
    batch 1, [6, 4096, 288] for a 64 x 64 x 32 one at batches 1 and 2): it
    does not shrink with the batch. Where TensorFlow runs oneDNN's kernels
    instead (:func:`~keras_memscope.devices.cpu_onednn_runs`: for
    ``dtype``, which its kernels may not support on this CPU) there is no
    column buffer: (0, 0).
    """
    from ..devices import cpu_onednn_runs

    if cpu_onednn_runs(dtype):
        return 0, 0

    spatial = out_shape[2:] if data_format == "channels_first" else out_shape[1:-1]
    batch = out_shape[0]
    image = math.prod(spatial)
    filter_total = math.prod(kernel_shape[:-1])
    out_depth = kernel_shape[-1]
    target = _TARGET_WORKING_SET_BYTES // itemsize
    work = image * filter_total + image * out_depth + filter_total * out_depth
    full_shard = -(-target // work)
    filt = full_shard * image * filter_total
    parallel = input_gradient_parallel(batch, image, filter_total, out_depth, itemsize)
    inp = (1 if parallel else full_shard) * image * filter_total
    return filt * itemsize, inp * itemsize


def input_gradient_parallel(batch: int, image: int, filter_total: int, out_depth: int,
                            itemsize: int = 4) -> bool:
    """Whether TensorFlow's own CPU kernel for a convolution's input
    gradient runs one image at a time, each image's product on all threads
    (``use_parallel_contraction`` in conv_grad_input_ops.h: at batch 1, or
    where each thread's share of one image's three matrices reaches the
    kernel's fixed 256 KiB), rather than sharing the images out among the
    threads, each a single-threaded product."""
    from ..devices import cpu_cache_facts

    work = image * filter_total + image * out_depth + filter_total * out_depth
    _, threads = cpu_cache_facts()
    return batch == 1 or work // max(threads, 1) >= _TF_L2_BYTES // itemsize


#: TensorFlow's CPU Conv3D gradient kernels fall back on Eigen's contraction,
#: which takes nothing from the allocator, where their column buffer would
#: be more than this many times the elements of the op's three tensors
#: (``kMaxTempAllocationOverhead``, integer division, in conv_grad_ops_3d.cc)
_MAX_3D_OVERHEAD = 25


def conv3d_col_buffers(in_shape: tuple[int, ...], out_shape: tuple[int, ...],
                       kernel_shape: tuple[int, ...], itemsize: int = 4,
                       dtype: str = "float32") -> tuple[int, int]:
    """Temporary bytes of (filter gradient, input gradient) of a Conv3D from
    ``in_shape`` to ``out_shape`` (channels last) on the CPU.

    TensorFlow's Conv3D gradient kernels run im2col over ``shard`` volumes
    at a time into a buffer of ``shard x image x filter_total`` elements
    (``image``: the output's voxels; ``filter_total``: k_d*k_h*k_w*in), the
    full shard whatever the batch, with ``shard = ceil(L3 / itemsize /
    work)`` for the L3 size Eigen reads (:func:`~keras_memscope.devices.eigen_l3_bytes`)
    and ``work`` the three matrices of one volume's product; the input
    gradient takes one volume's at batch 1. Where that buffer is more than
    25 times the elements of the input, filter and output, the kernel uses
    Eigen's contraction instead and allocates none; so does the filter
    gradient in float16. Allocator traces on an AMD EPYC (Eigen's L3 320
    MiB) of the video network's first Conv3D (8 x 32 x 32 x 3 -> 16, 3 x 3
    x 3): no buffer at batch 8 (56 times its tensors), 268.3 MiB (106
    volumes) at batch 32 (14 times). Where TensorFlow runs oneDNN's kernels
    for ``dtype``: none."""
    from ..devices import cpu_onednn_runs, eigen_l3_bytes

    if cpu_onednn_runs(dtype):
        return 0, 0
    batch = out_shape[0]
    image = math.prod(out_shape[1:-1])
    filter_total = math.prod(kernel_shape[:-1])
    out_depth = kernel_shape[-1]
    work = image * filter_total + image * out_depth + filter_total * out_depth
    tensors = math.prod(in_shape) + math.prod(kernel_shape) + math.prod(out_shape)
    full_shard = -(-(eigen_l3_bytes() // itemsize) // work)

    def buffer(shard: int, custom: bool) -> int:
        elements = shard * image * filter_total
        return elements * itemsize if custom and elements // tensors <= _MAX_3D_OVERHEAD else 0

    return (buffer(full_shard, dtype in ("float32", "float64", "bfloat16")),
            buffer(1 if batch == 1 else full_shard,
                   dtype in ("float16", "float32", "float64", "bfloat16")))


def _finish(b: Builder, call: CallRecord, z: str) -> list[Prim]:
    z = apply_activation(b, activation_name(getattr(call.layer, "activation", None)), z,
                         call.outputs[0].nbytes)
    return b.finish([z])


@register(keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)
def conv(call: CallRecord) -> list[Prim]:
    """Conv1D/2D/3D (also grouped, strided, dilated)."""
    b = Builder(call)
    z = linear_prims(b, "in0", weight_ref(call, "kernel"), weight_ref(call, "bias"),
                     call.outputs[0].nbytes, conv_macs(call), compute_dtype(call), name="conv")
    if isinstance(call.layer, keras.layers.Conv3D):
        dtype = compute_dtype(call)
        filt, inp = conv3d_col_buffers(call.inputs[0].shape, call.outputs[0].shape,
                                       tuple(call.layer.kernel.shape), dtype_bytes(dtype), dtype)
    else:
        filt, inp = conv_backward_workspace(call)
    _with_workspace(b, "conv", inp, filt)
    return _finish(b, call, z)


def _with_workspace(b: Builder, name: str, inp: int, filt: int) -> None:
    """The column buffers of the ``name`` prim's input gradient and filter
    gradient (0: none). Each gradient kernel that runs adds its buffer; when
    both run they run at once (two inter-op threads) and their buffers add
    up."""
    b.prims = [Prim(**{**p.__dict__, "workspace_for": tuple(
        (ref, n) for ref, n in ((p.inputs[0], inp), (p.inputs[1], filt)) if n)})
        if p.name == name else p for p in b.prims]


@register(keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose,
          keras.layers.Conv3DTranspose)
def conv_transpose(call: CallRecord) -> list[Prim]:
    """Conv*DTranspose: the gradient of a convolution, run forward."""
    b = Builder(call)
    z = linear_prims(b, "in0", weight_ref(call, "kernel"), weight_ref(call, "bias"),
                     call.outputs[0].nbytes, conv_transpose_macs(call), compute_dtype(call),
                     name="conv_transpose")
    # the filter gradient of the convolution it transposes, whose output
    # is this layer's input; the input gradient is a forward convolution
    dtype = compute_dtype(call)
    kernel = tuple(call.layer.kernel.shape)
    if isinstance(call.layer, keras.layers.Conv3DTranspose):
        # run forward by the Conv3D input-gradient kernel, with its buffer
        filt, forward = conv3d_col_buffers(call.outputs[0].shape, call.inputs[0].shape, kernel,
                                           dtype_bytes(dtype), dtype)
        b.prims = [Prim(**{**p.__dict__, "forward_workspace_bytes": forward})
                   if p.name == "conv_transpose" else p for p in b.prims]
    else:
        fmt = getattr(call.layer, "data_format", "channels_last")
        filt, _ = col_buffers(call.inputs[0].shape, kernel, fmt, dtype_bytes(dtype), dtype)
    _with_workspace(b, "conv_transpose", 0, filt)
    return _finish(b, call, z)


@register(keras.layers.DepthwiseConv1D, keras.layers.DepthwiseConv2D)
def depthwise(call: CallRecord) -> list[Prim]:
    """DepthwiseConv: one k_h x k_w filter per input channel (times the depth
    multiplier)."""
    b = Builder(call)
    z = linear_prims(b, "in0", weight_ref(call, "kernel"), weight_ref(call, "bias"),
                     call.outputs[0].nbytes, depthwise_macs(call, call.outputs[0].shape),
                     compute_dtype(call), name="depthwise_conv")
    return _finish(b, call, z)


@register(keras.layers.SeparableConv1D, keras.layers.SeparableConv2D)
def separable(call: CallRecord) -> list[Prim]:
    """SeparableConv: a depthwise conv (its output kept for the pointwise
    gradient) then a 1x1 conv: MACs = depthwise + elements(out) x in x multiplier."""
    b = Builder(call)
    layer = call.layer
    dtype = compute_dtype(call)
    out = call.outputs[0]
    dk = tuple(layer.depthwise_kernel.shape)  # (*k, in, multiplier)
    mid_channels = dk[-2] * dk[-1]
    fmt = getattr(layer, "data_format", "channels_last")
    out_channels = _channels(out.shape, fmt)
    mid_elements = math.prod(out.shape) // out_channels * mid_channels
    mid_bytes = out.nbytes // out_channels * mid_channels
    dw = read_weight(b, weight_ref(call, "depthwise_kernel"), dtype)
    mid = b.add1("depthwise_conv", ["in0", dw], mid_bytes,
                 save_for={"in0": (dw,), dw: ("in0",)},
                 macs=mid_elements * math.prod(dk[:-2]), kernel="conv")
    z = linear_prims(b, mid, weight_ref(call, "pointwise_kernel"), weight_ref(call, "bias"),
                     out.nbytes, math.prod(out.shape) * mid_channels, dtype,
                     name="pointwise_conv")
    return _finish(b, call, z)
