"""Normalization rules (as Keras 3 computes them on TensorFlow).

BatchNormalization in training: ``tf.nn.moments`` (a transient squared
difference), then ``x * inv + (beta - mean * inv)``: the multiply keeps x for
the scale gradient, the output is a new buffer that the following activation
can overwrite. Half-precision inputs are cast to float32 first, and that copy
is what is kept.
"""

from __future__ import annotations

import math

import keras

from ..graph import CallRecord
from ..ir import Prim
from . import register
from .base import OUT, Builder, weight_ref


def _float32_input(b: Builder, call: CallRecord) -> tuple[str, int]:
    x = call.inputs[0]
    n32 = math.prod(x.shape) * 4
    if x.dtype in ("float16", "bfloat16"):
        return b.add1("cast", ["in0"], n32), n32
    return "in0", x.nbytes


def _cast_back(b: Builder, call: CallRecord, z: str, n32: int) -> str:
    out = call.outputs[0]
    if out.nbytes != n32:
        return b.add1("cast", [z], out.nbytes)
    return z


def _stats_bytes(call: CallRecord, axes_kept: int) -> int:
    return 2 * axes_kept * 4


@register(keras.layers.BatchNormalization)
def batch_norm(call: CallRecord) -> list[Prim]:
    """BatchNormalization: training keeps the (float32) input and the batch
    statistics; frozen (inference mode) keeps nothing."""
    layer = call.layer
    b = Builder(call)
    x, n32 = _float32_input(b, call)
    shape = call.inputs[0].shape
    axis = layer.axis if isinstance(layer.axis, int) else layer.axis[0]
    channels = shape[axis]
    params = [r for r in (weight_ref(call, "gamma"), weight_ref(call, "beta")) if r]
    if getattr(layer, "trainable", True):
        # mean, squared difference, mean: the input streams twice and a
        # temporary of its size once each way
        stats = b.add1("moments", [x], _stats_bytes(call, channels),
                       save_for={x: (x,)}, forward_workspace_bytes=n32,
                       backward_workspace_bytes=n32, passes=3, flops=3 * n32 // 4,
                       kernel="reduce")
        save_for = {x: (stats,), stats: (x,)}
        for p in params:
            save_for[p] = (x, stats)
        # x * inv, then + shift in place
        z = b.add1("normalize", [x, stats, *params], n32, save_for=save_for,
                   backward_workspace_bytes=n32, grad_inplace=True, passes=2,
                   flops=2 * n32 // 4)
    else:
        z = b.add1("normalize", [x], n32, inplace=[x], grad_inplace=True)
    return b.finish([_cast_back(b, call, z, n32)])


def _norm_axes_elements(call: CallRecord) -> int:
    layer = call.layer
    shape = call.inputs[0].shape
    axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
    return math.prod(shape[a] for a in axes)


@register(keras.layers.LayerNormalization)
def layer_norm(call: CallRecord) -> list[Prim]:
    """LayerNormalization: moments over the normalized axes, then
    ``x * inv + (beta - mean * inv)`` where the shift is broadcast to x's size
    (a transient buffer); keeps the float32 input and the per-row statistics."""
    b = Builder(call)
    x, n32 = _float32_input(b, call)
    rows = math.prod(call.inputs[0].shape) // max(_norm_axes_elements(call), 1)
    params = [r for r in (weight_ref(call, "gamma"), weight_ref(call, "beta")) if r]
    stats = b.add1("moments", [x], rows * 8, save_for={x: (x,)},
                   forward_workspace_bytes=n32, backward_workspace_bytes=n32, passes=3,
                   flops=3 * n32 // 4)
    save_for = {x: (stats,), stats: (x,)}
    for p in params:
        save_for[p] = (x, stats)
    # x * inv + (beta - mean * inv) with the shift broadcast to x's size
    z = b.add1("normalize", [x, stats, *params], n32, save_for=save_for,
               forward_workspace_bytes=n32, backward_workspace_bytes=n32,
               grad_inplace=True, passes=3, flops=3 * n32 // 4,
                       kernel="reduce")
    return b.finish([_cast_back(b, call, z, n32)])


@register(keras.layers.GroupNormalization)
def group_norm(call: CallRecord) -> list[Prim]:
    """GroupNormalization: reshape into groups (a view), moments per group, then
    normalize and apply gamma/beta: keeps the float32 input, the normalized
    tensor for the gamma gradient and the statistics."""
    b = Builder(call)
    x, n32 = _float32_input(b, call)
    groups = int(getattr(call.layer, "groups", 1))
    batch = call.inputs[0].shape[0]
    params = [r for r in (weight_ref(call, "gamma"), weight_ref(call, "beta")) if r]
    stats = b.add1("moments", [x], batch * groups * 8, save_for={x: (x,)},
                   forward_workspace_bytes=n32, backward_workspace_bytes=n32, passes=3,
                   flops=3 * n32 // 4)
    normed = b.add1("normalize", [x, stats], n32, save_for={x: (stats,), stats: (x,)},
                    backward_workspace_bytes=n32)
    z = normed
    if params:
        save_for = {p: (normed,) for p in params}
        save_for[normed] = tuple(params)
        z = b.add1("scale_shift", [normed, *params], n32, save_for=save_for,
                   grad_inplace=True)
    return b.finish([_cast_back(b, call, z, n32)])


if hasattr(keras.layers, "UnitNormalization"):

    @register(keras.layers.UnitNormalization)
    def unit_norm(call: CallRecord) -> list[Prim]:
        """UnitNormalization: ``x / ||x||``: keeps x and the norms."""
        b = Builder(call)
        n = call.outputs[0].nbytes
        norms = b.add1("norm", ["in0"], n // max(call.inputs[0].shape[-1], 1),
                       save_for={"in0": ("in0",)}, forward_workspace_bytes=n)
        z = b.add1("div", ["in0", norms], n, save_for={"in0": (norms,), norms: ("in0",)})
        return b.finish([z])


if hasattr(keras.layers, "RMSNormalization"):

    @register(keras.layers.RMSNormalization)
    def rms_norm(call: CallRecord) -> list[Prim]:
        """RMSNormalization: ``x * rsqrt(mean(x^2) + eps) * scale``: the squares
        are a transient temporary; keeps the float32 input, the per-row inverse
        and the normalized tensor (for the scale gradient)."""
        b = Builder(call)
        x, n32 = _float32_input(b, call)
        rows = math.prod(call.inputs[0].shape) // max(_norm_axes_elements(call), 1)
        inv = b.add1("rsqrt_mean_square", [x], rows * 4, save_for={x: (x, OUT)},
                     forward_workspace_bytes=n32, backward_workspace_bytes=n32, passes=2,
                     flops=2 * n32 // 4, kernel="reduce")
        normed = b.add1("normalize", [x, inv], n32, save_for={x: (inv,), inv: (x,)},
                        backward_workspace_bytes=n32)
        z = normed
        scale = weight_ref(call, "scale")
        if scale:
            z = b.add1("scale", [normed, scale], n32,
                       save_for={normed: (scale,), scale: (normed,)}, grad_inplace=True)
        return b.finish([_cast_back(b, call, z, n32)])
