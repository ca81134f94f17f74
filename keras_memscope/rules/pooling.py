"""Pooling rules. Max pooling's gradient (MaxPoolGrad) reads the input and the
output; average pooling's needs only the input shape."""

from __future__ import annotations

import math

import keras

from ..graph import CallRecord
from ..ir import Prim, max_pool_grad
from . import register
from .base import OUT, Builder

_MAX = (keras.layers.MaxPooling1D, keras.layers.MaxPooling2D, keras.layers.MaxPooling3D)
_AVG = (keras.layers.AveragePooling1D, keras.layers.AveragePooling2D,
        keras.layers.AveragePooling3D)
_GMAX = (keras.layers.GlobalMaxPooling1D, keras.layers.GlobalMaxPooling2D,
         keras.layers.GlobalMaxPooling3D)
_GAVG = (keras.layers.GlobalAveragePooling1D, keras.layers.GlobalAveragePooling2D,
         keras.layers.GlobalAveragePooling3D)


def _window(call: CallRecord) -> int:
    pool = getattr(call.layer, "pool_size", None) or (1,)
    return math.prod(pool)


@register(*_MAX)
def max_pool(call: CallRecord) -> list[Prim]:
    """MaxPooling: keeps input and output; TensorFlow's MaxPoolGrad also
    allocates an int64 index per output element and copies the pooled output
    (with oneDNN's kernels: a saved workspace of one byte per output element
    instead). FLOPs: one compare per window element of every output."""
    from ..devices import cpu_onednn_runs

    b = Builder(call)
    out = call.outputs[0]
    flops = math.prod(out.shape) * _window(call)
    if cpu_onednn_runs(out.dtype):
        # oneDNN's max pooling keeps one byte per output element for its
        # gradient, which then needs no temporary
        z, ws = b.add("max_pool", ["in0"], [out.nbytes, math.prod(out.shape)], flops=flops)
        b.prims[-1] = Prim(**{**b.prims[-1].__dict__, "save_for": (("in0", ("in0", z, ws)),)})
        return b.finish([z])
    # MaxPool3DGrad is another kernel, not profiled here: it keeps the one
    # temporary of the pooled output's size it had
    grad = ({"backward_workspace_bytes": out.nbytes}
            if isinstance(call.layer, keras.layers.MaxPooling3D)
            else max_pool_grad(OUT, out.nbytes, math.prod(out.shape), "in0"))
    z = b.add1("max_pool", ["in0"], out.nbytes, save_for={"in0": ("in0", OUT)},
               flops=flops, **grad)
    return b.finish([z])


@register(*_AVG)
def avg_pool(call: CallRecord) -> list[Prim]:
    """AveragePooling: keeps nothing; FLOPs: one add per window element."""
    b = Builder(call)
    z = b.add1("avg_pool", ["in0"], call.outputs[0].nbytes,
               flops=math.prod(call.outputs[0].shape) * _window(call))
    return b.finish([z])


@register(*_GMAX)
def global_max_pool(call: CallRecord) -> list[Prim]:
    """GlobalMaxPooling: ``reduce_max``, whose gradient reads input and output."""
    b = Builder(call)
    z = b.add1("reduce_max", ["in0"], call.outputs[0].nbytes,
               save_for={"in0": ("in0", OUT)}, flops=math.prod(call.inputs[0].shape),
               backward_workspace_bytes=call.inputs[0].nbytes)
    return b.finish([z])


@register(*_GAVG)
def global_avg_pool(call: CallRecord) -> list[Prim]:
    """GlobalAveragePooling: ``reduce_mean``; its gradient broadcasts back."""
    b = Builder(call)
    z = b.add1("reduce_mean", ["in0"], call.outputs[0].nbytes,
               flops=math.prod(call.inputs[0].shape))
    return b.finish([z])
