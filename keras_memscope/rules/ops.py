"""Rules for raw ``keras.ops`` calls recorded as nodes of a Functional model."""

from __future__ import annotations

import math

from keras.src.ops import nn as nn_ops
from keras.src.ops import numpy as np_ops

from ..graph import CallRecord
from ..ir import Prim
from . import register
from .base import Builder, apply_activation


def _classes(module: object, *names: str) -> list[type]:
    return [getattr(module, n) for n in names if isinstance(getattr(module, n, None), type)]


def _ins(call: CallRecord) -> list[str]:
    return [f"in{i}" for i in range(len(call.inputs))]


@register(*_classes(np_ops, "Add", "Subtract", "Negative", "Absolute"))
def op_add(call: CallRecord) -> list[Prim]:
    """Sums and negation: gradients pass through, nothing kept, in place."""
    b = Builder(call)
    ins = _ins(call)
    z = b.add1("add", ins, call.outputs[0].nbytes, inplace=ins, grad_inplace=True)
    return b.finish([z])


@register(*_classes(np_ops, "Multiply", "Divide", "TrueDivide", "Maximum", "Minimum", "Power"))
def op_mul(call: CallRecord) -> list[Prim]:
    """Products and quotients: each input's gradient needs the other inputs."""
    b = Builder(call)
    ins = _ins(call)
    save_for = {i: tuple(ins) for i in ins}
    z = b.add1("mul", ins, call.outputs[0].nbytes, save_for=save_for, inplace=ins)
    return b.finish([z])


@register(*_classes(np_ops, "Equal", "NotEqual", "Greater", "GreaterEqual", "Less",
                    "LessEqual", "LogicalAnd", "LogicalOr", "LogicalNot", "LogicalXor",
                    "IsNan", "IsInf", "IsFinite"))
def op_compare(call: CallRecord) -> list[Prim]:
    """Comparisons and logic (e.g. the mask of ``Embedding(mask_zero=True)``):
    a boolean output, no gradient, nothing kept."""
    b = Builder(call)
    z = b.add1("compare", _ins(call), call.outputs[0].nbytes, differentiable=())
    return b.finish([z])


@register(*_classes(np_ops, "Matmul", "Einsum", "Dot", "Tensordot"))
def op_matmul(call: CallRecord) -> list[Prim]:
    """Matrix products keep both operands; MACs = elements(out) x contracted size."""
    b = Builder(call)
    ins = _ins(call)
    a = call.inputs[0].shape
    contracted = a[-1] if a else 1
    if type(call.layer).__name__ == "Einsum" and hasattr(call.layer, "subscripts"):
        from .core import einsum_macs

        macs = einsum_macs(call.layer.subscripts, [t.shape for t in call.inputs])
    else:
        macs = math.prod(call.outputs[0].shape) * contracted
    z = b.add1("matmul", ins, call.outputs[0].nbytes,
               save_for={i: tuple(j for j in ins if j != i) for i in ins}, macs=macs)
    return b.finish([z])


@register(*_classes(np_ops, "Reshape", "ExpandDims", "Squeeze"))
def op_view(call: CallRecord) -> list[Prim]:
    """Reshapes are views."""
    return Builder(call).finish(["in0"])


@register(*_classes(np_ops, "Transpose", "Concatenate", "Stack", "Tile", "Repeat",
                    "Pad", "Flip", "Roll", "GetItem", "Take"))
def op_copy(call: CallRecord) -> list[Prim]:
    """Data movement: a new buffer, nothing kept."""
    b = Builder(call)
    z = b.add1("copy", _ins(call)[:1] if len(call.inputs) else [], call.outputs[0].nbytes,
               differentiable=None)
    if len(call.inputs) > 1:
        p = b.prims[-1]
        b.prims[-1] = Prim(**{**p.__dict__, "inputs": tuple(_ins(call))})
    return b.finish([z])


@register(*_classes(np_ops, "Mean", "Sum"))
def op_reduce(call: CallRecord) -> list[Prim]:
    """Mean/sum: the gradient broadcasts back; nothing kept."""
    b = Builder(call)
    z = b.add1("reduce", ["in0"], call.outputs[0].nbytes, flops=math.prod(call.inputs[0].shape))
    return b.finish([z])


def _activation_op(name: str):
    def rule(call: CallRecord) -> list[Prim]:
        b = Builder(call)
        return b.finish([apply_activation(b, name, "in0", call.outputs[0].nbytes)])

    rule.__doc__ = f"keras.ops.{name}: as the {name} activation."
    return rule


for _name, _cls in (("relu", "Relu"), ("sigmoid", "Sigmoid"), ("tanh", "Tanh"),
                    ("softmax", "Softmax"), ("gelu", "Gelu"), ("silu", "Silu"),
                    ("exponential", "Exp"), ("relu6", "Relu6")):
    for _module in (nn_ops, np_ops):
        _c = getattr(_module, _cls, None)
        if isinstance(_c, type):
            register(_c)(_activation_op(_name))
