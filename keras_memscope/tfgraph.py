"""The graph method: a layer call's prims read off TensorFlow's own graph.

For each distinct layer call (class, configuration, input shapes), the layer is
called once more on placeholders inside a ``tf.function`` with a gradient
tape, and the forward and gradient ops TensorFlow builds are turned into prims:

* every forward op is a prim with its real output sizes; ops that return a
  view (``Reshape``, ``Identity``, ``ReadVariableOp``...) allocate nothing,
  element-wise ops may write into their input (TensorFlow's buffer forwarding);
* a forward tensor that any gradient op reads is kept until the backward pass
  (attached to the op that made it) - exactly what the gradient needs, for any
  layer, including custom ones;
* the gradient ops' own intermediates become the backward workspace;
* a function Keras has XLA compile (grouped convolutions on the CPU) adds
  the temporary buffer XLA runs it with (``keras_memscope.xla``).

What Keras layers' ``call`` does in plain TensorFlow is seen too, which the
rules cannot see. Calls are cached by signature, so a ResNet's repeated
blocks are traced once each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

from . import xla
from .devices import cpu_onednn_runs
from .graph import CallRecord, LoopKeeps, op_attributes
from .ir import Prim, matmul_upcast, max_pool_grad, prim
from .units import DTYPE_BYTES

#: The device grappler's rewrite places every op on.
CPU_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"
#: Ops whose output is a view of an input or of a variable: no allocation.
VIEW_OPS = {
    "Reshape", "Identity", "IdentityN", "Squeeze", "ExpandDims", "StopGradient",
    "ReadVariableOp", "Snapshot", "EnsureShape", "PreventGradient", "Placeholder",
}
#: Views whose gradient is a view of the incoming gradient (a Reshape's is a
#: Reshape back: TensorFlow's Reshape kernel shares its input's buffer).
VIEW_GRADIENT_OPS = {"Reshape", "Identity", "Squeeze", "ExpandDims", "Snapshot", "EnsureShape"}
#: Ops that allocate nothing worth counting (shapes, constants, bookkeeping).
FREE_OPS = {
    "Const", "Shape", "ShapeN", "Size", "Rank", "NoOp", "VarHandleOp", "AssignVariableOp",
    "AssignAddVariableOp", "AssignSubVariableOp", "StatelessRandomGetKeyCounter",
    "BroadcastGradientArgs", "ZerosLike", "OnesLike", "Fill", "Range",
}
#: Ops that read only their input's shape.
SHAPE_ONLY_OPS = {"Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike",
                  "BroadcastGradientArgs", "TensorListElementShape"}
#: Element-wise kernels that write into an input buffer nobody else holds.
FORWARDING_OPS = {
    "Relu", "Relu6", "Elu", "Selu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Log", "Sqrt",
    "Rsqrt", "Square", "Erf", "Erfc", "Softplus", "Softsign", "AddV2", "Add", "Sub", "Mul",
    "RealDiv", "Div", "Maximum", "Minimum", "SquaredDifference", "Pow", "BiasAdd", "Cast",
    "SelectV2", "Select", "LeakyRelu", "Reciprocal", "Sin", "Cos",
}
#: Gradient kernels of element-wise ops, forwarding the same way.
FORWARDING_GRAD_OPS = {
    "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "SigmoidGrad", "TanhGrad", "SoftplusGrad",
    "SoftsignGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad", "LeakyReluGrad", "AddN",
}
#: Kernel families for the time model (a transposed convolution runs a
#: convolution's input-gradient kernel forward, a convolution backward).
_FAMILY = {"MatMul": "matmul", "BatchMatMulV2": "matmul", "BatchMatMulV3": "matmul",
           "Einsum": "matmul", "Conv2D": "conv", "Conv3D": "conv", "Conv1D": "conv",
           "DepthwiseConv2dNative": "conv", "Conv2DBackpropInput": "conv_transpose",
           "Mean": "reduce", "Sum": "reduce", "Max": "reduce"}

_CACHE: dict[str, list[Prim]] = {}
#: folded constants of each traced call, by the call's signature
_CONSTANTS: dict[str, tuple[tuple[str, int], ...]] = {}

#: Grappler's constant folding replaces a computation that reads only
#: constants and static shapes with one ``Const`` (``constant_folding.cc``)
#: when the constant's encoding is smaller than 10 MiB; a tensor of one
#: repeated value (zeros, ones, a filled scalar) is encoded as that value, so
#: it is folded at any size. The ``Const`` kernel keeps its tensor for as long
#: as the function lives: a training step's folded constants are allocated
#: once, when its function is first run, and held between steps (measured
#: with the BFC allocator: ``zeros_like`` of 0.05-40 MiB and a lower
#: triangle of ones up to 40 MiB held after the call; a non-uniform ``range``
#: of 9.5 MiB held, of 10.5 MiB computed at every call; two identical
#: constants held once: grappler merges equal nodes).
FOLD_LIMIT_BYTES = 10 * 1024 * 1024
#: Folded constants smaller than this (shapes, scalars, axes) are not counted.
CONSTANT_FLOOR_BYTES = 1024
#: Ops that read only their inputs' shapes, which are constants when static
#: (a tensor list's element shape is not its static shape).
_READS_SHAPE = SHAPE_ONLY_OPS - {"TensorListElementShape"}
#: Ops whose result is one repeated value when their data inputs are.
_KEEPS_SPLAT = {"Cast", "Neg", "Reciprocal", "Mul", "RealDiv", "Div", "DivNoNan", "AddV2",
                "Add", "Sub", "Maximum", "Minimum", "BroadcastTo", "Tile", "Reshape",
                "ExpandDims", "Squeeze", "Identity", "Snapshot", "Transpose", "Square",
                "Sqrt", "Rsqrt", "Exp", "Log", "StopGradient"}
#: Ops whose result is all zeros when their data inputs are.
_KEEPS_ZEROS = {"Fill", "Cast", "Neg", "BroadcastTo", "Tile", "Reshape", "ExpandDims",
                "Squeeze", "Identity", "Snapshot", "Transpose", "StopGradient", "AddV2",
                "Add", "Square"}
#: Additions that grappler's constant folding replaces by their other input
#: where one input is all zeros and the other has the result's shape
#: (``x + zeros`` -> ``x``; for a subtraction only ``x - zeros``): the zeros
#: are then read by nothing and not held.
_ZERO_ADDITIONS = {"AddV2": (0, 1), "Add": (0, 1), "Sub": (1,)}
#: Ops whose inputs at these positions are data (the rest, shapes and axes).
_DATA_INPUTS = {"BroadcastTo": (0,), "Tile": (0,), "Reshape": (0,), "ExpandDims": (0,),
                "Transpose": (0,), "Fill": (1,)}


def _constants(ops: Sequence[Any]) -> tuple[dict[str, bool], dict[str, str], set[str]]:
    """The tensors among ``ops``' outputs that grappler can compute before
    the step runs (from constants and static shapes only), each with whether
    it is one repeated value, and a key that is equal for two tensors
    grappler would merge (same computation, shape and type); and the names
    of those that are all zeros."""
    import numpy as np

    splat: dict[str, bool] = {}
    key: dict[str, str] = {}
    zeros: set[str] = set()
    for op in ops:
        if op._is_stateful or op.type in ("Placeholder", "VarHandleOp", "ReadVariableOp"):
            continue
        outs = op.outputs
        if op.type in _READS_SHAPE:
            if not all(t.shape.is_fully_defined() for t in op.inputs):
                continue
            shapes = [tuple(t.shape) for t in op.inputs]
            for t in outs:
                splat[t.name] = op.type in ("ZerosLike", "OnesLike")
                key[t.name] = f"{op.type}{shapes}:{t.dtype.name}:{t.value_index}"
                if op.type == "ZerosLike":
                    zeros.add(t.name)
            continue
        if op.type == "Const":
            import tensorflow as tf

            value = tf.get_static_value(outs[0])
            if value is None:
                continue
            flat = np.asarray(value).ravel()
            one = flat.size > 0 and bool((flat == flat[0]).all())
            splat[outs[0].name] = one
            if one and flat[0] == 0:
                zeros.add(outs[0].name)
            shown = repr(flat[0]) if one else str(hash(flat.tobytes()))
            key[outs[0].name] = f"Const{tuple(outs[0].shape)}:{outs[0].dtype.name}:{shown}"
            continue
        if not op.inputs or not all(t.name in key for t in op.inputs):
            continue
        data = _DATA_INPUTS.get(op.type, range(len(op.inputs)))
        attrs = sorted((k, str(v)) for k, v in op.node_def.attr.items()
                       if not k.startswith("_"))
        for t in outs:
            splat[t.name] = (op.type == "Fill" or op.type in _KEEPS_SPLAT) and all(
                splat[op.inputs[i].name] for i in data if i < len(op.inputs))
            key[t.name] = (f"{op.type}{attrs}({','.join(key[x.name] for x in op.inputs)})"
                           f":{t.value_index}")
            if op.type in _KEEPS_ZEROS and all(op.inputs[i].name in zeros
                                               for i in data if i < len(op.inputs)):
                zeros.add(t.name)
    return splat, key, zeros


def folded_constants(ops: Sequence[Any], results: Sequence[Any] = (),
                     gradient_loops: Collection[str] = ()) -> tuple[tuple[str, int], ...]:
    """What grappler's constant folding makes of ``ops`` (the ops a step
    runs, in order) and holds between steps: ``(key, bytes)`` of each
    constant that an op computing data reads (or that is one of
    ``results``), folded as ``FOLD_LIMIT_BYTES`` says; where a constant is
    too large to fold, the constants it is computed from are held instead
    and it is computed at every step. Keys are equal for constants grappler
    merges into one.

    The zeros a recurrent layer's gradient loop (the ops named in
    ``gradient_loops``) starts its kernel-gradient sums from are not held
    (allocator traces of an LSTM's and a GRU's steps: their kernel-shaped
    zeros are not alive between steps, the forward loop's zero initial
    states are)."""
    return _fold(ops, *_constants(ops), results=results, gradient_loops=gradient_loops)


def _fold(ops: Sequence[Any], splat: dict[str, bool], key: dict[str, str],
          zeros: Collection[str] = (), results: Sequence[Any] = (),
          gradient_loops: Collection[str] = ()) -> tuple[tuple[str, int], ...]:
    """:func:`folded_constants` from ``ops``' constant tensors (``_constants``)."""
    frontier: list[Any] = []
    for op in ops:
        if all(t.name in key for t in op.outputs) or op.name in gradient_loops:
            continue  # a constant computation: folded with its inputs
        frontier.extend(t for t in op.inputs
                        if t.name in key and not _added_zeros(op, t, zeros))
    frontier.extend(t for t in results if t.name in key)
    found: dict[str, int] = {}
    seen: set[str] = set()
    while frontier:
        t = frontier.pop()
        if t.name in seen:
            continue
        seen.add(t.name)
        nbytes = _bytes(t)
        if splat[t.name] or nbytes < FOLD_LIMIT_BYTES:
            if nbytes >= CONSTANT_FLOOR_BYTES:
                found[key[t.name]] = nbytes
        else:
            frontier.extend(x for x in t.op.inputs if x.name in key)
    return tuple(sorted(found.items()))


def _added_zeros(op: Any, t: Any, zeros: Collection[str]) -> bool:
    """Whether ``t`` is zeros that ``op`` adds to (or subtracts from) an input
    of its result's shape, an addition grappler removes (its arithmetic
    simplification in constant folding: an allocator trace of a capsule
    network, whose routing logits start as ``zeros_like`` and are added to
    at once, holds the softmax of the zeros between steps and not the
    zeros)."""
    positions = _ZERO_ADDITIONS.get(op.type)
    if not positions or t.name not in zeros or len(op.inputs) != 2:
        return False
    at = [i for i in positions if op.inputs[i].name == t.name]
    if not at:
        return False
    other = op.inputs[1 - at[0]]
    out = op.outputs[0].shape
    return (other.shape.is_fully_defined() and out.is_fully_defined()
            and tuple(other.shape) == tuple(out))


def traced_constants(call: CallRecord) -> tuple[tuple[str, int], ...]:
    """The folded constants (``folded_constants``) of one traced layer call's
    forward and gradient: empty until :func:`traced_prims` has traced it."""
    return _CONSTANTS.get(_signature(call), ())


def _bytes(t: Any) -> int:
    return _elements(t) * DTYPE_BYTES.get(t.dtype.name, 4)


def _elements(t: Any) -> int:
    shape = t.shape
    if shape.rank is None or any(d is None for d in shape):
        return 0
    return math.prod(int(d) for d in shape)


_MATMUL_OPS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")


def _signature(call: CallRecord) -> str:
    layer = call.layer
    try:
        config_dict = dict(layer.get_config())
        config_dict.pop("name", None)  # identical layers differ only in name
        config = json.dumps(config_dict, sort_keys=True, default=str)
    except Exception:
        config = str(id(layer))
    shapes = [(t.shape, t.dtype) for t in call.inputs]
    trainable = [w.trainable for w in call.weights]
    # the call's other arguments (use_causal_mask=True...) change its graph too
    from keras import tree

    static = [repr(a) for a in tree.flatten((call.args, call.kwargs))
              if not hasattr(a, "shape")]
    return f"{type(layer).__qualname__}|{config}|{shapes}|{trainable}|{static}"


ACTIVATION_SCOPE = "memscope_activation"


def _contraction(op: Any) -> int:
    """The contracted dimension of a matrix product op."""
    a = op.inputs[0].shape
    transpose = op.get_attr("transpose_a") if op.type == "MatMul" else op.get_attr("adj_x")
    return int(a[-2] if transpose else a[-1])


