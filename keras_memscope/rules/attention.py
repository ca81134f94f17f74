"""Attention rules.

MultiHeadAttention on TensorFlow projects query, key and value with
EinsumDense layers, then (without dropout on the scores) calls
``dot_product_attention``: an ``Einsum`` for the logits, a float32 softmax, and
an ``Einsum`` with the values. TensorFlow's Einsum gradient reads the einsum's
own inputs, so q, k, v and the softmax probabilities (batch x heads x
query_len x key_len) stay alive until the backward pass; the Einsum kernel's
transposed operand copies are transient. With dropout on the scores, Keras
takes the explicit path that also keeps the dropout mask.
"""

from __future__ import annotations

import math

import keras

from ..graph import CallRecord
from ..ir import Prim
from ..units import dtype_bytes
from . import register
from .base import OUT, Builder, weight_ref
from .core import compute_dtype, einsum_macs, linear_prims


def _proj(b: Builder, call: CallRecord, name: str, src: str, src_shape: tuple[int, ...],
          out_shape: tuple[int, ...], dtype: str) -> str:
    layer = getattr(call.layer, f"_{name}_dense")
    kshape = tuple(layer.kernel.shape)
    macs = einsum_macs(layer.equation, [src_shape, kshape])
    nbytes = math.prod(out_shape) * dtype_bytes(dtype)
    bias = weight_ref(call, f"{name}/bias")
    return linear_prims(b, src, weight_ref(call, f"{name}/kernel"), bias, nbytes, macs, dtype,
                        name=f"{name}_einsum")


@register(keras.layers.MultiHeadAttention)
def multi_head_attention(call: CallRecord) -> list[Prim]:
    """MultiHeadAttention: MACs = projections + ``B x N x T x S x (H + Hv)`` for
    the scores and the weighted sum; keeps q, k, v, the probabilities, the
    context and the projection inputs."""
    layer = call.layer
    dtype = compute_dtype(call)
    item = dtype_bytes(dtype)
    q_in = call.inputs[0]
    v_in = call.inputs[1] if len(call.inputs) > 1 else q_in
    k_ref = "in1"
    key = call.kwargs.get("key")
    if key is not None and len(call.inputs) > 2:
        k_ref, k_in = "in2", call.inputs[2]
    else:
        k_in = v_in
    if len(call.inputs) == 1:
        k_ref = "in0"
    v_ref = "in1" if len(call.inputs) > 1 else "in0"
    n = int(layer.num_heads)
    h = int(layer.key_dim)
    hv = int(layer.value_dim or layer.key_dim)
    batch, t = q_in.shape[0], math.prod(q_in.shape[1:-1])
    s = math.prod(k_in.shape[1:-1])
    b = Builder(call)
    q = _proj(b, call, "query", "in0", q_in.shape, (batch, t, n, h), dtype)
    k = _proj(b, call, "key", k_ref, k_in.shape, (batch, s, n, h), dtype)
    v = _proj(b, call, "value", v_ref, v_in.shape, (batch, s, n, hv), dtype)
    q_bytes, k_bytes = batch * t * n * h * item, batch * s * n * h * item
    v_bytes = batch * s * n * hv * item
    scores = batch * n * t * s
    s_bytes = scores * item
    s32 = scores * 4
    ctx_bytes = batch * t * n * hv * item
    dropout = float(getattr(layer, "_dropout", 0.0) or 0.0)
    if dropout > 0.0:
        q = b.add1("scale_query", [q], q_bytes, inplace=[q], grad_inplace=True)
    logits = b.add1("scores_einsum", [q, k], s_bytes, save_for={q: (k,), k: (q,)},
                    forward_workspace_bytes=q_bytes + k_bytes,
                    backward_workspace_bytes=q_bytes + k_bytes, macs=scores * h)
    if item != 4:
        logits = b.add1("cast", [logits], s32)
    if dropout == 0.0:
        logits = b.add1("scale", [logits], s32 if item != 4 else s_bytes, inplace=[logits],
                        grad_inplace=True)
    probs = b.add1("softmax", [logits], s32 if item != 4 else s_bytes, save_for={logits: (OUT,)},
                   backward_workspace_bytes=s32)
    if item != 4:
        probs = b.add1("cast", [probs], s_bytes)
    if dropout > 0.0:
        rnd = b.add1("uniform", [], s_bytes, differentiable=[])
        mask = b.add1("keep_mask", [rnd], scores, differentiable=[])
        probs = b.add1("dropout", [mask, probs], s_bytes, differentiable=[probs],
                       save_for={probs: (mask,)})
    ctx = b.add1("context_einsum", [probs, v], ctx_bytes, save_for={probs: (v,), v: (probs,)},
                 forward_workspace_bytes=v_bytes + ctx_bytes,
                 backward_workspace_bytes=v_bytes + ctx_bytes, macs=scores * hv)
    out_layer = layer._output_dense
    out = call.outputs[0]
    z = linear_prims(b, ctx, weight_ref(call, "attention_output/kernel"),
                     weight_ref(call, "attention_output/bias"), out.nbytes,
                     einsum_macs(out_layer.equation,
                                 [(batch, t, n, hv), tuple(out_layer.kernel.shape)]),
                     dtype, name="output_einsum")
    outs = [z]
    for extra in call.outputs[1:]:  # return_attention_scores
        outs.append(probs if extra.nbytes == s_bytes else b.add1("scores", [probs], extra.nbytes))
    return b.finish(outs)


