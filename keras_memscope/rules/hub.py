"""Rules for keras_hub layers, registered when keras_hub has been imported.

Importing keras_hub takes seconds, so these are only looked at when the user
has already imported it (their model then uses it).
"""

from __future__ import annotations

import math
import sys

from ..graph import CallRecord
from ..ir import Prim
from .base import OUT, Builder, weight_ref

_DONE = False


def rms_layer_norm(call: CallRecord) -> list[Prim]:
    """keras_hub RMS layer norms (``x * rsqrt(mean(x^2) + eps) * scale`` in
    float32): keeps the float32 input, the per-row inverse and the normalized
    tensor."""
    b = Builder(call)
    x = call.inputs[0]
    n32 = math.prod(x.shape) * 4
    src = b.add1("cast", ["in0"], n32) if x.dtype != "float32" else "in0"
    rows = math.prod(x.shape[:-1])
    inv = b.add1("rsqrt_mean_square", [src], rows * 4, save_for={src: (src, OUT)},
                 forward_workspace_bytes=n32, backward_workspace_bytes=n32, passes=2,
                 kernel="reduce")
    normed = b.add1("normalize", [src, inv], n32, save_for={src: (inv,), inv: (src,)},
                    backward_workspace_bytes=n32)
    scale = weight_ref(call, "scale")
    z = normed
    if scale:
        z = b.add1("scale", [normed, scale], n32,
                   save_for={normed: (scale,), scale: (normed,)})
    out = call.outputs[0]
    if out.nbytes != n32:
        z = b.add1("cast", [z], out.nbytes)
    return b.finish([z])


def rotary_embedding(call: CallRecord) -> list[Prim]:
    """RotaryEmbedding: ``x * cos + rotate_half(x) * sin``: the cos/sin tables
    (sequence x features) are computed once, the rotated copy is transient; the
    products keep the tables (small) and nothing of the input's size."""
    b = Builder(call)
    x, out = call.inputs[0], call.outputs[0]
    seq_features = x.nbytes // max(x.shape[0], 1)
    tables = b.add1("cos_sin", [], 2 * seq_features, differentiable=[])
    rotated = b.add1("rotate_half", ["in0"], x.nbytes)
    z = b.add1("rotary", ["in0", rotated, tables], out.nbytes, differentiable=["in0", rotated],
               save_for={"in0": (tables,), rotated: (tables,)}, flops=4 * out.nbytes // 4)
    return b.finish([z])


def register_hub_rules(register: object) -> None:
    """Register the rules above for keras_hub's classes, if keras_hub is loaded."""
    global _DONE
    if _DONE or "keras_hub" not in sys.modules:
        return
    _DONE = True
    try:
        from keras_hub.src.layers.modeling.rotary_embedding import RotaryEmbedding
    except ImportError:
        return
    register(RotaryEmbedding)(rotary_embedding)  # type: ignore[operator]
    for module, name in (
        ("keras_hub.src.models.llama.llama_layernorm", "LlamaLayerNorm"),
        ("keras_hub.src.models.mistral.mistral_layer_norm", "MistralLayerNormalization"),
        ("keras_hub.src.models.gemma.rms_normalization", "RMSNormalization"),
        ("keras_hub.src.models.qwen.qwen_layernorm", "QwenLayerNorm"),
    ):
        try:
            cls = getattr(__import__(module, fromlist=[name]), name)
        except (ImportError, AttributeError):
            continue
        register(cls)(rms_layer_norm)  # type: ignore[operator]