def _einsum_labels(equation: str, operand_count: int
                   ) -> tuple[list[str], str, dict[str, int], dict[str, int]] | None:
    """An Einsum equation's operands, output, each label's first position
    and its type as ``EinsumOp`` sorts them (batch 1, free 2, contracted 3,
    summed out 4); None where it has broadcasting ellipses or more than two
    operands (not modelled)."""
    lhs, out = equation.replace(" ", "").split("->")
    operands = lhs.split(",")
    if "." in equation or len(operands) != operand_count or len(operands) > 2:
        return None
    ids: dict[str, int] = {}
    for ch in "".join(operands) + out:
        ids.setdefault(ch, len(ids))
    # (kBroadcasting 0 unused here)
    kind: dict[str, int] = {}
    for ch in ids:
        removed = ch not in out
        unique = len(operands) == 1 or any(ch not in o for o in operands)
        kind[ch] = (4 if unique else 3) if removed else (2 if unique else 1)
    return operands, out, ids, kind


def _swaps_free_and_contract(labels: str, kind: dict[str, int], ids: dict[str, int]) -> bool:
    """Whether ``EinsumOp`` reads an operand ordered batch, contracted, free
    as it is, with the product's adjoint flag, rather than transposing it
    (``ShouldSwapFreeAndContract``)."""
    swapped = {ch: ({2: 3, 3: 2}.get(kind[ch], kind[ch]), ids[ch]) for ch in labels}
    return all(swapped[a] <= swapped[b] for a, b in zip(labels, labels[1:]))


def einsum_workspace(equation: str, input_shapes: Sequence[Sequence[int]],
                     itemsize: int) -> int:
    """Bytes TensorFlow's Einsum kernel allocates beside its output.

    As ``EinsumOp::Compute`` does: each operand is transposed into a copy
    when its dimensions are not already ordered batch, free, contracted
    (by type, then by label; an operand ordered batch, contracted, free is
    read transposed instead), an operand with summed-out labels is reduced
    into a copy, and the contraction writes a result ordered batch, free of
    the first operand, free of the second, which is one more buffer when the
    output wants another order (then transposed into the output). All of
    them live until the kernel returns (MultiHeadAttention's score einsum
    ``BTNH,BSNH->BNTS``: a copy of each operand)."""
    parsed = _einsum_labels(equation, len(input_shapes))
    if parsed is None:
        return 0
    operands, out, ids, kind = parsed
    size = {ch: d for o, shape in zip(operands, input_shapes) for ch, d in zip(o, shape)}
    ws = 0
    free: list[str] = []
    for o, shape in zip(operands, input_shapes):
        labels = list(o)
        swap = _swaps_free_and_contract(o, kind, ids)
        order = labels if swap else sorted(labels, key=lambda ch: (kind[ch], ids[ch]))
        elements = math.prod(int(d) for d in shape)
        if len(labels) >= 2 and order != labels:
            ws += elements * itemsize  # the transposed copy
        reduced = math.prod(size[ch] for ch in labels if kind[ch] == 4)
        if reduced > 1:
            ws += elements // reduced * itemsize
        free += [ch for ch in order if kind[ch] == 2]
    result = sorted((ch for ch in ids if kind[ch] == 1), key=ids.get) + free
    if len(result) >= 2 and result != list(out):
        ws += math.prod(size[ch] for ch in out) * itemsize  # the contraction's own result
    return ws


def einsum_transposed_reads(equation: str, input_shapes: Sequence[Sequence[int]],
                            itemsize: int) -> int:
    """Bytes of its operands an Einsum's batched product reads transposed:
    ``EinsumOp`` multiplies ``x @ y`` with ``adj_x`` where the first operand
    is ordered batch, contracted, free, and with ``adj_y`` where the second
    is not (``ContractOperands``: ``trans_y = !swap_free_and_contract[1]``)
    and has a contracted dimension of more than one (an outer product reads
    nothing transposed)."""
    parsed = _einsum_labels(equation, len(input_shapes))
    if parsed is None or len(input_shapes) != 2:
        return 0
    operands, _, ids, kind = parsed
    size = {ch: d for o, shape in zip(operands, input_shapes) for ch, d in zip(o, shape)}
    total = 0
    for position, (o, shape) in enumerate(zip(operands, input_shapes)):
        contracted = math.prod(size[ch] for ch in o if kind[ch] == 3)
        free = math.prod(size[ch] for ch in o if kind[ch] == 2)
        if contracted <= 1 or free <= 1:
            continue  # a vector: no layout to read across
        if _swaps_free_and_contract(o, kind, ids) == (position == 0):
            total += math.prod(int(d) for d in shape) * itemsize
    return total


def _gradient_ops(op: Any, backward: list[Any], types: Collection[str]
                  ) -> list[tuple[int, Any]]:
    """For a forward product of two operands, the ops of ``types`` in its
    gradient's scope that compute the gradient with respect to an operand,
    with its position: they read the other operand and have this one's
    shape."""
    scope = "gradient_tape/" + op.name.rsplit("/", 1)[0] + "/"
    out: list[tuple[int, Any]] = []
    if len(op.inputs) != 2:
        return out
    for b in backward:
        if b.type not in types or not b.name.startswith(scope) or not b.outputs:
            continue
        reads = {t.name for t in b.inputs}
        for i, t in enumerate(op.inputs):
            other = op.inputs[1 - i]
            if other.name in reads and tuple(b.outputs[0].shape) == tuple(t.shape):
                out.append((i, b))
                break
    return out


def _einsum_gradient_workspaces(op: Any, backward: list[Any]) -> dict[int, int]:
    """For a forward Einsum, the Einsum kernel workspace of the gradient with
    respect to each operand (by position)."""
    out: dict[int, int] = {}
    for i, b in _gradient_ops(op, backward, ("Einsum",)):
        out[i] = out.get(i, 0) + einsum_workspace(
            b.get_attr("equation").decode(),
            [tuple(int(d) for d in x.shape) for x in b.inputs], b.outputs[0].dtype.size)
    return out


def _gradient_reads(op: Any, backward: list[Any]) -> dict[int, tuple[int, int]]:
    """For a product (of two activations, or a Dense layer's ``MatMul``),
    what the gradient op with respect to each operand (by position) reads:
    the bytes of its two operands, and of those the bytes it reads
    transposed (a batched product's ``adj_x`` / ``adj_y`` operands, a
    ``MatMul``'s ``transpose_b`` one, an Einsum's as its kernel reads them:
    :func:`einsum_transposed_reads`). Where the shapes are not all known,
    nothing."""
    out: dict[int, tuple[int, int]] = {}
    types = ("Einsum", "BatchMatMulV2", "BatchMatMulV3", "MatMul")
    if op.type not in types:
        return out
    for i, b in _gradient_ops(op, backward, types):
        if not all(x.shape.is_fully_defined() and x.shape.rank >= 2 for x in b.inputs):
            continue
        if b.type == "Einsum":
            transposed = einsum_transposed_reads(
                b.get_attr("equation").decode(),
                [tuple(int(d) for d in x.shape) for x in b.inputs], b.outputs[0].dtype.size)
        else:
            # (a MatMul's first operand read transposed, a Dense layer's x in
            # its kernel's gradient x^T @ dy, takes no longer than as stored:
            # benchmarks/dense_gradient_speeds.py; its second, the kernel in
            # dy @ W^T, does)
            flags = ((False, b.get_attr("transpose_b"))
                     if b.type == "MatMul" else (b.get_attr("adj_x"), b.get_attr("adj_y")))
            # (a vector, one row or column, has no layout to read across)
            transposed = sum(_bytes(x) for x, flag in zip(b.inputs, flags)
                             if flag and min(int(d) for d in x.shape[-2:]) > 1)
        reads = sum(_bytes(x) for x in b.inputs)
        before = out.get(i, (0, 0))
        out[i] = (before[0] + reads, before[1] + transposed)
    return out


#: element-wise products whose gradient with respect to an input broadcast
#: over the output is the full-size product of the output gradient with the
#: other operand, summed down to the input's shape (TensorFlow's ``_MulGrad``
#: and ``_RealDivGrad``: ``reduce_sum(grad * y, rx)``)
_BROADCAST_PRODUCTS = frozenset({"Mul", "RealDiv", "DivNoNan"})


def _broadcast_gradients(op: Any) -> dict[int, int]:
    """For a product that broadcasts an operand over the result, the bytes
    of that operand's gradient before its sum, by operand position.

    A batched matrix product that broadcasts an operand over batch
    dimensions (``x @ W`` with x of shape ``(b, t, k)`` and W ``(k, n)``):
    TensorFlow's gradient computes the product for every batch element,
    ``(b, k, n)``, and sums it down to the operand's shape (a mixture of
    experts' ``btd,edh->bteh`` at batch 32: a 4 MiB product for a 128 KiB
    kernel, allocator trace). An element-wise product (``_BROADCAST_PRODUCTS``):
    the output gradient times the other operand, the output's size (PReLU's
    ``-alpha * relu(-x)``: ``Mul_1`` beside the input gradient's ``Mul``,
    both 4 MiB at batch 32, allocator trace)."""
    if op.type in _BROADCAST_PRODUCTS and len(op.inputs) == 2:
        out = op.outputs[0].shape
        if not out.is_fully_defined():
            return {}
        size = _bytes(op.outputs[0])
        return {i: size for i, t in enumerate(op.inputs)
                if t.shape.is_fully_defined() and t.shape.num_elements() < out.num_elements()}
    if op.type not in ("BatchMatMulV2", "BatchMatMulV3") or len(op.inputs) != 2:
        return {}
    try:
        out = [int(d) for d in op.outputs[0].shape]
        shapes = [[int(d) for d in t.shape] for t in op.inputs]
    except (TypeError, ValueError):
        return {}
    batch = out[:-2]
    found = {}
    for i, shape in enumerate(shapes):
        own = [1] * (len(batch) - len(shape[:-2])) + shape[:-2]
        if len(own) == len(batch) and own != batch:
            found[i] = math.prod(batch) * shape[-2] * shape[-1] * op.inputs[i].dtype.size
    return found


def _reduced_products(backward: Sequence[Any], owner: Callable[[Any], Any]) -> set[str]:
    """Gradient products of a broadcasting product, summed down to their
    operand's shape: the forward prim's ``workspace_for`` holds them
    (``_broadcast_gradients``)."""
    found = set()
    for op in backward:
        if (op.type in ("BatchMatMulV2", "BatchMatMulV3", *_BROADCAST_PRODUCTS) and op.outputs
                and op.outputs[0].consumers()
                and all(c.type == "Sum" for c in op.outputs[0].consumers())):
            forward = owner(op)
            if forward is not None and _broadcast_gradients(forward):
                found.add(op.outputs[0].name)
    return found


def _gemm_min_dim(op: Any) -> int:
    """The smallest of a matrix product's rows, contraction and columns."""
    if op.type not in _MATMUL_OPS:
        return 0
    try:
        out = op.outputs[0].shape
        return min(int(out[-2]), _contraction(op), int(out[-1]))
    except Exception:
        return 0


def _out_channels(op: Any) -> int:
    """A convolution's output channels (its filter's last dimension); 0 for
    other ops and where the shape is not known."""
    if op.type not in ("Conv2D", "Conv3D"):
        return 0
    try:
        return int(op.inputs[1].shape[-1])
    except Exception:
        return 0


def _conv_gemm(op: Any) -> tuple[int, ...]:
    """``(batch, image, filter_total, out_channels)`` of a channels-last
    Conv2D op (``Prim.conv_gemm``); empty for other ops and where the shapes
    are not known."""
    if op.type != "Conv2D" or op.get_attr("data_format") != b"NHWC":
        return ()
    try:
        out, kernel = op.outputs[0].shape, op.inputs[1].shape
        return (int(out[0]), int(out[1]) * int(out[2]), math.prod(int(d) for d in kernel[:-1]),
                int(kernel[-1]))
    except Exception:
        return ()


def _macs(op: Any) -> int:
    """Multiply-accumulates of a matmul or convolution op (static shapes)."""
    try:
        out = op.outputs[0].shape
        if op.type in ("MatMul", "BatchMatMulV2", "BatchMatMulV3"):
            return math.prod(out) * _contraction(op)
        if op.type in ("Conv2D", "Conv3D"):
            f = op.inputs[1].shape
            return math.prod(out) * math.prod(int(d) for d in f[:-1])
        if op.type in ("Conv2DBackpropInput", "Conv3DBackpropInputV2"):
            # a transposed convolution run forward: every input element is
            # scattered through the kernel
            f = op.inputs[1].shape
            return math.prod(op.inputs[2].shape) * math.prod(int(d) for d in f[:-1])
        if op.type == "DepthwiseConv2dNative":
            f = op.inputs[1].shape
            return math.prod(out) * int(f[0]) * int(f[1])
        if op.type in xla.CALL_OPS:
            # a nested function (Keras compiles grouped convolutions with XLA
            # on the CPU): the sum of its own ops
            fn = op.graph._get_function(op.get_attr("f").name)
            return sum(_macs(inner) for inner in fn.graph.get_operations())
        if op.type == "Einsum":
            from .rules.core import einsum_macs

            return einsum_macs(op.get_attr("equation").decode(),
                               [tuple(int(d) for d in t.shape) for t in op.inputs])
    except Exception:
        return 0
    return 0


class LoopLayer(NotImplementedError):
    """A layer whose forward pass runs a loop: its rule schedules it.
    ``loops`` holds, per forward ``While`` op in the order they run, what one
    iteration keeps for the gradient (:func:`loop_iteration_bytes`); empty
    where a size is not known."""

    def __init__(self, message: str, loops: tuple[LoopKeeps, ...]) -> None:
        super().__init__(message)
        self.loops = loops


