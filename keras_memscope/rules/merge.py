"""Merge rules. Sums keep nothing and may write into an input; products keep
every input for the others' gradients; a concatenation copies."""

from __future__ import annotations

import math

import keras

from ..graph import CallRecord
from ..ir import Prim
from . import register
from .base import Builder


def _ins(call: CallRecord) -> list[str]:
    return [f"in{i}" for i in range(len(call.inputs))]


@register(keras.layers.Add, keras.layers.Average)
def add(call: CallRecord) -> list[Prim]:
    """Add/Average: the gradient passes through unchanged; nothing kept."""
    b = Builder(call)
    ins = _ins(call)
    z = b.add1("add", ins, call.outputs[0].nbytes, inplace=ins, grad_inplace=True)
    return b.finish([z])


@register(keras.layers.Subtract)
def subtract(call: CallRecord) -> list[Prim]:
    """Subtract: like Add; the second input's gradient is a negated copy."""
    return add(call)


@register(keras.layers.Multiply)
def multiply(call: CallRecord) -> list[Prim]:
    """Multiply: each input's gradient needs the other inputs."""
    b = Builder(call)
    ins = _ins(call)
    save_for = {i: tuple(j for j in ins if j != i) for i in ins}
    z = b.add1("mul", ins, call.outputs[0].nbytes, save_for=save_for, inplace=ins)
    return b.finish([z])


@register(keras.layers.Maximum, keras.layers.Minimum)
def maximum(call: CallRecord) -> list[Prim]:
    """Maximum/Minimum: the gradient selects by comparing the inputs."""
    b = Builder(call)
    ins = _ins(call)
    z = b.add1("max", ins, call.outputs[0].nbytes, save_for={i: tuple(ins) for i in ins},
               backward_workspace_bytes=call.outputs[0].nbytes)
    return b.finish([z])


@register(keras.layers.Concatenate)
def concatenate(call: CallRecord) -> list[Prim]:
    """Concatenate: a new buffer; the gradient slices it into one copy per input."""
    b = Builder(call)
    z = b.add1("concat", _ins(call), call.outputs[0].nbytes)
    return b.finish([z])


@register(keras.layers.Dot)
def dot(call: CallRecord) -> list[Prim]:
    """Dot: a batched matmul keeping both inputs; MACs = elements(out) x the
    contracted size."""
    b = Builder(call)
    a_shape = call.inputs[0].shape
    axes = call.layer.axes
    ax = axes[0] if isinstance(axes, (list, tuple)) else axes
    contracted = a_shape[ax]
    z = b.add1("batch_matmul", ["in0", "in1"], call.outputs[0].nbytes,
               save_for={"in0": ("in1",), "in1": ("in0",)},
               macs=math.prod(call.outputs[0].shape) * contracted)
    return b.finish([z])
