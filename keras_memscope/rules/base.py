"""Building blocks for cost rules: a prim builder and activation semantics.

Rules state, op by op, what TensorFlow's gradient of the op needs (and so keeps
alive), which buffers it may reuse, and how many multiply-accumulates it does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..graph import CallRecord, TensorInfo
from ..ir import Prim, prim
from ..units import dtype_bytes

Rule = Callable[[CallRecord], list[Prim]]

_IO_REF = re.compile(r"^(in|out)\d+$")

#: In ``save``/``save_for`` of :meth:`Builder.add`: the prim's own output.
OUT = "__OUT__"


class Builder:
    """Accumulates prims for one call and names its outputs ``out0``...

    Every ``add`` returns fresh local references; ``finish(refs)`` renames the
    given references to the call's outputs.
    """

    def __init__(self, call: CallRecord) -> None:
        self.call = call
        self.prims: list[Prim] = []
        self._n = 0

    def ref(self, stem: str) -> str:
        self._n += 1
        return f"{stem}.{self._n}"

    def add(
        self,
        name: str,
        inputs: Sequence[str],
        outputs: Sequence[int] | int,
        **kwargs: Any,
    ) -> list[str]:
        sizes = [outputs] if isinstance(outputs, int) else list(outputs)
        refs = [self.ref(name) for _ in sizes]
        # OUT in what a prim saves stands for its own first output.
        if "save" in kwargs:
            kwargs["save"] = [refs[0] if x == OUT else x for x in kwargs["save"]]
        for key in ("output_pieces", "grad_forwards"):
            if key in kwargs:
                given = kwargs[key]
                items = given.items() if isinstance(given, dict) else given
                kwargs[key] = [(refs[0] if k == OUT else k, v) for k, v in items]
        if "save_for" in kwargs:
            given = kwargs["save_for"]
            items = given.items() if isinstance(given, dict) else given
            kwargs["save_for"] = [
                (k, tuple(refs[0] if x == OUT else x for x in v)) for k, v in items
            ]
        self.prims.append(prim(name, inputs, list(zip(refs, sizes)), **kwargs))
        return refs

    def add1(self, name: str, inputs: Sequence[str], nbytes: int, **kwargs: Any) -> str:
        return self.add(name, inputs, nbytes, **kwargs)[0]

    def finish(self, refs: Sequence[str]) -> list[Prim]:
        rename: dict[str, str] = {}
        for i, ref in enumerate(refs):
            if _IO_REF.match(ref) or ref.startswith("w:") or ref in rename:
                # The output is an input (or repeats one): a view of it.
                self.prims.append(
                    prim("view", [ref], [(f"out{i}", self.call.outputs[i].nbytes)], alias=True)
                )
            else:
                rename[ref] = f"out{i}"
        return [p.renamed(rename) for p in self.prims]


def elements(t: TensorInfo) -> int:
    return math.prod(t.shape)


def bytes_as(t: TensorInfo, dtype: str) -> int:
    return elements(t) * dtype_bytes(dtype)


def weight_ref(call: CallRecord, suffix: str) -> str | None:
    """The ``w:`` reference of the call's weight whose name or path ends with suffix."""
    for w in call.weights:
        if w.name == suffix or w.name.endswith("/" + suffix):
            return f"w:{w.name}"
    return None


def weight_info(call: CallRecord, ref: str) -> Any:
    name = ref[2:]
    for w in call.weights:
        if w.name == name:
            return w
    raise KeyError(ref)


def read_weight(b: Builder, ref: str | None, compute_dtype: str) -> str | None:
    """A weight as the layer's compute dtype sees it.

    Under a mixed policy Keras casts each variable to the compute dtype on every
    call: a half-precision copy that the gradient of the consuming op keeps.
    """
    if ref is None:
        return None
    w = weight_info(b.call, ref)
    if w.dtype == compute_dtype or dtype_bytes(w.dtype) == dtype_bytes(compute_dtype):
        return ref
    n = w.nbytes // dtype_bytes(w.dtype) * dtype_bytes(compute_dtype)
    return b.add1("cast", [ref], n)