def _needed(outputs: Sequence[Any]) -> set[str]:
    """The names of the ops ``outputs`` depend on (what the runtime runs)."""
    needed: set[str] = set()
    stack = [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op.name in needed:
            continue
        needed.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return needed


def _past_identities(t: Any) -> Any:
    while t.op.type == "Identity" and t.op.inputs:
        t = t.op.inputs[0]
    return t


def _live_loop_inputs(loop: Any, live_outputs: set[int]) -> set[int]:
    """The loop variables of a ``While`` op that its live outputs depend on,
    through any number of iterations of its body."""
    body = loop._body_graph
    position = {t.name: i for i, t in enumerate(body.inputs)}
    live, work, seen = set(live_outputs), list(live_outputs), set()
    while work:
        stack = [body.outputs[work.pop()].op]
        while stack:
            op = stack.pop()
            if op.name in seen:
                continue
            seen.add(op.name)
            stack.extend(op.control_inputs)
            for t in op.inputs:
                j = position.get(t.name)
                if j is None:
                    stack.append(t.op)
                elif j not in live:
                    live.add(j)
                    work.append(j)
    return live


def _loops_kept(forward: Sequence[Any], ops: Sequence[Any],
                outputs: Sequence[Any]) -> list[tuple[int, ...] | None]:
    """:func:`loop_iteration_bytes` of each forward ``While`` op among
    ``forward``, counting the lists that the gradient loops ``outputs``
    need read (the others are pushed, and dropped when the loop ends)."""
    needed = _needed(outputs)
    loops = [op for op in forward if op.type in ("While", "StatelessWhile")]
    read: dict[str, set[int]] = {op.name: set() for op in loops}
    for grad in ops:
        if grad.type not in ("While", "StatelessWhile") or grad.name not in needed \
                or grad.name in read or getattr(grad, "_body_graph", None) is None:
            continue
        live = {k for k, t in enumerate(grad.outputs)
                if any(c.name in needed for c in t.consumers())}
        for j in _live_loop_inputs(grad, live):
            src = _past_identities(grad.inputs[j])
            if src.op.name in read:
                read[src.op.name].add(src.value_index)
    return [loop_iteration_bytes(op, read[op.name]) for op in loops]


#: Ops of a loop body whose output holds no buffer of its own: a variable's
#: value (its buffer), an element of a list made before the loop (the input
#: sequence), a constant.
_NOT_KEPT_BY_LOOP = {"ReadVariableOp", "TensorListGetItem", "Const"}


def _slice_is_view(op: Any) -> bool:
    """Whether a ``StridedSlice`` or ``Split`` output shares its input's
    buffer: TensorFlow's kernels slice without copying only along the first
    dimension (every later dimension whole; they also need the slice's start
    aligned, which is not checked here)."""
    try:
        src, out = op.inputs[0].shape, op.outputs[0].shape
        if op.type == "Split":
            src, out = op.inputs[1].shape, op.outputs[0].shape
        if src.rank is None or out.rank is None or src.rank == 0:
            return False
        rest = list(src)[1:]
        if None in rest:
            return False
        # rows of the first dimension, or one row of it (a shrunk axis)
        return (src.rank == out.rank and rest == list(out)[1:]) or rest == list(out)
    except Exception:
        return False


def view_root(t: Any) -> Any:
    """The tensor whose buffer ``t`` is a view of (past reshapes, identities
    and slices along the first dimension); ``t`` itself where it has its own."""
    while True:
        op = t.op
        if op.type in VIEW_OPS - {"ReadVariableOp", "Placeholder"} and op.inputs:
            t = op.inputs[0]
        elif op.type in ("StridedSlice", "Slice") and _slice_is_view(op):
            t = op.inputs[0]
        elif op.type == "Split" and _slice_is_view(op):
            t = op.inputs[1]
        else:
            return t


def loop_iteration_bytes(while_op: Any, read: Collection[int]) -> tuple[int, ...] | None:
    """The sizes of the new buffers one iteration of a forward ``While`` loop
    keeps for its gradient, read off the loop's body.

    TensorFlow's ``while_v2`` gradient pushes every body tensor the gradient
    body reads onto a list (``TensorListPushBack`` accumulators), one per
    iteration. ``read`` names the loop outputs (the lists) a gradient loop
    the step runs reads: those are held until the backward loop pops them;
    the others are dropped when the forward loop ends (what only a gradient
    nobody asks for reads). A pushed tensor holds no
    buffer of its own when it is a view (``Identity``, ``Reshape``, a slice
    along the first dimension), a variable's value, an element of the input
    list, a constant or a loop invariant; the previous iteration's state
    (a loop variable) is the buffer the previous iteration made, counted once
    when that result is pushed too (a SimpleRNN's ``tanh`` is next step's
    ``h``). Everything else is a buffer per iteration: an LSTM's gates and
    states, and what Keras' cells compute per step beside them (a GRU with
    ``reset_after=False`` slices its recurrent kernel into three copies at
    every step; recurrent dropout multiplies the state by three masks)."""
    body = getattr(while_op, "_body_graph", None)
    if body is None:
        return None
    passed = {i for i, (a, b) in enumerate(zip(body.inputs, body.outputs)) if a is b}

    roots: dict[str, Any] = {}
    for m in sorted(read):
        op = body.outputs[m].op if m < len(body.outputs) else None
        if op is not None and op.type == "TensorListPushBack" and len(op.inputs) > 1:
            t = view_root(op.inputs[1])
            roots[t.name] = t
    position = {t.name: i for i, t in enumerate(body.inputs)}
    sizes = []
    for name, t in roots.items():
        if t.op.type in _NOT_KEPT_BY_LOOP or t.dtype.name in ("resource", "variant"):
            continue
        i = position.get(name)
        if i is not None:
            if i in passed or i >= len(body.outputs):
                continue  # a loop invariant: one buffer for all iterations
            if view_root(body.outputs[i]).name in roots:
                continue  # this iteration's result, pushed by the previous one
        n = t.shape.num_elements()
        if n is None:
            return None  # an unknown size: the rule's own count stands
        sizes.append(n * t.dtype.size)
    return tuple(sizes)


def traced_prims(call: CallRecord, xla_buffers: bool = True,
                 loop_layer: bool = False, upcast: Sequence[str] = ()) -> list[Prim]:
    """The prims of one layer call, from TensorFlow's graph of its forward and
    gradient (cached by the call's signature). With ``xla_buffers`` a function the
    layer has XLA compile adds the temporary buffer XLA runs it with on this
    machine's CPU (``keras_memscope.xla``); without, nothing (a GPU compiles
    it otherwise). A call whose forward pass runs a loop raises
    :class:`LoopLayer` (its rule schedules it), unless ``loop_layer``: then
    it is one prim made from its graph (``keras_memscope.looplayer``: for a
    layer no rule knows), its matrix products of the types in ``upcast``
    holding float32 copies while they run."""
    upcast = tuple(upcast) if loop_layer else ()
    key = (_signature(call) + ("" if xla_buffers else " (no xla)")
           + (f" (loop layer, upcast {upcast})" if loop_layer else ""))
    if key not in _CACHE:
        _CACHE[key] = _trace(call, xla_buffers, loop_layer, upcast)
    # the cached prims name weights by position; this call's names replace them
    names = {f"w#{i}": f"w:{w.name}" for i, w in enumerate(call.weights)}
    return [p.renamed(names) for p in _CACHE[key]]


#: how TensorFlow's root name scopes must start (``ops._VALID_SCOPE_NAME_REGEX``)
_ROOT_SCOPE_START = re.compile(r"[A-Za-z0-9.]")


def _trace(call: CallRecord, xla_buffers: bool = True,
           loop_layer: bool = False, upcast: Sequence[str] = ()) -> list[Prim]:
    import keras
    import tensorflow as tf
    from keras import tree

    layer = call.layer
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in call.inputs]
    # the gradients arriving at the outputs come in as arguments too, so that
    # nothing after the forward ops reads a forward tensor except the gradient
    grad_specs = [tf.TensorSpec(t.shape, t.dtype) for t in call.outputs
                  if tf.as_dtype(t.dtype).is_floating]
    names = list(call.input_names)
    # the weights come in as arguments too (a StatelessScope): a layer
    # whose variables were never allocated traces like any other
    trainable, frozen = _variables(layer)
    weight_specs = [tf.TensorSpec(tuple(v.shape), v.dtype) for v in trainable + frozen]
    boundary: list[int] = []
    out_names: list[str] = []
    n_in, n_t = len(specs), len(trainable)
    input_gradient_count: list[int] = []
    grad_owners: dict[str, str] = {}  # gradient op -> the forward op it is the gradient of

    def step(*all_args: Any) -> Any:
        xs = all_args[:n_in]
        tw = list(all_args[n_in:n_in + n_t])
        ntw = list(all_args[n_in + n_t:n_in + len(weight_specs)])
        upstream = list(all_args[n_in + len(weight_specs):])
        by_name = dict(zip(names, xs))

        def swap(v: Any) -> Any:
            return by_name.get(v.name, v) if isinstance(v, tf.Tensor) else v

        args = tree.map_structure(swap, call.args)
        kwargs = tree.map_structure(swap, call.kwargs)
        floats = [x for x in xs if x.dtype.is_floating]
        if isinstance(layer, keras.layers.Layer) and "training" not in kwargs:
            # (a call without a training argument has it stripped by Keras,
            # which hands it on to the layers it calls: a block traced whole
            # runs its Dropout as in training)
            kwargs["training"] = True
        mapping = list(zip(trainable + frozen, tw + ntw))
        scope = keras.StatelessScope(state_mapping=mapping, collect_losses=True)
        # a layer named as TensorFlow allows only below a root scope (a
        # leading underscore: Keras names a class ``_Tied`` ``__tied``) is
        # called in one, as inside its model
        root = (contextlib.nullcontext() if _ROOT_SCOPE_START.match(layer.name)
                else tf.name_scope("call"))
        with tf.GradientTape() as tape, scope, root:
            tape.watch(floats + tw)
            out = layer(*args, **kwargs)  # (through __call__: autocasting applies)
        outs = [o for o in tree.flatten(out) if isinstance(o, tf.Tensor)]
        out_names.extend(o.name for o in outs)
        boundary.append(len(tf.compat.v1.get_default_graph().get_operations()))
        targets = [o for o in outs if o.dtype.is_floating]
        # what the call adds to the loss (an activity regularizer, add_loss)
        # is summed into the loss: its gradient comes in as ones, a constant
        added = [x for x in scope.losses if isinstance(x, tf.Tensor) and x.dtype.is_floating]
        incoming = upstream[:len(targets)]
        if added and len(incoming) == len(targets):
            targets = targets + added
            incoming = incoming + [tf.ones_like(x) for x in added]
        with _recording_owners(grad_owners):
            grads = tape.gradient(targets, floats + tw, output_gradients=incoming or None)
        input_gradient_count.append(sum(g is not None for g in grads[:len(floats)]))
        # only the gradients are returned: returning the outputs would add
        # ops after the forward pass that read them
        return [g for g in grads if g is not None]

    # the layer's activation runs in a name scope of its own, so that its ops
    # can be recomputed alone (RematScope mode "activations"); the layer's own
    # remat mode is off here: the schedule applies recomputation
    activation = getattr(layer, "activation", None)
    remat_mode = getattr(layer, "_remat_mode", None)

    def scoped_activation(*a: Any, **k: Any) -> Any:
        with tf.name_scope(ACTIVATION_SCOPE):
            return activation(*a, **k)

    scoped = False
    try:
        if callable(activation):
            try:
                layer.activation = scoped_activation
                scoped = True
            except AttributeError:
                pass  # a read-only property (LSTM's and GRU's are their cell's)
        if remat_mode is not None:
            layer._remat_mode = None
        graph = tf.function(step, autograph=False).get_concrete_function(
            *specs, *weight_specs, *grad_specs).graph
    finally:
        if scoped:
            layer.activation = activation
        if remat_mode is not None:
            layer._remat_mode = remat_mode
    ops = graph.get_operations()
    split = boundary[0] if boundary else len(ops)
    ran = _run(graph, ops[split:])
    _CONSTANTS[_signature(call)] = folded_constants(
        ops[:split] + ran, graph.outputs,
        {op.name for op in ran if op.type in ("While", "StatelessWhile")})
    loops = {op.type for op in ops[:split]} & {"While", "StatelessWhile", "If", "StatelessIf"}
    if loops and loop_layer:
        from .looplayer import loop_layer_prim

        placeholders = [t for t in graph.inputs if t.dtype.name != "resource"]
        weights = _variable_refs(call, graph)
        refs = {t.name: f"in{i}" for i, t in enumerate(placeholders[:n_in])}
        trainable_refs = [weights[t.name] for t in placeholders[n_in:n_in + n_t]
                          if t.name in weights]
        # (the gradients arriving at the outputs come after the forward pass:
        # a gradient op that reads one is not ready with the forward ops)
        arriving = {t.op.name for t in placeholders[n_in + len(weight_specs):n_in + len(
            weight_specs) + len(grad_specs)]}
        forward, backward = _hoist_ready([op for op in ops[:split] if op.name not in arriving],
                                         ran)
        return loop_layer_prim(
            type(layer).__name__, forward, backward, placeholders[:n_in], refs,
            [graph.get_tensor_by_name(n) for n in out_names][:len(call.outputs)],
            graph.outputs, list(dict.fromkeys(weights.values())),
            [refs[t.name] for t in placeholders[:n_in] if t.dtype.is_floating]
            + trainable_refs, upcast=upcast)
    if loops:
        # the rule schedules a loop, with what its iterations keep, read here:
        # for every gradient, and for the weights' alone (the runtime prunes
        # what only the input's gradient reads)
        with_input = _loops_kept(ops[:split], ops, graph.outputs)
        without = _loops_kept(ops[:split], ops, graph.outputs[input_gradient_count[0]:])
        kept = ()
        if all(a is not None and b is not None for a, b in zip(with_input, without)):
            kept = tuple(LoopKeeps(b, tuple((Counter(a) - Counter(b)).elements()))
                         for a, b in zip(with_input, without))
        raise LoopLayer(f"{type(layer).__name__} runs {sorted(loops)[0]}: its rule is used",
                        kept)
    # the gradients arriving at the outputs: the arguments after the weights
    # (captured tensors come after them)
    args = [t for t in graph.inputs if t.dtype.name != "resource"]
    upstream = args[n_in + len(weight_specs):n_in + len(weight_specs) + len(grad_specs)]
    if PUSH_CONSTANTS_DOWN:
        ran = push_constants_down(graph, ops[:split], ran, grad_owners)
    forward, backward, hoisted = _hoist(graph, ops[:split], ran, upstream)
    return _to_prims(call, graph, forward, backward, out_names, xla_buffers, upstream,
                     hoisted=hoisted, grad_owners=grad_owners)


