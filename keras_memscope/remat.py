"""Rematerialization: which prims a training step recomputes.

Keras' ``RematScope`` modes, as Keras applies them to each layer built inside
the scope (``Layer.rematerialized_call``), each wrapping with
``tf.recompute_grad``:

* ``"full"``: every layer's whole call;
* ``"activations"``: only the activation function of layers that have one
  (``Dense(..., activation="gelu")``);
* ``"larger_than"``: layers whose output has more elements than the threshold;
* ``"list_of_layers"``: the named layers.

On TensorFlow inside ``fit()`` only ``"activations"`` works today; the others
fail ("custom_gradient ... keyword arguments only when eager", keras#21207).

``"checkpoints"`` is checkpointing in the style of Chen et al. 2016: the
sequence of layer calls is cut into segments (about the square root of their
number, or as many as asked); only each segment's inputs are kept and the
segment is recomputed before its gradients.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from .ir import LayerOp

KERAS_MODES = ("full", "activations", "larger_than", "list_of_layers")
FAILS_IN_FIT_ON_TF = ("full", "larger_than", "list_of_layers")


@dataclasses.dataclass(frozen=True)
class RematSpec:
    """What to recompute: a Keras mode, or checkpointed segments."""

    mode: str
    output_size_threshold: int = 1024
    layer_names: tuple[str, ...] = ()
    segments: int | None = None

    def describe(self) -> str:
        if self.mode == "checkpoints":
            return f"checkpoints ({self.segments or 'sqrt(n)'} segments)"
        if self.mode == "larger_than":
            return f"larger_than {self.output_size_threshold}"
        if self.mode == "list_of_layers":
            return "list_of_layers " + ", ".join(self.layer_names)
        return self.mode


def parse_remat(remat: Any) -> RematSpec | None:
    """A spec from ``"activations"``, ``"checkpoints"``, an int (segments), a
    dict of ``RematScope`` arguments, or a ``keras.RematScope``."""
    if remat is None or remat is False:
        return None
    if isinstance(remat, RematSpec):
        return remat
    if isinstance(remat, bool):
        raise TypeError("remat=True is ambiguous: name a mode, e.g. remat='activations'")
    if isinstance(remat, int):
        if remat < 1:
            raise ValueError(f"remat segments must be positive, got {remat}")
        return RematSpec("checkpoints", segments=remat)
    if isinstance(remat, str):
        if remat in ("checkpoints", "sqrt"):
            return RematSpec("checkpoints")
        if remat in KERAS_MODES:
            return RematSpec(remat)
        raise ValueError(f"unknown remat mode {remat!r}: use one of "
                         f"{', '.join(KERAS_MODES)}, 'checkpoints' or a number of segments")
    if isinstance(remat, dict) or hasattr(remat, "mode"):
        get = remat.get if isinstance(remat, dict) else (lambda k, d=None: getattr(remat, k, d))
        mode = get("mode")
        if mode not in KERAS_MODES:
            raise ValueError(f"unknown remat mode {mode!r}")
        return RematSpec(mode, int(get("output_size_threshold", 1024) or 1024),
                         tuple(get("layer_names", ()) or ()))
    raise TypeError(f"cannot use {remat!r} as remat=")


def activation_blockers(model: Any, scoped_only: bool = False) -> list[str]:
    """Layers of ``model`` on which Keras' RematScope ``"activations"`` fails:
    Keras recomputes a layer's activation by assigning a wrapped function to
    ``layer.activation`` for the call, and where that is a read-only property
    (LSTM, GRU, SimpleRNN, ConvLSTM: their cell's activation) the first call
    in training raises ``AttributeError`` ("property 'activation' ... has no
    setter"). ``scoped_only``: only the layers built under that mode."""
    import inspect

    found = []
    for layer in model._flatten_layers(include_self=False):
        attr = inspect.getattr_static(type(layer), "activation", None)
        mode = getattr(getattr(layer, "_remat_mode", None), "mode", None)
        if (isinstance(attr, property) and attr.fset is None
                and getattr(layer, "activation", None) is not None
                and (not scoped_only or mode == "activations")):
            found.append(layer.name)
    return found


def blocked_note(blockers: Sequence[str]) -> str:
    """What to tell a user whose model Keras cannot recompute activations of."""
    return (f"RematScope mode 'activations' fails in training on {len(blockers)} layer(s) "
            f"whose activation Keras cannot replace ({', '.join(blockers[:3])}"
            f"{', ...' if len(blockers) > 3 else ''}; a recurrent layer's 'activation' is a "
            "read-only property): build those layers outside the scope")


def model_remat(calls: Sequence[Any]) -> dict[int, RematSpec]:
    """Per call index, the RematScope mode the layer was built under, if any."""
    out = {}
    for c in calls:
        mode = getattr(c.layer, "_remat_mode", None) if c.layer is not None else None
        if mode is not None and getattr(mode, "mode", None):
            out[c.index] = parse_remat(mode)  # type: ignore[assignment]
    return out


def regions(ops: Sequence[LayerOp], calls: Sequence[Any], spec: RematSpec | None,
            per_layer: dict[int, RematSpec] | None = None) -> list[list[tuple[int, int]]]:
    """The recomputed regions, as runs of ``(layer index, prim position)``."""
    out: list[list[tuple[int, int]]] = []
    by_index = {c.index: c for c in calls}
    if spec is not None and spec.mode == "checkpoints":
        layers = [op for op in ops if op.prims]
        k = spec.segments or max(1, round(math.sqrt(len(layers))))
        k = min(k, len(layers)) or 1
        size = -(-len(layers) // k)
        for s in range(0, len(layers), size):
            members = [(op.index, i) for op in layers[s:s + size]
                       for i in range(len(op.prims))]
            if members:
                out.append(members)
        return out
    for op in ops:
        call = by_index.get(op.index)
        if call is None or call.glue or not op.prims:
            continue
        layer_spec = (per_layer or {}).get(op.index) or spec
        if layer_spec is None:
            continue
        chosen = _chosen_prims(op, call, layer_spec)
        if chosen:
            out.append([(op.index, i) for i in chosen])
    return out


def _chosen_prims(op: LayerOp, call: Any, spec: RematSpec) -> list[int]:
    every = list(range(len(op.prims)))
    if spec.mode == "full":
        return every
    if spec.mode == "activations":
        if getattr(call.layer, "activation", None) is None:
            return []
        return [i for i, p in enumerate(op.prims) if p.role == "activation"]
    if spec.mode == "larger_than":
        size = sum(math.prod(t.shape) for t in call.outputs)
        return every if size > spec.output_size_threshold else []
    if spec.mode == "list_of_layers":
        return every if getattr(call.layer, "name", None) in spec.layer_names else []
    return []
