"""Dense, einsum, embedding, activation, dropout, reshaping and scaling rules."""

from __future__ import annotations

import math

import keras

from ..graph import CallRecord
from ..ir import Prim, matmul_upcast
from ..units import dtype_bytes
from . import register
from .base import (
    OUT,
    Builder,
    activation_name,
    apply_activation,
    read_weight,
    weight_info,
    weight_ref,
)


def compute_dtype(call: CallRecord) -> str:
    if call.outputs:
        return call.outputs[0].dtype
    return "float32"


def linear_prims(
    b: Builder,
    x: str,
    kernel: str | None,
    bias: str | None,
    out_bytes: int,
    macs: int,
    dtype: str,
    name: str = "matmul",
    gemm_min_dim: int = 0,
    fusable: bool = False,
) -> str:
    """``x @ kernel + bias``: the matmul keeps x for the kernel gradient and the
    kernel for the input gradient; the bias add keeps nothing and runs in place.
    ``fusable``: grappler fuses the matmul with the bias add (a 2-D input)."""
    k = read_weight(b, kernel, dtype)
    if k is None:
        raise ValueError(f"{b.call.class_name} {b.call.name!r} has no kernel weight")
    family = "conv" if "conv" in name else "matmul"
    upcast: dict[str, object] = {}
    if family == "matmul" and out_bytes and macs:
        # (rows x depth) @ (depth x n): macs = rows depth n, out = rows n elements
        w = weight_info(b.call, kernel)
        out_elements = out_bytes // dtype_bytes(dtype)
        depth = max(1, macs // max(1, out_elements))
        x_elements = macs // max(1, (w.nbytes // dtype_bytes(w.dtype)) // depth)
        upcast = matmul_upcast(dtype, (x, x_elements),
                               (k, w.nbytes // dtype_bytes(w.dtype)), out_elements,
                               fused_bias=fusable and bias is not None)
    z = b.add1(name, [x, k], out_bytes, save_for={x: (k,), k: (x,)}, macs=macs, kernel=family,
               gemm_min_dim=gemm_min_dim, **upcast)
    if bias is not None:
        bb = read_weight(b, bias, dtype)
        z = b.add1("bias_add", [z, bb], out_bytes, inplace=[z], grad_inplace=True)
    return z


@register(keras.layers.Dense)
def dense(call: CallRecord) -> list[Prim]:
    """Dense: ``act(x @ W + b)``; forward MACs = elements(out) x in_features."""
    b = Builder(call)
    x, out = call.inputs[0], call.outputs[0]
    in_features = x.shape[-1]
    macs = math.prod(out.shape) * in_features
    dtype = compute_dtype(call)
    rows = math.prod(x.shape[:-1])
    z = linear_prims(b, "in0", weight_ref(call, "kernel"), weight_ref(call, "bias"),
                     out.nbytes, macs, dtype, gemm_min_dim=min(rows, in_features, out.shape[-1]),
                     fusable=len(x.shape) == 2)
    z = apply_activation(b, activation_name(getattr(call.layer, "activation", None)), z,
                         out.nbytes)
    return b.finish([z])


def einsum_macs(equation: str, shapes: list[tuple[int, ...]]) -> int:
    """Multiply-accumulates of an einsum: the product of every index's size."""
    lhs = equation.split("->")[0]
    operands = lhs.split(",")
    sizes: dict[str, int] = {}
    for spec, shape in zip(operands, shapes):
        spec = spec.strip()
        if "..." in spec:
            n_ell = len(shape) - (len(spec) - 3)
            spec = spec.replace("...", "".join(chr(0x100 + i) for i in range(n_ell)))
        for letter, dim in zip(spec, shape):
            sizes[letter] = max(sizes.get(letter, 1), int(dim))
    return math.prod(sizes.values())


@register(keras.layers.EinsumDense)
def einsum_dense(call: CallRecord) -> list[Prim]:
    """EinsumDense: like Dense; MACs = product of all index sizes of the equation."""
    b = Builder(call)
    kernel = weight_ref(call, "kernel")
    kshape = tuple(call.layer.kernel.shape)
    macs = einsum_macs(call.layer.equation, [call.inputs[0].shape, kshape])
    out = call.outputs[0]
    # as a matmul: rows = the input's elements per contracted vector
    contracted = max(1, macs // max(math.prod(out.shape), 1))
    rows = max(1, math.prod(call.inputs[0].shape) // contracted)
    cols = max(1, math.prod(out.shape) // rows)
    z = linear_prims(b, "in0", kernel, weight_ref(call, "bias"), out.nbytes, macs,
                     compute_dtype(call), name="einsum",
                     gemm_min_dim=min(rows, contracted, cols))
    z = apply_activation(b, activation_name(getattr(call.layer, "activation", None)), z,
                         out.nbytes)
    return b.finish([z])


@register(keras.layers.Embedding)
def embedding(call: CallRecord) -> list[Prim]:
    """Embedding: a gather. Its gradient is IndexedSlices, one row per
    looked-up id: the output gradient itself, which the optimizer's update
    densifies as its code does (``optimizers.sparse_update``)."""
    b = Builder(call)
    out = call.outputs[0]
    table = weight_ref(call, "embeddings")
    if table is None:
        return fallback(call)
    t = read_weight(b, table, compute_dtype(call))
    z = b.add1("gather", ["in0", t], out.nbytes, differentiable=[t],
               sparse_grad=[t] if t == table else [])
    return b.finish([z])


def _activation_layer(call: CallRecord, name: str) -> list[Prim]:
    b = Builder(call)
    z = apply_activation(b, name, "in0", call.outputs[0].nbytes)
    return b.finish([z])


@register(keras.layers.Activation)
def activation(call: CallRecord) -> list[Prim]:
    """Activation(fn): the semantics of fn (see ``rules.base``)."""
    return _activation_layer(call, activation_name(call.layer.activation))


@register(keras.layers.ReLU)
def relu_layer(call: CallRecord) -> list[Prim]:
    """ReLU (also with max_value/negative_slope): keeps its output."""
    layer = call.layer
    plain = not getattr(layer, "negative_slope", 0) and not getattr(layer, "threshold", 0)
    return _activation_layer(call, "relu" if plain else "leaky_relu")


@register(keras.layers.Softmax)
def softmax_layer(call: CallRecord) -> list[Prim]:
    """Softmax: keeps its output; a new buffer (the kernel does not write in place)."""
    return _activation_layer(call, "softmax")


@register(keras.layers.ELU)
def elu_layer(call: CallRecord) -> list[Prim]:
    return _activation_layer(call, "elu")


@register(keras.layers.LeakyReLU)
def leaky_relu_layer(call: CallRecord) -> list[Prim]:
    return _activation_layer(call, "leaky_relu")


@register(keras.layers.PReLU)
def prelu(call: CallRecord) -> list[Prim]:
    """PReLU: ``max(x, 0) + alpha * min(x, 0)``: keeps x and its negative part."""
    b = Builder(call)
    n = call.outputs[0].nbytes
    alpha = weight_ref(call, "alpha")
    pos = b.add1("relu", ["in0"], n, save_for={"in0": (OUT,)})
    neg = b.add1("neg_part", ["in0"], n, save_for={"in0": ("in0",)})
    scaled = b.add1("mul", [neg, alpha], n, save_for={neg: (alpha,), alpha: (neg,)})
    z = b.add1("add", [pos, scaled], n, inplace=[pos, scaled], grad_inplace=True)
    return b.finish([z])


@register(keras.layers.Dropout)
def dropout(call: CallRecord) -> list[Prim]:
    """Dropout (training): ``where(uniform >= rate, x * scale, 0)``.

    The uniform draw is transient; the boolean keep-mask (1 byte per element)
    is what the gradient keeps.
    """
    rate = float(getattr(call.layer, "rate", 0.0))
    b = Builder(call)
    if rate <= 0.0:
        return b.finish(["in0"])
    x, out = call.inputs[0], call.outputs[0]
    n_el = math.prod(x.shape)
    noise_shape = getattr(call.layer, "noise_shape", None)
    noise_el = n_el
    if noise_shape is not None:
        noise_el = math.prod(d if d is not None else x.shape[i] for i, d in enumerate(noise_shape))
    noise_el = _noise_elements(call, noise_el)
    rnd = b.add1("uniform", [], noise_el * dtype_bytes(x.dtype), differentiable=[])
    mask = b.add1("keep_mask", [rnd], noise_el, differentiable=[])
    scaled = b.add1("scale", ["in0"], x.nbytes, inplace=["in0"], grad_inplace=True)
    z = b.add1("select", [mask, scaled], out.nbytes, differentiable=[scaled],
               save_for={scaled: (mask,)}, inplace=[scaled], grad_inplace=True)
    return b.finish([z])


def _noise_elements(call: CallRecord, default: int) -> int:
    """Spatial dropout draws one value per (sample, channel)."""
    spatial = (keras.layers.SpatialDropout1D, keras.layers.SpatialDropout2D,
               keras.layers.SpatialDropout3D)
    if isinstance(call.layer, spatial):
        shape = call.inputs[0].shape
        fmt = getattr(call.layer, "data_format", "channels_last")
        channels = shape[1] if fmt == "channels_first" else shape[-1]
        return shape[0] * channels
    return default


@register(keras.layers.GaussianDropout, keras.layers.GaussianNoise)
def gaussian_noise(call: CallRecord) -> list[Prim]:
    """GaussianDropout multiplies by noise (kept for the gradient);
    GaussianNoise adds it (nothing kept)."""
    b = Builder(call)
    rate = float(getattr(call.layer, "rate", getattr(call.layer, "stddev", 0.0)))
    if rate <= 0.0:
        return b.finish(["in0"])
    n = call.inputs[0].nbytes
    noise = b.add1("normal", [], n, differentiable=[])
    if isinstance(call.layer, keras.layers.GaussianDropout):
        z = b.add1("mul", ["in0", noise], n, differentiable=["in0"],
                   save_for={"in0": (noise,)})
    else:
        z = b.add1("add", ["in0", noise], n, differentiable=["in0"],
                   inplace=["in0", noise], grad_inplace=True)
    return b.finish([z])


@register(keras.layers.AlphaDropout)
def alpha_dropout(call: CallRecord) -> list[Prim]:
    """AlphaDropout: ``a * where(mask, x, alpha_p) + b``: keeps the mask."""
    b = Builder(call)
    if float(getattr(call.layer, "rate", 0.0)) <= 0.0:
        return b.finish(["in0"])
    x = call.inputs[0]
    n_el = math.prod(x.shape)
    rnd = b.add1("uniform", [], x.nbytes, differentiable=[])
    mask = b.add1("keep_mask", [rnd], n_el, differentiable=[])
    sel = b.add1("select", [mask, "in0"], x.nbytes, differentiable=["in0"],
                 save_for={"in0": (mask,)})
    z = b.add1("affine", [sel], x.nbytes, inplace=[sel], grad_inplace=True)
    return b.finish([z])


@register(keras.layers.Reshape, keras.layers.Flatten, keras.layers.Identity)
def view(call: CallRecord) -> list[Prim]:
    """Reshape, Flatten, Identity: a view of the input, no memory."""
    return Builder(call).finish(["in0"])


def _copy(call: CallRecord, name: str) -> list[Prim]:
    b = Builder(call)
    z = b.add1(name, ["in0"], call.outputs[0].nbytes)
    return b.finish([z])


@register(keras.layers.Permute)
def permute(call: CallRecord) -> list[Prim]:
    """Permute: a transpose copies; its gradient is another transpose."""
    return _copy(call, "transpose")


@register(keras.layers.RepeatVector)
def repeat_vector(call: CallRecord) -> list[Prim]:
    """RepeatVector: a tiled copy; the gradient sums the copies."""
    return _copy(call, "tile")


@register(keras.layers.ZeroPadding1D, keras.layers.ZeroPadding2D, keras.layers.ZeroPadding3D)
def zero_padding(call: CallRecord) -> list[Prim]:
    """ZeroPadding: a padded copy; the gradient is a slice."""
    return _copy(call, "pad")


@register(keras.layers.Cropping1D, keras.layers.Cropping2D, keras.layers.Cropping3D)
def cropping(call: CallRecord) -> list[Prim]:
    """Cropping: a sliced copy; the gradient pads back to the input size."""
    return _copy(call, "slice")


@register(keras.layers.UpSampling1D, keras.layers.UpSampling2D, keras.layers.UpSampling3D)
def upsampling(call: CallRecord) -> list[Prim]:
    """UpSampling: repeats along each spatial axis (one copy per axis for the
    nearest mode); the gradient sums back to the input size."""
    b = Builder(call)
    x, out = call.inputs[0], call.outputs[0]
    ratio = out.nbytes // max(x.nbytes, 1)
    ws = 0
    if ratio >= 4:  # two repeats: the first result is transient
        ws = x.nbytes * int(math.isqrt(ratio))
    z = b.add1("repeat", ["in0"], out.nbytes, forward_workspace_bytes=ws,
               backward_workspace_bytes=ws)
    return b.finish([z])


@register(keras.layers.Rescaling, keras.layers.Normalization)
def affine_elementwise(call: CallRecord) -> list[Prim]:
    """Rescaling and Normalization: ``x * scale + offset``, element-wise, in place
    when possible; constant parameters keep nothing for the gradient."""
    b = Builder(call)
    x = call.inputs[0]
    n = call.outputs[0].nbytes
    src = "in0"
    if x.dtype != call.outputs[0].dtype:
        src = b.add1("cast", ["in0"], n)
    z = b.add1("affine", [src], n, inplace=[src], grad_inplace=True)
    return b.finish([z])


def fallback(call: CallRecord) -> list[Prim]:
    """Unknown layer: its outputs are new buffers, kept for the backward pass
    together with its inputs; its weights get gradients."""
    b = Builder(call)
    ins = [f"in{i}" for i in range(len(call.inputs))] + [f"w:{w.name}" for w in call.weights]
    if not call.outputs:
        return []
    refs = b.add("unknown", ins, [o.nbytes for o in call.outputs],
                 save=[f"in{i}" for i in range(len(call.inputs))] + [OUT])
    # every output is kept, not only the first
    p = b.prims[-1]
    b.prims[-1] = Prim(**{**p.__dict__, "save": tuple(dict.fromkeys((*p.save, *refs)))})
    return b.finish(refs)