def _mocked_op(op: Any) -> str | None:
    """The name of the forward op the tape hands a gradient function as a
    stand-in (with its outputs, or only its inputs where the function reads
    no output): that of its outputs, else the one op of its type that reads
    exactly its inputs."""
    for t in getattr(op, "outputs", None) or ():
        if hasattr(t, "op"):
            return t.op.name
    inputs = [t for t in getattr(op, "inputs", None) or () if hasattr(t, "consumers")]
    if not inputs:
        return None
    names = [t.name for t in inputs]
    found = {c.name for c in inputs[0].consumers()
             if c.type == getattr(op, "type", None) and [t.name for t in c.inputs] == names}
    return found.pop() if len(found) == 1 else None


@contextlib.contextmanager
def _recording_owners(owners: dict[str, str]) -> Iterator[None]:
    """While a tape computes gradients in a graph, note for each op a
    gradient function makes the forward op it is the gradient of (the tape
    looks each function up in TensorFlow's registry as it goes; a gradient
    op's name tells its forward op only where the forward op's name scope
    holds nothing else)."""
    import tensorflow as tf

    try:
        from tensorflow.python.framework import ops as tf_ops

        registry = tf_ops._gradient_registry
        lookup = registry.lookup
    except (ImportError, AttributeError):  # another TensorFlow: names only
        yield
        return
    graph = tf.compat.v1.get_default_graph()

    def recording(name: str) -> Any:
        fn = lookup(name)
        if fn is None:
            return fn

        def gradient(op: Any, *grads: Any) -> Any:
            start = len(graph.get_operations())
            out = fn(op, *grads)
            made = _mocked_op(op)
            if made is not None:
                for new in graph.get_operations()[start:]:
                    owners.setdefault(new.name, made)
            return out

        return gradient

    class Recording:  # the registry, each function it gives noting what it makes
        def __getattr__(self, name: str) -> Any:
            return getattr(registry, name)

        lookup = staticmethod(recording)

    tf_ops._gradient_registry = Recording()
    try:
        yield
    finally:
        tf_ops._gradient_registry = registry


def _gathers_rows(op: Any) -> bool:
    """A gather of whole rows (axis 0, no batch dimensions), whose gradient
    with respect to the table TensorFlow returns as IndexedSlices."""
    import tensorflow as tf

    if op.type != "GatherV2" or len(op.inputs) < 3:
        return False
    axis = tf.get_static_value(op.inputs[2])
    return axis is not None and int(axis) == 0 and op.get_attr("batch_dims") == 0


def _run(graph: Any, backward: list[Any]) -> list[Any]:
    """The gradient ops TensorFlow runs: those the returned gradients depend
    on (and stateful ones); the function runtime prunes the rest. A custom
    gradient may compute more than is asked of it: ``tf.nn.silu``'s also
    returns the gradient of its constant ``beta``, four input-sized products
    and a sum nobody reads (a swish at 16 MiB activations: 64 MiB)."""
    needed = _needed(graph.outputs)
    return [op for op in backward if op.name in needed or op._is_stateful]


def _hoist(graph: Any, forward: list[Any], backward: list[Any],
           upstream: Sequence[Any]) -> tuple[list[Any], list[Any], set[str]]:
    """The forward ops with the gradient ops that run in the forward pass
    among them, the gradient ops left, and the names of those that moved.

    TensorFlow's executor runs an op as soon as its inputs are ready, so a
    gradient op that reads only forward tensors (GELU's ``Square`` of its
    scaled input, ``Abs``'s ``Sign``, the ``-x`` of a division's gradient)
    runs beside the forward pass and its result is held, instead of the
    tensors it reads, until the gradient needs it (allocator traces of fresh
    processes: each GELU's ``Square`` is allocated right after its input,
    before the next layer's matmul). A control dependency holds such an op
    back where grappler keeps it: the variance's ``x - mean`` in a
    normalization's gradient waits for the incoming gradient; GELU's
    ``Square`` loses its dependency when grappler rewrites the product it
    waited for. Grappler is run on the layer's graph to see which it keeps."""
    waits = {t.name for t in upstream}
    made = {t.name: op for op in forward for t in op.outputs}
    free: list[Any] = []
    gates: set[str] = set()  # constants made inside a gradient's control scope
    for op in backward:
        if any(t.name in waits for t in op.inputs) or op._is_stateful:
            waits.update(t.name for t in op.outputs)
        elif (op.type not in FREE_OPS and op.type not in SHAPE_ONLY_OPS
              and any(t.name in made or t.op.type == "Placeholder" for t in op.inputs)):
            free.append(op)
            made.update({t.name: op for t in op.outputs})
        elif any(t.name in waits for c in op.control_inputs for t in c.outputs) or any(
                c.name in gates for c in op.control_inputs):
            # a constant or shape that waits for what its control inputs wait
            # for (the 2 of a square's gradient ``g * (x * 2)``: allocator
            # trace, the product is written into x in the backward pass); one
            # whose control inputs wait for nothing (the gradient of a loss a
            # layer adds, whose incoming gradient is a constant) is ready
            gates.add(op.name)
        # (else a constant, or a shape: ready, nothing to run early)
    if not free:
        return forward, backward, set()
    held = {op.name for op in free if op.control_inputs} | {
        t.op.name for op in free for t in op.inputs if t.op.name in gates}
    if held:
        held -= _control_free(graph, held)
    out = list(forward)
    blocked = set(held)
    for op in free:
        if op.name in blocked or any(t.op.name in blocked for t in op.inputs):
            blocked.add(op.name)
            continue
        # run right after the last op it reads
        producers = {t.op.name for t in op.inputs}
        at = max((i + 1 for i, o in enumerate(out) if o.name in producers), default=0)
        out.insert(at, op)
    names = {op.name for op in out} - {op.name for op in forward}
    return out, [op for op in backward if op.name not in names], names


#: Element-wise ops grappler's constant folding reassociates: the additive
#: and the multiplicative ones (``IsAdd``/``IsSub``, ``IsMul``/``IsDiv``:
#: ``RealDiv`` is not ``Div``).
_PUSH_DOWN_FAMILIES = {"Add": "add", "AddV2": "add", "Sub": "add", "Mul": "mul", "Div": "mul"}
#: Whether :func:`push_constants_down` rewrites a traced gradient as grappler
#: does before the runtime runs it. Tried, not adopted (benchmarks/RESULTS.md,
#: "A constant pushed down into softmax's gradient"): which of the inner op's
#: inputs grappler pairs with the constant is not the traced order in every
#: model (a keras.io text transformer's step pairs it with the gradient).
PUSH_CONSTANTS_DOWN = False
#: With :data:`PUSH_CONSTANTS_DOWN`, rewrite only where grappler's own
#: rewrite of the layer's traced graph pairs the constant with the same leaf.
PUSH_DOWN_AS_GRAPPLER_DOES = False


def push_constants_down(graph: Any, forward: Sequence[Any], backward: list[Any],
                        owners: dict[str, str] | None = None) -> list[Any]:
    """``backward`` with each gradient op ``op(C, op(X, Y))``, ``C`` a
    constant, rewritten as grappler's constant folding rewrites it before the
    step runs (``ConstantFolding::ConstantPushDown``): ``op(X, op(C, Y))``,
    where the inner op is the outer's only reader and ``X`` is its first
    non-constant input. The new inner op reads only ``C`` and ``Y``: where
    ``Y`` is a forward tensor and ``X`` waits for the incoming gradient, it
    is ready in the forward pass and runs there (``_hoist``), its result held
    until the gradient reads it. Softmax's gradient times a constant (Keras'
    attention scales its logits after the product, so the scale's gradient
    multiplies the softmax's: ``((g - sum(g * p)) * p) * scale``) becomes
    ``(scale * p) * (g - ...)``: an allocator trace of a Conformer's step
    holds a logits-sized ``gradient_tape/.../mul_1`` from each attention
    layer's forward pass to its gradient, 16 MiB at batch 16 over 256
    positions and 4 heads.

    The rule's conditions, as grappler checks them: both ops of one family
    (additive or multiplicative) and of two data inputs; the outer's type
    not bfloat16 or float16 (and floating where either op is a ``Sub`` or
    ``Div``);
    the inner read by nothing else and not returned; its two inputs not both
    constant; and, where ``Y`` is not constant, ``C`` no larger than ``Y``
    in elements or in any leading dimension. The new inner op computes the
    same element-wise product or sum (its sign, where grappler turns a sum
    into a difference, does not change what it holds); ``owners`` (gradient
    op to forward op) gains its entry from the op it replaces."""
    import tensorflow as tf

    _, constant, _ = _constants(list(forward) + list(backward))
    constant = set(constant)
    returned = {t.name for t in graph.outputs}
    out = list(backward)
    in_backward = {op.name for op in out}
    runs = in_backward | {op.name for op in forward}  # (what is pruned reads nothing)
    rewritten: dict[str, set[str]] | None = None  # grappler's own inputs, by node
    for parent in list(out):
        family = _PUSH_DOWN_FAMILIES.get(parent.type)
        if family is None or len(parent.inputs) != 2 or parent.name not in in_backward:
            continue
        dtype = parent.outputs[0].dtype
        if dtype in (tf.bfloat16, tf.float16):
            continue
        const_in = [i for i, t in enumerate(parent.inputs) if t.name in constant]
        if len(const_in) != 1:
            continue
        c_at = const_in[0]
        c, inner_t = parent.inputs[c_at], parent.inputs[1 - c_at]
        inner = inner_t.op
        if (_PUSH_DOWN_FAMILIES.get(inner.type) != family or len(inner.inputs) != 2
                or inner.name not in in_backward or inner_t.name in returned
                or len(inner.outputs) != 1
                or sum(r.name in runs for r in inner_t.consumers()) != 1):
            continue
        symmetric = parent.type in ("Add", "AddV2", "Mul") and inner.type in (
            "Add", "AddV2", "Mul")
        if not symmetric and not dtype.is_floating:
            continue
        left_const = inner.inputs[0].name in constant
        if left_const and inner.inputs[1].name in constant:
            continue  # (folded whole)
        x, y = (inner.inputs[1], inner.inputs[0]) if left_const else \
            (inner.inputs[0], inner.inputs[1])
        if y.name not in constant and c.shape.rank is not None and y.shape.rank is not None:
            c_dims, y_dims = list(c.shape), list(y.shape)
            if (c.shape.is_fully_defined() and y.shape.is_fully_defined()
                    and _elements(c) > _elements(y)):
                continue
            if c_dims and any(yd is not None and cd is not None and cd > yd
                              for cd, yd in zip(c_dims, y_dims)):
                continue
        if PUSH_DOWN_AS_GRAPPLER_DOES:
            if rewritten is None:
                try:
                    rewritten = {n.name: {i.lstrip("^").split(":")[0] for i in n.input}
                                 for n in grappler_rewrite(graph).node}
                except Exception:  # (grappler refused the graph: nothing confirmed)
                    rewritten = {}
            reads = rewritten.get(inner.name, set())
            if y.op.name not in reads or x.op.name in reads:
                continue  # grappler's rewrite pairs the constant otherwise, or not at all
        old = parent.outputs[0]
        with graph.as_default():
            make = tf.raw_ops.Mul if family == "mul" else tf.raw_ops.AddV2
            pushed = make(x=c, y=y, name=f"{inner.name}_pushed_down").op
            outer = make(x=x, y=pushed.outputs[0], name=f"{parent.name}_pushed_down").op
        if outer.outputs[0].shape != old.shape:
            continue  # (not the same result: left as traced)
        # (the C API checks an edge's shape: the outer op is made anew and
        # its readers read it instead)
        for reader in old.consumers():
            for k, t in enumerate(reader.inputs):
                if t.name == old.name:
                    reader._update_input(k, outer.outputs[0])
        if old.name in returned:
            graph.outputs = [outer.outputs[0] if t.name == old.name else t
                             for t in graph.outputs]
            returned = {t.name for t in graph.outputs}
        for made, was in ((pushed, inner), (outer, parent)):
            if owners is not None and was.name in owners:
                owners[made.name] = owners[was.name]
            out[out.index(was)] = made
            in_backward.discard(was.name)
            in_backward.add(made.name)
            runs.add(made.name)
    return out