@register(keras.layers.Attention)
def dot_attention(call: CallRecord) -> list[Prim]:
    """Attention (Luong): ``softmax(q k^T) v``; keeps q, k, v and the
    probabilities; MACs = ``B x T x S x (D + Dv)``."""
    b = Builder(call)
    q = call.inputs[0]
    v = call.inputs[1] if len(call.inputs) > 1 else q
    k_ref = "in2" if len(call.inputs) > 2 else ("in1" if len(call.inputs) > 1 else "in0")
    v_ref = "in1" if len(call.inputs) > 1 else "in0"
    batch, t, d = q.shape[0], q.shape[-2], q.shape[-1]
    s, dv = v.shape[-2], v.shape[-1]
    item = dtype_bytes(q.dtype)
    s_bytes = batch * t * s * item
    logits = b.add1("scores_matmul", ["in0", k_ref], s_bytes,
                    save_for={"in0": (k_ref,), k_ref: ("in0",)}, macs=batch * t * s * d)
    probs = b.add1("softmax", [logits], s_bytes, save_for={logits: (OUT,)},
                   backward_workspace_bytes=s_bytes)
    ctx = b.add1("context_matmul", [probs, v_ref], call.outputs[0].nbytes,
                 save_for={probs: (v_ref,), v_ref: (probs,)}, macs=batch * t * s * dv)
    outs = [ctx] + [probs for _ in call.outputs[1:]]
    return b.finish(outs)


@register(keras.layers.AdditiveAttention)
def additive_attention(call: CallRecord) -> list[Prim]:
    """AdditiveAttention (Bahdanau): ``sum(scale * tanh(q + k))`` builds a
    ``B x T x S x D`` tensor whose tanh output is kept."""
    b = Builder(call)
    q = call.inputs[0]
    v = call.inputs[1] if len(call.inputs) > 1 else q
    k_ref = "in2" if len(call.inputs) > 2 else ("in1" if len(call.inputs) > 1 else "in0")
    v_ref = "in1" if len(call.inputs) > 1 else "in0"
    batch, t, d = q.shape[0], q.shape[-2], q.shape[-1]
    s, dv = v.shape[-2], v.shape[-1]
    item = dtype_bytes(q.dtype)
    big = batch * t * s * d * item
    summed = b.add1("broadcast_add", ["in0", k_ref], big)
    th = b.add1("tanh", [summed], big, inplace=[summed], save_for={summed: (OUT,)})
    logits = b.add1("reduce_sum", [th], batch * t * s * item, backward_workspace_bytes=big)
    probs = b.add1("softmax", [logits], batch * t * s * item, save_for={logits: (OUT,)})
    ctx = b.add1("context_matmul", [probs, v_ref], call.outputs[0].nbytes,
                 save_for={probs: (v_ref,), v_ref: (probs,)}, macs=batch * t * s * dv)
    return b.finish([ctx] + [probs for _ in call.outputs[1:]])