# --- activations --------------------------------------------------------------

# How TensorFlow's gradient of each activation works: "out" keeps the output
# (ReluGrad, SigmoidGrad, TanhGrad, EluGrad, SoftmaxGrad), "in" keeps the
# input, "in+out" both. Element-wise kernels may write into their input.
_ACTIVATION_KIND = {
    "relu": "out",
    "relu6": "out",
    "elu": "out",
    "selu": "out",
    "sigmoid": "out",
    "tanh": "out",
    "exponential": "out",
    "softmax": "out-new",
    "log_softmax": "out-new",
    "softplus": "in",
    "softsign": "in",
    "leaky_relu": "in",
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "hard_sigmoid": "in",
    "hard_silu": "in+out",
    "hard_swish": "in+out",
    "mish": "mish",
    "linear": "none",
}


def activation_name(fn: Any) -> str:
    """Canonical name of a Keras activation function, by identity."""
    if fn is None:
        return "linear"
    import keras

    for name in _ACTIVATION_KIND:
        try:
            if keras.activations.get(name) is fn:
                return name
        except (ValueError, TypeError):
            continue
    return getattr(fn, "__name__", "unknown")


def apply_activation(b: Builder, name: str, src: str, nbytes: int) -> str:
    """Append the prims of activation ``name`` applied to ``src`` (their role
    is ``"activation"``)."""
    first = len(b.prims)
    try:
        return _activation_prims(b, name, src, nbytes)
    finally:
        b.prims[first:] = [Prim(**{**p.__dict__, "role": "activation"})
                           for p in b.prims[first:]]


def _activation_prims(b: Builder, name: str, src: str, nbytes: int) -> str:
    kind = _ACTIVATION_KIND.get(name, "unknown")
    n_el = nbytes  # element-wise: every intermediate has the input's size
    if kind == "none":
        return src
    if kind == "out":
        return b.add1(name, [src], n_el, inplace=[src],
                      grad_inplace=True, save_for=[(src, (OUT,))])
    if kind == "out-new":
        return b.add1(name, [src], n_el, save_for=[(src, (OUT,))],
                      backward_workspace_bytes=n_el)
    if kind == "in":
        return b.add1(name, [src], n_el, save_for=[(src, (src,))], inplace=[src],
                      grad_inplace=True)
    if kind == "in+out":
        return b.add1(name, [src], n_el, save_for=[(src, (src, OUT))])
    if kind == "silu":
        # tf.nn.silu's custom gradient keeps the input and recomputes sigmoid.
        return b.add1(name, [src], n_el, save_for=[(src, (src,))],
                      backward_workspace_bytes=n_el)
    if kind == "gelu":
        # tf.nn.gelu: 0.5 * x * (1 + erf(x / sqrt(2))) (approximate=False) or the
        # tanh form; the products and the erf/tanh keep three x-sized tensors.
        half = b.add1("gelu.half_x", [src], n_el)
        scaled = b.add1("gelu.scale", [src], n_el)
        erf = b.add1("gelu.erf", [scaled], n_el, save_for=[(scaled, (scaled,))])
        one_plus = b.add1("gelu.add", [erf], n_el, inplace=[erf], grad_inplace=True)
        return b.add1("gelu.mul", [half, one_plus], n_el,
                      save_for=[(half, (one_plus,)), (one_plus, (half,))])
    if kind == "mish":
        sp = b.add1("mish.softplus", [src], n_el, save_for=[(src, (src,))])
        th = b.add1("mish.tanh", [sp], n_el, save_for=[(sp, (OUT,))])
        return b.add1("mish.mul", [src, th], n_el, save_for=[(src, (th,)), (th, (src,))])
    # Unknown activation: assume its gradient keeps input and output.
    return b.add1(name, [src], n_el, save_for=[(src, (src, OUT))])