def grappler_rewrite(graph: Any, cluster: Any = None) -> Any:
    """The GraphDef grappler makes of ``graph`` as the runtime optimizes a
    function: every op placed on the CPU, default options, the graph's
    outputs kept; ``cluster`` describes the device (this machine's CPU when
    None)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer

    graph_def = graph.as_graph_def(add_shapes=True)
    for node in graph_def.node:
        node.device = CPU_DEVICE  # the runtime optimizes the placed graph
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=graph)
    meta.collection_def["train_op"].node_list.value.extend([t.op.name for t in graph.outputs])
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.min_graph_nodes = -1
    return tf_optimizer.OptimizeGraph(config, meta, cluster=cluster)


def _control_free(graph: Any, names: set[str]) -> set[str]:
    """Which of these ops grappler's rewrite of the graph leaves without a
    control input; an op it removes or renames counts as held."""
    try:
        out = grappler_rewrite(graph)
    except Exception:
        return set()
    return {n.name for n in out.node
            if n.name in names and not any(i.startswith("^") for i in n.input)}


def _to_prims(call: CallRecord, graph: Any, forward: list[Any],
              backward: list[Any], out_names: list[str],
              xla_buffers: bool = True, upstream: Sequence[Any] = (),
              hoisted: set[str] = frozenset(),
              grad_owners: dict[str, str] | None = None) -> list[Prim]:
    placeholders = [t for t in graph.inputs if t.dtype.name != "resource"][:len(call.inputs)]
    ref: dict[str, str] = {t.name: f"in{i}" for i, t in enumerate(placeholders)}
    # weights: each weight placeholder is the weight's reference
    ref.update(_variable_refs(call, graph))
    forward_names = {t.name for op in forward for t in op.outputs}
    # a gradient op that reads only a tensor's shape does not keep its data
    saved = {t.name for op in backward if op.type not in SHAPE_ONLY_OPS
             for t in op.inputs if t.name in forward_names or t.name in ref}
    tensors = {t.name: t for op in forward for t in op.outputs}
    tensors.update({t.name: t for t in placeholders})
    outs = [tensors[n] for n in out_names if n in tensors][:len(call.outputs)]
    out_ref = {t.name: f"out{i}" for i, t in enumerate(outs)}
    prims: list[Prim] = []
    n = 0
    in_activation: set[str] = set()  # hoisted ops that read the activation's tensors
    hoisted_reads = {t.name for op in forward if op.name in hoisted for t in op.inputs}
    owner = _gradient_op_owners(forward, hoisted)
    # (the tape's record: used for what the gradient ops hold beyond the
    # schedule's gradients; the names still decide the rest, against which
    # the other rules were measured)
    exact = _gradient_op_owners(forward, hoisted, grad_owners or {})
    shared_incoming = _incoming_read_together(backward, owner, upstream)
    # the temporary buffer of an XLA-compiled gradient (a grouped
    # convolution's on the CPU) is allocated while that gradient runs: the
    # backward of the forward op it is the gradient of
    xla_backward: dict[str, int] = {}
    xla_owned: set[str] = set()
    for op in backward if xla_buffers else ():
        # (the gradient's call op is not named after the forward one: its
        # owner is the forward call whose results it reads)
        found = (owner(op) or _single(t.op for t in op.inputs if t.op.type in xla.CALL_OPS
                                      and t.op in forward)) if xla.compiled(op) else None
        temp = xla.call_temp_bytes(op) if found is not None else 0
        if temp:
            xla_backward[found.name] = xla_backward.get(found.name, 0) + temp
            xla_owned.add(op.name)
    # the forward tensors only this layer's gradient reads (not its results,
    # which the next layer's gradient may read too, nor its inputs or views
    # of them) are held by nobody once their last gradient reader runs: an
    # element-wise gradient op writes into them (RMSNormalization's product
    # of the incoming gradient with the normalized input is written into
    # that input in the allocator trace, and allocates nothing)
    backward_readers: dict[str, int] = {}
    for op in backward:
        for t in op.inputs:
            backward_readers[t.name] = backward_readers.get(t.name, 0) + 1
    outputs_of = {t.name for t in outs}
    internal_names = {
        t.name for op in forward for t in op.outputs
        if t.name in saved and t.name not in outputs_of and backward_readers.get(t.name) == 1
        and op.type not in VIEW_OPS and not _identity_arithmetic(op)
        and op.type != "IdentityN"}
    early: list[int] = []  # the hoisted ops' prims
    prim_ops: list[Any] = []  # the op of each prim made here
    for op in forward:
        if op.type in FREE_OPS or op.type == "ReadVariableOp" or not op.outputs:
            continue
        inputs = [ref[t.name] for t in op.inputs if t.name in ref]
        if not inputs and op.type not in ("RandomUniform", "RandomStandardNormal",
                                          "StatelessRandomUniformV2",
                                          "StatelessRandomNormalV2"):
            continue  # a constant computation, folded away
        if (op.type in VIEW_OPS and op.inputs and op.inputs[0].name in ref
                and ref[op.inputs[0].name].startswith("w#")
                and op.outputs[0].name not in out_ref):
            # a view of a weight (Conv1D's kernel with a dimension added) is
            # the weight: its gradient is the weight's, computed on the
            # weight-gradient thread
            ref[op.outputs[0].name] = ref[op.inputs[0].name]
            continue
        outputs = []
        for i, t in enumerate(op.outputs):
            if t.name in out_ref and out_ref[t.name] in [r for r, _ in outputs]:
                continue
            if (op.type == "IdentityN" and i > 0 and t.name not in out_ref
                    and op.inputs[i].name in ref):
                ref[t.name] = ref[op.inputs[i].name]  # each output is its input
                continue
            r = out_ref.get(t.name) or f"t{n}"
            n += 1
            ref[t.name] = r
            outputs.append((r, _bytes(t)))
        keep = [ref[t.name] for t in (*op.inputs, *op.outputs)
                if t.name in saved and t.name in ref and not ref[t.name].startswith("w#")]
        grad_inputs = [ref[t.name] for t in op.inputs
                       if t.name in ref and t.dtype.is_floating]
        if op.name in hoisted:
            grad_inputs = []  # a gradient op: nothing flows back through it
            if any(f"{ACTIVATION_SCOPE}/" in t.op.name or t.op.name in in_activation
                   for t in op.inputs):
                in_activation.add(op.name)  # recomputed with the activation
        if _custom_gradient(op):
            read_forward = {x.name for o in forward if o.name not in hoisted
                            for x in o.inputs}
            # tf.custom_gradient: the gradient goes straight to the function's
            # arguments (the inputs whose identities nobody reads), not back
            # through the ops that computed its results
            grad_inputs = [ref[x.name] for x, y in zip(op.inputs, op.outputs)
                           if x.name in ref and x.dtype.is_floating
                           and y.name not in out_ref and y.name not in read_forward]
            passes = [ref[op.inputs[i].name] for i in _passed_through(op)
                      if op.inputs[i].name in ref and ref[op.inputs[i].name] in grad_inputs]
        else:
            passes = []
        is_view = op.type in VIEW_OPS or _identity_arithmetic(op) or _folded_transpose(op)
        workspace_for: dict[str, int] = {}
        fwd_conv = 0
        if op.type == "Conv2D" and len(inputs) >= 2:
            filt, inp = _col_buffers(op, op.outputs[0], op.inputs[1])
            workspace_for = {inputs[0]: inp, inputs[1]: filt}
        elif (op.type == "Conv2DBackpropInput" and op.inputs[1].name in ref
              and op.inputs[2].name in ref):
            # a transposed convolution: its filter gradient is the filter
            # gradient of the convolution it transposes, whose output is this
            # op's input (allocator trace: [87, 256, 288] for 16 x 16 x 32
            # inputs and a 3 x 3 x 32 x 32 kernel); its input gradient is a
            # forward convolution, without a column buffer
            filt, _ = _col_buffers(op, op.inputs[2], op.inputs[1])
            workspace_for = {ref[op.inputs[1].name]: filt}
        elif op.type == "Conv3D" and len(inputs) >= 2:
            filt, inp = _conv3d_col_buffers(op, op.inputs[0], op.outputs[0], op.inputs[1])
            workspace_for = {inputs[0]: inp, inputs[1]: filt}
        elif (op.type == "Conv3DBackpropInputV2" and op.inputs[1].name in ref
              and op.inputs[2].name in ref):
            # a transposed Conv3D: the input-gradient kernel's buffer while it
            # runs forward, the filter gradient's in the backward pass
            filt, fwd_conv = _conv3d_col_buffers(op, op.outputs[0], op.inputs[2], op.inputs[1])
            workspace_for = {ref[op.inputs[1].name]: filt}
        bwd_ws = 0
        pooling: dict[str, object] = {}
        if op.type == "MaxPool" and cpu_onednn_runs(op.outputs[0].dtype.name) and outputs:
            # oneDNN's max pooling: one byte per output element, kept for
            # the gradient instead of MaxPoolGrad's temporary
            outputs.append((f"t{n}", _elements(op.outputs[0])))
            keep.append(f"t{n}")
            n += 1
        elif op.type == "MaxPool" and outputs:
            pooling = max_pool_grad(outputs[0][0], _bytes(op.outputs[0]),
                                    _elements(op.outputs[0]), ref.get(op.inputs[0].name))
            bwd_ws = pooling.pop("backward_workspace_bytes")
        bwd_ws += xla_backward.get(op.name, 0)
        fwd_ws = fwd_conv
        if op.type == "Einsum" and all(x.shape.is_fully_defined() for x in op.inputs):
            fwd_ws = einsum_workspace(op.get_attr("equation").decode(),
                                      [tuple(int(d) for d in x.shape) for x in op.inputs],
                                      op.outputs[0].dtype.size)
            for i, nbytes in _einsum_gradient_workspaces(op, backward).items():
                r = ref.get(op.inputs[i].name)
                if r is not None and nbytes:
                    workspace_for[r] = workspace_for.get(r, 0) + nbytes
        transposed: dict[str, int] = {}
        operand_reads: dict[str, int] = {}
        if op.type != "MatMul" and len(op.inputs) == 2 and all(
                not ref.get(t.name, "w#").startswith("w#") for t in op.inputs):
            # a product of two activations (attention's): what its gradient
            # kernels read transposed orders the two gradients' ends
            for i, (nbytes, across) in _gradient_reads(op, backward).items():
                operand_reads[ref[op.inputs[i].name]] = nbytes
                if across:
                    transposed[ref[op.inputs[i].name]] = across
        elif op.type == "MatMul" and DENSE_TRANSPOSED_READS:
            # a Dense layer's input gradient ``dy @ W^T`` reads the kernel
            # transposed (see DENSE_TRANSPOSED_READS)
            for i, (_, across) in _gradient_reads(op, backward).items():
                if across and op.inputs[i].name in ref:
                    transposed[ref[op.inputs[i].name]] = across
        for i, nbytes in _broadcast_gradients(op).items():
            r = ref.get(op.inputs[i].name)
            if op.type in _BROADCAST_PRODUCTS and op.inputs[1 - i].name in internal_names:
                # the product of the output gradient with the other operand,
                # a forward tensor this product alone reads, is written into
                # that tensor (RMSNormalization's scale gradient: no
                # allocation in the allocator trace)
                continue
            if r is not None:
                workspace_for[r] = workspace_for.get(r, 0) + nbytes
        # a function Keras has XLA compile (a grouped convolution on the CPU)
        # runs with one temporary buffer of its own
        if xla_buffers:
            fwd_ws += xla.call_temp_bytes(op)
        upcast: dict[str, object] = {}
        if op.type in _MATMUL_OPS and len(op.inputs) == 2 and all(
                t.name in ref for t in op.inputs):
            a, b = op.inputs
            # grappler's remapper fuses a MatMul with the BiasAdd that alone reads it
            readers = op.outputs[0].consumers()
            fused = op.type == "MatMul" and len(readers) == 1 and readers[0].type == "BiasAdd"
            upcast = matmul_upcast(op.outputs[0].dtype.name,
                                   (ref[a.name], _elements(a)), (ref[b.name], _elements(b)),
                                   _elements(op.outputs[0]), fused_bias=fused)
            if op.type != "MatMul":
                # oneDNN's batched bfloat16 products (attention's) hold
                # nothing of the result's size (allocator trace)
                upcast.pop("accumulate_workspace", None)
        # a gather's gradient with respect to its table is IndexedSlices
        sparse = ([ref[op.inputs[0].name]] if _gathers_rows(op)
                  and ref.get(op.inputs[0].name, "").startswith("w#") else [])
        prims.append(prim(
            op.type, inputs, outputs, save=list(dict.fromkeys(keep)), sparse_grad=sparse,
            grad_passes=passes,
            signature=_signature_of(op, inputs, outputs, hoisted),
            differentiable=list(dict.fromkeys(grad_inputs)),
            alias=is_view and bool(inputs),
            # an element-wise kernel may write into any input of its size
            # (BinaryOp forwards input 0, else input 1), except one that a
            # hoisted gradient op also reads: TensorFlow's executor starts
            # both when the input is made, and neither finds it unshared
            # (GELU's erfc allocates beside the square its gradient keeps,
            # in the allocator trace; in a recomputation, without that
            # square, it writes into its input)
            inplace=list(dict.fromkeys(
                ref[t.name] for t in op.inputs if t.name in ref
                and (op.name in hoisted or t.name not in hoisted_reads)))
            if op.type in FORWARDING_OPS else [],
            grad_inplace=op.type in FORWARDING_OPS or op.type in VIEW_GRADIENT_OPS,
            grad_read_together=op.name in shared_incoming,
            macs=_macs(op), kernel=_FAMILY.get(op.type, ""), gemm_min_dim=_gemm_min_dim(op),
            out_channels=_out_channels(op), conv_gemm=_conv_gemm(op),
            workspace_for=workspace_for, backward_workspace_bytes=bwd_ws,
            always_grads=([(ref[t.name], _bytes(t)) for t in op.inputs
                           if t.name in ref and t.dtype.is_floating]
                          if op.name in xla_backward else []),
            forward_workspace_bytes=fwd_ws, transposed_reads=transposed,
            operand_reads=operand_reads, **pooling,
            role="activation" if (f"{ACTIVATION_SCOPE}/" in op.name
                                  or op.name in in_activation) else "",
            **upcast,
        ))
        prim_ops.append(op)
        if op.name in hoisted:
            early.append(len(prims) - 1)
            prims[-1] = dataclasses.replace(prims[-1], hoisted=True)
    _keep_for_readers(prims, prim_ops, ref, _gradient_owners(backward, saved, owner))
    _hold_early_results(prims, early)
    # outputs the graph returns without an op of their own (a call returning
    # its input): views
    made = {r for p in prims for r, _ in p.outputs}
    for i, t in enumerate(outs):
        if f"out{i}" not in made:
            src = ref.get(t.name)
            if src:
                prims.append(prim("view", [src], [(f"out{i}", _bytes(t))], alias=True))
    for i in range(len(call.outputs)):
        if f"out{i}" not in {r for p in prims for r, _ in p.outputs}:
            prims.append(prim("view", ["in0"] if call.inputs else [],
                              [(f"out{i}", call.outputs[i].nbytes)], alias=bool(call.inputs)))
    # the gradient ops' own intermediates, alive together at their highest
    scheduled = _internal_gradients(backward, exact) | _reduced_products(backward, exact)
    internal = [tensors[name] for name in sorted(internal_names)]
    # (for PER_PRIM_WORKSPACE only: where each forward op's gradient ops
    # peak, and which write into the gradient they were given)
    inplace: set[str] = set()  # forward ops whose gradient writes into the one it is given
    by_owner: dict[str | None, tuple[int, ...]] = {}
    by_owner_if_free: dict[str | None, tuple[int, ...]] = {}
    per_prim = PER_PRIM_WORKSPACE
    parts = _backward_intermediates_peak(backward, graph, xla_buffers, upstream,
                                         scheduled=scheduled, placed=xla_owned,
                                         internal=internal, owner=exact,
                                         by_owner=by_owner if per_prim else None,
                                         inplace=inplace if per_prim else None)
    # where the schedule finds the layer's inputs held by nobody else, the
    # gradient ops may write into them
    taken: set[str] = set()
    parts_if_free = _backward_intermediates_peak(backward, graph, xla_buffers, upstream,
                                                 placeholders, taken, scheduled=scheduled,
                                                 placed=xla_owned, internal=internal,
                                                 owner=exact,
                                                 by_owner=by_owner_if_free if per_prim else None)
    donors = tuple(ref[t.name] for t in placeholders if t.name in taken)
    if per_prim and prims and (by_owner or by_owner_if_free or inplace):
        # a gradient written into the gradient it was given (a softmax's:
        # its ``sub`` and ``mul_1`` write into the incoming gradient, which
        # is the input's gradient in the allocator trace)
        for k, op in enumerate(prim_ops):
            if op.name in inplace and not prims[k].grad_inplace:
                prims[k] = dataclasses.replace(prims[k], grad_inplace=True)
        _place_workspaces(prims, prim_ops, by_owner, by_owner_if_free, donors)
    elif prims and (parts or donors):
        # where in the layer's gradient its intermediates peak, beside what,
        # the prims do not say: they are held when the layer's gradient ends,
        # beside the gradients it hands back (a normalization's partial
        # products beside its input gradient), and again, as one more
        # temporary, when it starts, beside all the layer keeps (PReLU's two
        # products of the incoming gradient, one with each kept ReLU output,
        # alive with both in the allocator trace); the higher counts
        i = _first_on_gradient_path(prims)
        first = prims[i]
        prims[i] = Prim(**{**first.__dict__,
                           "backward_workspace_bytes": first.backward_workspace_bytes
                           + sum(parts),
                           "backward_workspace_parts": parts,
                           "backward_workspace_parts_if_free":
                               parts_if_free if donors else (),
                           "backward_donors": donors})
        j = _last_on_gradient_path(prims)
        if j != i and parts:
            # (where the layer's inputs are free, written into them here too)
            prims[j] = _with_workspace(prims[j], parts, parts_if_free, donors)
    return _only_known_saves(prims)


def _with_workspace(p: Prim, parts: tuple[int, ...], parts_if_free: tuple[int, ...],
                    donors: tuple[str, ...]) -> Prim:
    """``p`` with these gradient intermediates held beside its own backward
    workspace (``parts_if_free`` where the layer's ``donors`` are free)."""
    own = p.backward_workspace_parts or (
        (p.backward_workspace_bytes,) if p.backward_workspace_bytes else ())
    return Prim(**{**p.__dict__,
                   "backward_workspace_bytes": sum(own) + sum(parts),
                   "backward_workspace_parts": own + parts,
                   "backward_workspace_parts_if_free": own + parts_if_free if donors else (),
                   "backward_donors": donors})


#: Whether the intermediates of each forward op's gradient ops (the tape's
#: record of which op each is for) are held beside that op's gradients, at
#: their highest there, and a forward op whose gradient writes into the
#: gradient it was given hands that buffer on as its input's gradient.
#: False: the layer's highest beyond what the schedule holds is held where
#: its gradient starts and where it ends. Tried (``benchmarks.
#: ordering_variants --variants per-prim-workspace``) and not adopted:
#: benchmarks/RESULTS.md, "Which forward op a gradient op is for".
PER_PRIM_WORKSPACE = False
#: Whether a Dense layer's input gradient ``dy @ W^T`` (``_MatMulGrad``'s
#: ``transpose_b``) counts its kernel as read transposed
#: (``Prim.transposed_reads``), so that the speeds that order the CPU's two
#: gradient threads give it ``timing.NOMINAL_TRANSPOSED_READ_BYTES_S`` more
#: per kernel byte on TensorFlow's own kernels. Measured
#: (``benchmarks/dense_gradient_speeds.py``): VGG16's 392 MiB fc1 kernel at
#: batch 8, 216 ms against 33 for ``x @ W``; the kernel's gradient ``x^T @
#: dy`` takes no longer than ``x @ W``. Tried (``benchmarks.
#: ordering_variants --variants dense-transposed-reads``) and not adopted:
#: benchmarks/RESULTS.md, "A Dense layer's input gradient reads its kernel
#: transposed".
DENSE_TRANSPOSED_READS = False


def _place_workspaces(prims: list[Prim], prim_ops: list[Any],
                      by_owner: dict[str | None, tuple[int, ...]],
                      by_owner_if_free: dict[str | None, tuple[int, ...]],
                      donors: tuple[str, ...]) -> None:
    """Give each prim the intermediates its gradient ops hold at their
    highest, beyond the gradients the schedule holds then (``by_owner``, from
    ``_backward_intermediates_peak``); those of gradient ops of no prim (a
    view, a folded op, or one the names do not tell) go to the prim whose
    gradient runs first."""
    index = {op.name: k for k, op in enumerate(prim_ops)}
    first = _last_on_gradient_path(prims)
    placed: dict[int, list[tuple[int, ...]]] = {}
    placed_if_free: dict[int, list[tuple[int, ...]]] = {}
    for table, into in ((by_owner, placed), (by_owner_if_free, placed_if_free)):
        for name, parts in table.items():
            k = index.get(name, first) if name is not None else first
            into.setdefault(k, []).append(parts)
    for k in sorted(set(placed) | set(placed_if_free)):
        # several sources at one prim: the highest of them
        parts = max(placed.get(k, [()]), key=sum)
        parts_if_free = max(placed_if_free.get(k, [()]), key=sum)
        if parts or (donors and parts_if_free):
            prims[k] = _with_workspace(prims[k], parts, parts_if_free, donors)


_NOT_MERGED = {"RandomUniform", "RandomStandardNormal", "StatelessRandomUniformV2",
               "StatelessRandomNormalV2", "Placeholder"}


def _signature_of(op: Any, inputs: list[str], outputs: list[tuple[str, int]],
                  hoisted: set[str]) -> str:
    """The prim's ``signature`` (see ``ir.Prim``): empty unless the op has
    one output, reads no weight, is not stateful, random or a gradient op,
    and reads nothing but traced tensors and constants."""
    if (len(outputs) != 1 or len(op.outputs) != 1 or op.type in _NOT_MERGED
            or op.name in hoisted or op._is_stateful or op.control_inputs
            or any(r.startswith("w") for r in inputs)):
        return ""
    parts = [op.type, repr(op_attributes(op))]
    for t in op.inputs:
        if t.op.type == "Const":
            parts.append("c=" + t.op.node_def.attr["value"].SerializeToString(
                deterministic=True).hex())
        else:
            parts.append("x")
    return "|".join(parts)


def _gradient_op_owners(forward: Sequence[Any], hoisted: set[str],
                        recorded: dict[str, str] | None = None) -> Callable[[Any], Any]:
    """A function from a gradient op to the forward op whose gradient
    function made it (None where the names do not tell one op), from the
    name scope TensorFlow's tape gives a gradient: ``gradient_tape/`` and the
    forward op's name (``gradient_tape/.../Gelu/mul_3/Mul`` for
    ``.../Gelu/mul_3``), or its name scope where the gradient's ops are named
    in it (``gradient_tape/.../einsum_1/Einsum_1`` for
    ``.../einsum_1/Einsum``, the one forward op of that scope). Where the
    op's type names the forward kernel it is the gradient of and the op so
    named is of another type, the one op of that type in its scope owns it
    (``tf.nn.separable_conv2d`` names its pointwise ``Conv2D``
    ``separable_conv2d`` and its ``DepthwiseConv2dNative``
    ``separable_conv2d/depthwise``; both gradients are named
    ``gradient_tape/.../separable_conv2d/...``). With ``recorded`` (gradient
    op -> forward op, as the tape made them: ``_recording_owners``), the
    record decides for the ops it names."""
    own = [op for op in forward if op.name not in hoisted]
    by_name = {op.name: op for op in own}
    by_scope: dict[str, list[Any]] = {}
    for op in own:
        by_scope.setdefault(op.name.rpartition("/")[0], []).append(op)
    prefix = "gradient_tape/"
    recorded = recorded or {}

    def owner(op: Any) -> Any:
        if op.name in recorded:  # (as the tape made it)
            return by_name.get(recorded[op.name])
        if not op.name.startswith(prefix):
            return None
        parts = op.name[len(prefix):].split("/")
        for k in range(len(parts) - 1, 0, -1):
            found = by_name.get("/".join(parts[:k]))
            if found is not None:
                if "Backprop" in op.type and not op.type.startswith(found.type + "Backprop"):
                    kin = [o for o in by_scope.get(found.name, ())
                           if op.type.startswith(o.type + "Backprop")]
                    if len(kin) == 1:
                        return kin[0]
                return found
        scoped = by_scope.get("/".join(parts[:-1]), [])
        return scoped[0] if len(scoped) == 1 else None

    return owner


def _gradient_owners(backward: Sequence[Any], saved: set[str],
                     owner: Callable[[Any], Any]) -> dict[str, set[str] | None]:
    """For each tensor the gradient reads, the forward ops whose gradients
    read it (None where some reader's forward op is not known)."""
    owners: dict[str, set[str] | None] = {}
    for op in backward:
        if op.type in SHAPE_ONLY_OPS:
            continue
        for t in op.inputs:
            if t.name not in saved:
                continue
            found = owner(op)
            if found is None or owners.get(t.name, set()) is None:
                owners[t.name] = None
            else:
                owners.setdefault(t.name, set()).add(found.name)
    return owners


def _incoming_read_together(backward: Sequence[Any], owner: Callable[[Any], Any],
                            upstream: Sequence[Any]) -> set[str]:
    """The forward ops two of whose gradient ops read the gradient arriving
    at the op, both made ready by it (``Prim.grad_read_together``).
    TensorFlow's executor hands it to both at once; where they run side by
    side, neither finds itself its only reader and neither writes into it. A
    product's two gradients (``grad * y`` and ``grad * x``) then each take a
    buffer of their own: in allocator traces, the ``mul`` of a
    ``UnitNormalization`` (two 1 MiB products at batch 512 beside the 1 MiB
    incoming gradient) and the ``inv * gamma`` of a ``LayerNormalization``
    (two 4 MiB products). Not always: that normalization's ``x * inv`` made
    one 4 MiB product and wrote the other into the incoming gradient, and
    profiled, its two ran one after the other in a step whose other thread
    was running a transposed convolution's filter gradient (side by side in
    another step)."""
    together = _ready_together(list(backward), arriving=upstream)
    own: dict[str, list[Any]] = {}
    for op in backward:
        found = owner(op)
        if found is not None:
            own.setdefault(found.name, []).append(op)
    out: set[str] = set()
    for name, ops in own.items():
        made_here = {t.name for op in ops for t in op.outputs}
        readers: dict[str, int] = {}
        for op in ops:
            for t in {t.name for t in op.inputs if t.name not in made_here
                      and t.dtype.is_floating and (t.name, op.name) in together}:
                readers[t] = readers.get(t, 0) + 1
        if any(k > 1 for k in readers.values()):
            out.add(name)
    return out


def _internal_gradients(backward: Sequence[Any], owner: Callable[[Any], Any]) -> set[str]:
    """The gradients of the layer's own forward tensors: a tensor a gradient
    op reads that the gradient of another forward op made, with the shape of
    an output of the gradient op's own forward op (the ``bted`` gradient the
    second einsum of ``bteh,ehd->bted`` then ``bted,bte->btd`` hands the
    first). The schedule allocates each as the gradient of a prim's input;
    among the gradient ops' other intermediates it would be counted twice
    (2 MiB over an allocator trace for that layer at batch 16)."""
    owner_of = {op.name: owner(op) for op in backward}
    made_by = {t.name: owner_of[op.name] for op in backward for t in op.outputs}
    found: set[str] = set()
    for op in backward:
        mine = owner_of[op.name]
        if mine is None:
            continue
        shapes = {tuple(t.shape) for t in mine.outputs if t.shape.is_fully_defined()}
        for t in op.inputs:
            other = made_by.get(t.name)
            if other is not None and other is not mine and tuple(t.shape) in shapes:
                found.add(t.name)
    return found


def _keep_for_readers(prims: list[Prim], prim_ops: Sequence[Any], ref: dict[str, str],
                      owners: dict[str, set[str] | None]) -> None:
    """Keep a tensor only with the prims whose gradients read it.

    A forward tensor the gradient reads is saved by every prim that reads or
    writes it; the schedule releases it after the last of their gradients.
    TensorFlow frees it after its last reader: an einsum's output that only
    the next einsum's gradient reads is freed once that gradient has run,
    before the einsum's own (a mixture of experts' 1 MiB ``bteh,ehd->bted``
    product, allocator trace). Where every reader's forward op is known and
    itself a prim that reads or writes the tensor, the other prims do not
    save it."""
    local = [set(p.inputs) | {r for r, _ in p.outputs} for p in prims]
    index = {op.name: i for i, op in enumerate(prim_ops)}
    by_ref: dict[str, set[str] | None] = {}
    for name, readers in owners.items():
        r = ref.get(name)
        if r is None:
            continue
        if readers is None or by_ref.get(r, set()) is None:
            by_ref[r] = None
            continue
        ok = all(o in index and r in local[index[o]] for o in readers)
        by_ref[r] = by_ref.get(r, set()) | readers if ok else None
    for i, (p, op) in enumerate(zip(prims, prim_ops)):
        save = tuple(r for r in p.save if by_ref.get(r) is None or op.name in by_ref[r])
        if save != p.save:
            prims[i] = Prim(**{**p.__dict__, "save": save})


def _hold_early_results(prims: list[Prim], early: list[int]) -> None:
    """Keep what a gradient op run in the forward pass hands its gradient.

    Such a prim has no gradient of its own, so the schedule would not keep
    its result; the prim that keeps it instead is the first after it that
    reads what it read (GELU's ``erfc(z)`` for the ``exp(-z**2)`` of its
    gradient, computed from ``z``) and has a gradient, reading it there too.
    Where none does, the layer's last prim on the gradient path keeps it."""
    position = set(early)
    made_by = {r: i for i, p in enumerate(prims) for r, _ in p.outputs}
    for i in early:
        p = prims[i]
        kept = [r for r in p.save if r in {o for o, _ in p.outputs}]
        if not kept:
            continue
        # what the chain of early ops this one ends started from
        roots: set[str] = set()
        stack = list(p.inputs)
        while stack:
            r = stack.pop()
            j = made_by.get(r)
            if j in position:
                stack.extend(prims[j].inputs)
            else:
                roots.add(r)
        later = [j for j in range(i + 1, len(prims))
                 if j not in position and prims[j].grad_inputs()]
        owner = next((j for j in later if roots & set(prims[j].inputs)), None)
        if owner is None:
            last = _last_on_gradient_path(prims)
            owner = last if last in later else None
        prims[i] = Prim(**{**p.__dict__, "save": tuple(r for r in p.save if r not in kept)})
        if owner is not None:
            q = prims[owner]
            prims[owner] = Prim(**{**q.__dict__,
                                   "inputs": q.inputs + tuple(r for r in kept
                                                              if r not in q.inputs),
                                   "differentiable": q.grad_inputs(),
                                   "save": q.save + tuple(kept)})


def _last_on_gradient_path(prims: list[Prim]) -> int:
    """The last prim that writes one of the call's outputs from something
    differentiable: the schedule runs its gradient first, while everything the
    layer keeps is still alive."""
    for i in range(len(prims) - 1, -1, -1):
        p = prims[i]
        if p.grad_inputs() and any(r.startswith("out") for r, _ in p.outputs):
            return i
    return len(prims) - 1


def _first_on_gradient_path(prims: list[Prim]) -> int:
    """The first prim whose outputs reach the call's outputs through
    differentiable inputs (0 when none does): the schedule runs its gradient
    last, when the layer's gradient ends."""
    reached = {r for p in prims for r, _ in p.outputs if r.startswith("out")}
    first = 0
    for i in range(len(prims) - 1, -1, -1):
        p = prims[i]
        if any(r in reached for r, _ in p.outputs):
            reached.update(p.grad_inputs())
            first = i
    return first


def _custom_gradient(op: Any) -> bool:
    """Whether an op is the ``IdentityN`` that ``tf.custom_gradient`` wraps
    around a function's results and arguments."""
    if op.type != "IdentityN":
        return False
    try:
        return op.get_attr("_gradient_op_type").decode().startswith("CustomGradient")
    except (ValueError, TypeError):
        return False


def _passed_through(op: Any) -> list[int]:
    """The inputs of a ``tf.custom_gradient`` ``IdentityN`` whose gradient is
    the gradient of its first output as it came (the function's gradient
    returns ``upstream``: a straight-through estimator, Keras' float8
    quantize-dequantize of a layer's input and kernel): TensorFlow hands that
    tensor on, and no buffer is made for it. Read by calling the registered
    gradient function on placeholders in a graph of its own, which captures
    what it reads of the traced one (whose ops and readers stay as they
    are); none where it cannot be called so."""
    import tensorflow as tf
    from tensorflow.python.framework import func_graph
    from tensorflow.python.framework import ops as tf_ops

    try:
        grad_fn = tf_ops.gradient_registry.lookup(op.get_attr("_gradient_op_type").decode())
        with func_graph.FuncGraph("memscope_probe").as_default():
            upstream = [tf.compat.v1.placeholder(t.dtype, t.shape) for t in op.outputs]
            grads = grad_fn(op, *upstream)
    except Exception:  # a gradient function that needs more than its op
        return []
    grads = list(grads) if isinstance(grads, (list, tuple)) else [grads]
    return [i for i, g in enumerate(grads) if g is not None and g is upstream[0]]


def _identity_arithmetic(op: Any) -> bool:
    """``x * 1``, ``x / 1``, ``x + 0`` or ``x - 0`` with a constant of ones or
    zeros that does not broadcast ``x``: grappler's constant folding turns it
    into ``x`` (``tf.nn.silu`` multiplies its input by ``beta = 1``)."""
    import tensorflow as tf

    neutral = {"Mul": (1.0, (0, 1)), "RealDiv": (1.0, (1,)), "Div": (1.0, (1,)),
               "AddV2": (0.0, (0, 1)), "Add": (0.0, (0, 1)), "Sub": (0.0, (1,))}
    if op.type not in neutral or len(op.inputs) != 2:
        return False
    value, positions = neutral[op.type]
    for i in positions:
        const, other = op.inputs[i], op.inputs[1 - i]
        if const.op.type != "Const" or other.shape != op.outputs[0].shape:
            continue
        v = tf.get_static_value(const)
        if v is not None and (v == value).all():
            return True
    return False


def _folded_transpose(op: Any) -> bool:
    """A transpose of the last two axes that only matrix products read:
    grappler's arithmetic optimizer (``FoldTransposeIntoMatMul``) has each
    product (``_MATMUL_OPS``) read the transpose's input with its own transpose flag, so the
    transposed tensor is never made (Keras' ``Attention`` layer's ``key``
    transposed for ``query @ key^T``: no forward allocation in the trace,
    the gradient's ``transpose`` still made). Its gradient stays a
    transpose of its own."""
    import tensorflow as tf

    if op.type != "Transpose" or len(op.inputs) != 2 or not op.outputs:
        return False
    perm = tf.get_static_value(op.inputs[1])
    if perm is None:
        return False
    perm = [int(a) for a in perm]
    n = len(perm)
    if n < 2 or perm != [*range(n - 2), n - 1, n - 2]:
        return False
    readers = op.outputs[0].consumers()
    return bool(readers) and all(r.type in _MATMUL_OPS for r in readers)


def _single(items: Iterable[Any]) -> Any:
    """The one distinct item, or None where there are none or several."""
    found = set(items)
    return found.pop() if len(found) == 1 else None


def _backward_intermediates_peak(backward: list[Any], graph: Any,
                                 xla_buffers: bool = True,
                                 upstream: Sequence[Any] = (),
                                 donors: Sequence[Any] = (),
                                 taken: set[str] | None = None,
                                 scheduled: set[str] = frozenset(),
                                 placed: set[str] = frozenset(),
                                 internal: Sequence[Any] = (),
                                 owner: Callable[[Any], Any] | None = None,
                                 by_owner: dict[str, tuple[int, ...]] | None = None,
                                 inplace: set[str] | None = None) -> tuple[int, ...]:
    """Bytes the gradient ops need beyond what the schedule holds for them, as
    the sizes of the allocations that make them up.

    The schedule allocates each gradient the layer hands back and, for a
    tensor several ops read, each op's partial gradient until they are summed
    (the inputs of an ``AddN``). The gradient ops' other intermediates (freed
    after their last reader; an element-wise kernel writes into an input
    nobody reads after it, TensorFlow's forwarding, so the two share one
    buffer), and the temporary buffer of a gradient XLA runs (``xla``),
    come on top: the extra is the peak of everything alive together less the
    most the gradients and partials alone hold. The gradients arriving at
    the layer's outputs (``upstream``, held by the schedule until the layer's
    gradient ends) can be forwarded too: an activation's gradient (ReluGrad)
    whose incoming gradient nothing else reads writes into it and allocates
    nothing (allocator trace of a Dense layer with a ReLU). ``donors`` (the
    layer's inputs) are buffers of that kind too, for where nothing outside
    the layer holds them: the names of those an op writes into go to
    ``taken`` (BatchNormalization's ``x - mean`` in its gradient is written
    into ``x`` when the convolution before it keeps only its own input).
    ``scheduled`` names more tensors the schedule allocates itself, counted
    with the gradients (``_internal_gradients``, ``_reduced_products``);
    ``placed`` names XLA gradient calls whose buffers a prim's backward
    already holds. ``internal`` are forward tensors only these ops read:
    their bytes are the schedule's (what the layer keeps), but their last
    reader may write into them. With ``owner`` (a gradient op's forward op),
    ``by_owner`` gets, for each forward op, the intermediates alive at the
    highest point of its gradient ops beyond what the schedule holds then,
    and ``inplace`` the forward ops one of whose gradient ops writes into a
    gradient another forward op's gradient made."""
    # a result handed back as a view of another tensor (an Identity; Conv1D's
    # filter and input gradients, 4-D, reshaped to 3-D) is that tensor's buffer
    final = {t.name for t in graph.outputs}
    for op in reversed(graph.get_operations()):
        if (op.type in VIEW_OPS and op.inputs
                and any(o.name in final for o in op.outputs)):
            final.add(op.inputs[0].name)
    summed = {t.name for op in backward if op.type == "AddN" for t in op.inputs}
    summed |= scheduled  # tensors the schedule allocates itself
    readers: dict[str, int] = {}
    for op in backward:
        for t in op.inputs:
            readers[t.name] = readers.get(t.name, 0) + 1
    together = _ready_together(backward)
    # one walk in order: each op's new buffers and the buffers freed after it
    size: list[int] = []  # by buffer
    modelled: set[int] = set()
    events: list[tuple[list[int], list[int]]] = []
    buffer_of: dict[str, int] = {}  # intermediate tensor -> its buffer
    held: set[int] = set()  # buffers the schedule holds (incoming gradients)
    donor_names = {t.name for t in donors}
    for t in (*upstream, *donors):
        if readers.get(t.name):
            buffer_of[t.name] = len(size)
            held.add(len(size))
            size.append(_bytes(t))
    # the forward tensors only these ops read: the schedule holds them (as
    # what the layer keeps), so their bytes are not counted here, but their
    # last reader may write into them and allocate nothing
    uncounted: set[int] = set()
    for t in internal:
        if readers.get(t.name) and t.name not in buffer_of:
            buffer_of[t.name] = len(size)
            uncounted.add(len(size))
            size.append(_bytes(t))
    # the incoming gradients are alive from the start, and to the end
    events.append((sorted(held), []))
    modelled.update(held)
    owners: list[str | None] = [None]  # the forward op each event is a gradient of
    made_by: dict[int, str | None] = {}  # buffer -> the forward op whose gradient made it
    tracking = by_owner is not None or inplace is not None
    for op in backward:
        found = owner(op) if owner is not None and tracking else None
        owners.append(found.name if found is not None else None)
        new: list[int] = []
        if (op.type not in VIEW_OPS and op.type not in FREE_OPS
                and not _identity_arithmetic(op)):
            donor = None
            if op.type in FORWARDING_OPS or op.type in FORWARDING_GRAD_OPS:
                # (a gradient handed back is the schedule's own allocation, even
                # where TensorFlow writes it into the incoming gradient)
                handed_back = op.outputs[0].name in final
                donor = next((t.name for t in op.inputs if t.name in buffer_of
                              and readers.get(t.name) == 1
                              and (t.name, op.name) not in together
                              and not (handed_back and buffer_of[t.name] in held)
                              and size[buffer_of[t.name]] == _bytes(op.outputs[0])), None)
            for i, t in enumerate(op.outputs):
                if not (t.name in final or readers.get(t.name)):
                    continue
                if i == 0 and donor is not None:
                    bid = buffer_of.pop(donor)
                    readers[donor] = 0
                    if donor in donor_names and taken is not None:
                        taken.add(donor)
                    if (inplace is not None and owners[-1] is not None and bid in modelled
                            and made_by.get(bid) != owners[-1]):
                        # written into a gradient another op's gradient made
                        inplace.add(owners[-1])
                else:
                    bid = len(size)
                    size.append(_bytes(t))
                    new.append(bid)
                    made_by[bid] = owners[-1]
                if t.name in final or t.name in summed:
                    modelled.add(bid)
                if t.name not in final:  # the gradients handed back stay
                    buffer_of[t.name] = bid
        freed = []
        # an XLA gradient's buffer
        temp = xla.call_temp_bytes(op) if xla_buffers and op.name not in placed else 0
        if temp:
            new.append(len(size))
            freed.append(len(size))
            size.append(temp)
        for t in op.inputs:
            if t.name in buffer_of:
                readers[t.name] -= 1
                if readers[t.name] == 0:
                    bid = buffer_of.pop(t.name)
                    if bid not in held:  # (the schedule frees those)
                        freed.append(bid)
        events.append((new, freed))
    live: set[int] = set()
    peak = peak_modelled = total = ours = 0
    at_peak: list[int] = []
    excess: dict[str | None, tuple[int, list[int]]] = {}
    for (new, freed), at in zip(events, owners):
        freed = [b for b in freed if b not in uncounted]
        live.update(new)
        total += sum(size[b] for b in new)
        ours += sum(size[b] for b in new if b in modelled)
        if total > peak:
            peak, at_peak = total, [size[b] for b in live if b not in modelled]
        peak_modelled = max(peak_modelled, ours)
        # (at the op that allocated: the highest is where something was made)
        if by_owner is not None and new and total - ours > excess.get(at, (0, []))[0]:
            excess[at] = (total - ours, [size[b] for b in live if b not in modelled])
        live.difference_update(freed)
        total -= sum(size[b] for b in freed)
        ours -= sum(size[b] for b in freed if b in modelled)
    if by_owner is not None:
        for at, (_, sizes) in excess.items():
            by_owner[at] = tuple(sorted((n for n in sizes if n), reverse=True))
    extra = max(0, peak - peak_modelled)
    # the intermediates alive at the peak, largest first, up to those bytes
    parts: list[int] = []
    for n in sorted(at_peak, reverse=True):
        if n and sum(parts) + n <= extra:
            parts.append(n)
    if extra - sum(parts) > 0:
        parts.append(extra - sum(parts))
    return tuple(parts)


def _ready_together(ops: list[Any], arriving: Sequence[Any] = ()) -> set[tuple[str, str]]:
    """``(tensor, reader)`` pairs of ``ops`` where another reader of the
    tensor becomes ready with this one: the last input both wait for is that
    tensor. TensorFlow's executor hands a result to all its readers at once
    and runs the ready ones side by side (two inter-op threads here), so
    neither finds itself the tensor's only reader and neither writes into
    it: in an allocator trace of ``AdditiveAttention``'s gradient, the
    incoming gradient tiled over the 64 features is read by the products for
    the ``tanh`` and for the ``scale`` (64 MiB each at batch 64, 64 tokens),
    and all three were alive together with the kept ``tanh``. ``arriving``:
    tensors made before the first of ``ops`` (the gradients arriving at a
    layer), which its readers that wait for nothing else have at once."""
    made = {t.name: -1 for t in arriving}
    made.update({t.name: i for i, op in enumerate(ops) for t in op.outputs})
    ready: dict[str, list[str]] = {}  # tensor -> readers that wait last for it
    for i, op in enumerate(ops):
        inputs = [t.name for t in op.inputs if t.name in made and made[t.name] < i]
        if not inputs:
            continue
        last = max(made[n] for n in inputs)
        for n in {n for n in inputs if made[n] == last}:
            ready.setdefault(n, []).append(op.name)
    return {(t, r) for t, rs in ready.items() if len(rs) > 1 for r in rs}


def _only_known_saves(prims: list[Prim]) -> list[Prim]:
    """Drop saves of references a prim neither reads nor writes."""
    out = []
    for p in prims:
        local = set(p.inputs) | {r for r, _ in p.outputs}
        save = tuple(r for r in p.save if r in local)
        out.append(Prim(**{**p.__dict__, "save": save}))
    return out


def _col_buffers(op: Any, out: Any, kernel: Any) -> tuple[int, int]:
    """``rules.conv.col_buffers`` of a convolution op whose output (of the
    convolution it computes a gradient of, for a transposed one) and kernel
    are these tensors, in the op's data format and dtype."""
    from .rules.conv import col_buffers

    fmt = op.get_attr("data_format").decode()
    return col_buffers(tuple(int(d) for d in out.shape), tuple(int(d) for d in kernel.shape),
                       "channels_first" if fmt == "NCHW" else "channels_last",
                       op.outputs[0].dtype.size, op.outputs[0].dtype.name)


def _conv3d_col_buffers(op: Any, inp: Any, out: Any, kernel: Any) -> tuple[int, int]:
    """``rules.conv.conv3d_col_buffers`` of a Conv3D from ``inp`` to ``out``
    (the convolution a transposed one transposes: its output to its input)
    with this kernel, in the op's dtype."""
    from .rules.conv import conv3d_col_buffers

    def shape(t: Any) -> tuple[int, ...]:
        return tuple(int(d) for d in t.shape)

    return conv3d_col_buffers(shape(inp), shape(out), shape(kernel), op.outputs[0].dtype.size,
                              op.outputs[0].dtype.name)


def _variables(layer: Any) -> tuple[list[Any], list[Any]]:
    """A traced call's trainable and frozen variables, in the order its
    weight arguments take them (a raw keras.ops node of a Functional model is
    an Operation: none)."""
    return (list(getattr(layer, "trainable_variables", ())),
            list(getattr(layer, "non_trainable_variables", ())))


def _variable_refs(call: CallRecord, graph: Any) -> dict[str, str]:
    """The weight placeholders in the graph -> the call's weight references
    (``w#i``, by position in ``call.weights``)."""
    position = {w.key: i for i, w in enumerate(call.weights)}
    variables = [v for group in _variables(call.layer) for v in group]
    placeholders = [t for t in graph.inputs if t.dtype.name != "resource"]
    placeholders = placeholders[len(call.inputs):len(call.inputs) + len(variables)]
    return {t.name: f"w#{position[id(v)]}" for t, v in zip(placeholders, variables)
            if id(v) in position}


# --- the loss ---------------------------------------------------------------------

_LOSS_CACHE: dict[str, Any] = {}


def trace_loss(fn: Any, shape: tuple[int, ...], dtype: str, sparse: bool) -> Any:
    """What one output's loss holds, read off TensorFlow's graph of the loss and
    its gradient with respect to the output (``fn(y_true, y_pred)`` on
    placeholders of the output's concrete shape; integer class ids for a
    sparse loss): a :class:`~keras_memscope.schedule.LossSpec`.

    The forward ops' results that a gradient op reads are kept (``saved_bytes``;
    the kept one the output's gradient is written into first, ``gradient_bytes``
    of it, when it is); the rest live from their op to their last reader, an
    element-wise result written into an input read last. The highest of
    these while the forward ops run, beyond what is kept, is the loss's
    ``workspace_bytes``; while the gradient ops run, beyond what is kept and
    the gradient, its ``backward_bytes``. Sparse cross-entropy on logits
    keeps one output-sized tensor (the softmax's gradient, made with the
    loss); the same loss on values taken as probabilities clips them, takes
    their logarithm and keeps the clipped values and the clip's two masks
    (an allocator trace of 8000-way token logits: 62.5 MiB each for the
    clipped values and the logarithm, 15.6 for each mask)."""
    import tensorflow as tf

    from .schedule import LossSpec

    try:  # a Loss by its class and configuration; a function by itself
        what = f"{type(fn).__module__}.{type(fn).__qualname__}:" + json.dumps(
            fn.get_config(), sort_keys=True, default=str)
    except Exception:
        what = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    key = f"{what}:{shape}:{dtype}:{sparse}"
    if key in _LOSS_CACHE:
        return _LOSS_CACHE[key]
    true_spec = (tf.TensorSpec(shape[:-1], tf.int32) if sparse
                 else tf.TensorSpec(shape, tf.float32))
    boundary: list[int] = []

    def step(y_true: Any, y_pred: Any) -> Any:
        with tf.GradientTape() as tape:
            tape.watch(y_pred)
            value = fn(y_true, y_pred)
            value = tf.reduce_mean(value)
        boundary.append(len(tf.compat.v1.get_default_graph().get_operations()))
        return tape.gradient(value, y_pred)

    graph = tf.function(step, autograph=False).get_concrete_function(
        true_spec, tf.TensorSpec(shape, dtype)).graph
    ops = graph.get_operations()
    split = boundary[0]
    forward, backward = _hoist_ready(ops[:split], ops[split:])
    pred = next(op.outputs[0] for op in ops if op.type == "Placeholder"
                and op.outputs[0].dtype.is_floating and tuple(op.outputs[0].shape) == shape)
    splat, constant, zeros = _constants(ops)
    spec = _loss_liveness(forward, backward, graph.outputs[0], pred,
                          functools.partial(LossSpec, constants=_fold(ops, splat, constant,
                                                                       zeros, graph.outputs)),
                          set(constant))
    _LOSS_CACHE[key] = spec
    return spec


def _hoist_ready(forward: list[Any], backward: list[Any]) -> tuple[list[Any], list[Any]]:
    """Gradient ops that read only forward tensors (a clip's masks) run with
    the forward ops, right after the last op they read, as TensorFlow's
    executor runs an op once its inputs are ready (see ``_hoist``)."""
    made = {op.name for op in forward}
    position = {op.name: i for i, op in enumerate(forward)}
    after: dict[int, list[Any]] = {}
    rest = []
    for op in backward:
        sources = [t.op for t in op.inputs] + list(op.control_inputs)
        if op.inputs and all(src.name in made for src in sources):
            at = max(position[src.name] for src in sources)
            after.setdefault(at, []).append(op)
            made.add(op.name)
            position[op.name] = at
        else:
            rest.append(op)
    ordered = []
    for i, op in enumerate(forward):
        ordered.append(op)
        ordered.extend(after.get(i, ()))
    return ordered, rest


#: Kernels that write their second output (the softmax's gradient) into their
#: first input (the logits) when nothing else reads it.
_XENT_OPS = {"SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"}


def _loss_liveness(forward: list[Any], backward: list[Any], gradient: Any, pred: Any,
                   make: Any, constant: set[str] = frozenset()) -> Any:
    """What the loss's ops hold as they run (see :func:`trace_loss`); the
    tensors named in ``constant`` are computed from constants and static
    shapes alone, which grappler folds before the step (``folded_constants``),
    and allocate nothing in it (one too large to fold, computed at every
    step, is taken as folded too)."""
    from .units import round_up

    base: dict[str, str] = {}  # a view's tensor -> the tensor owning its buffer

    def owner(t: Any) -> str:
        return base.get(t.name, t.name)

    def allocates(op: Any) -> bool:
        return (op.type not in VIEW_OPS and op.type not in SHAPE_ONLY_OPS - {"ZerosLike",
                                                                             "OnesLike"}
                and op.type not in ("Const", "NoOp") and bool(op.outputs)
                and not all(t.name in constant for t in op.outputs))

    for op in forward + backward:
        if op.type in VIEW_OPS - {"Placeholder"} and op.inputs:
            for t in op.outputs:
                base[t.name] = owner(op.inputs[0])
    forward_names = {t.name for op in forward for t in op.outputs if allocates(op)}
    kept = {owner(t) for op in backward for t in op.inputs
            if owner(t) in forward_names and op.type not in SHAPE_ONLY_OPS}
    readers: dict[str, int] = {}
    for op in forward + backward:
        if op.type in SHAPE_ONLY_OPS or not allocates(op):
            continue  # (a view's readers read its owner)
        for t in op.inputs:
            readers[owner(t)] = readers.get(owner(t), 0) + 1
    total = dict(readers)
    size: dict[str, int] = {}
    buffer_of: dict[str, str] = {}  # a tensor -> the tensor whose buffer it took
    # the output's own buffer (the model's), which a result may take over
    buffer_of[pred.name] = pred.name
    size[pred.name] = round_up(_bytes(pred))
    live = 0
    peak = {"forward": 0, "backward": 0}
    in_kept: str | None = None

    def run(ops: list[Any], phase: str) -> None:
        nonlocal live, in_kept
        for op in ops:
            if not allocates(op):
                continue
            for i, t in enumerate(op.outputs):
                n = round_up(_bytes(t)) if _bytes(t) else 0
                took = None
                forwards = ((i == 0 and op.type in FORWARDING_OPS | FORWARDING_GRAD_OPS)
                            or (i == 1 and op.type in _XENT_OPS))
                if forwards:
                    for x in (op.inputs[:1] if op.type in _XENT_OPS else op.inputs):
                        b = buffer_of.get(owner(x))
                        # in the forward ops an input's readers are ready at once
                        # (the hoisted ones too): written into only by its one reader
                        if (b is not None and readers.get(owner(x)) == 1
                                and (phase == "backward" or total[owner(x)] == 1)
                                and size.get(b) == n and (owner(x) not in kept
                                                         or phase == "backward")):
                            took = b
                            break
                if took is None:
                    size[t.name] = n
                    buffer_of[t.name] = t.name
                    live += n
                else:
                    buffer_of[t.name] = took
                    if phase == "backward" and took in kept and owner(gradient) == t.name:
                        in_kept = took
            peak[phase] = max(peak[phase], live)
            for t in op.outputs:  # a result nothing reads
                if not readers.get(t.name) and t.name != owner(gradient) \
                        and buffer_of.get(t.name) == t.name and size.get(t.name) \
                        and t.name != pred.name:
                    live -= size.pop(t.name)
            for x in op.inputs if op.type not in SHAPE_ONLY_OPS else ():
                name = owner(x)
                if name not in readers:
                    continue
                readers[name] -= 1
                b = buffer_of.get(name)
                if readers[name] == 0 and b is not None and (phase == "backward"
                                                             or name not in kept):
                    holders = [k for k, v in buffer_of.items() if v == b
                               and readers.get(k, 0) > 0]
                    if not holders and size.get(b) and b != pred.name:
                        live -= size.pop(b)

    run(forward, "forward")
    reused = any(buffer_of.get(k) == pred.name for k in kept)
    saved = sum(size.get(buffer_of[k], 0) for k in kept
                if k in buffer_of and buffer_of[k] != pred.name)
    run(backward, "backward")
    grad_bytes = round_up(_bytes(gradient))
    if in_kept is None:
        # follow the gradient's buffer back through in-place writes
        b = buffer_of.get(owner(gradient))
        if b in {buffer_of.get(k) for k in kept}:
            in_kept = b
    if reused:  # the output's buffer is held and becomes its gradient
        return make(saved_bytes=saved, workspace_bytes=max(0, peak["forward"] - saved),
                    gradient_bytes=grad_bytes,
                    backward_bytes=max(0, peak["backward"] - saved),
                    gradient_in_saved=False, output_reused=True)
    return make(saved_bytes=saved,
                workspace_bytes=max(0, peak["forward"] - saved),
                gradient_bytes=grad_bytes,
                backward_bytes=max(0, peak["backward"] - saved
                                   - (0 if in_kept else grad_bytes)),
                gradient_in_saved=in_kept is not None)
