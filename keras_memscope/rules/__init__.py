"""Cost rules per layer class: a registry looked up along the class MRO.

A rule takes one :class:`~keras_memscope.graph.CallRecord` and returns the
:class:`~keras_memscope.ir.Prim` list that describes the call. Callers can add
or replace rules per call with ``estimate(..., rules={MyLayer: my_rule})``
without touching the defaults.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any

from .base import OUT, Builder, Rule, activation_name, apply_activation

__all__ = ["OUT", "Builder", "Rule", "RuleSet", "DEFAULT_RULES", "register",
           "current_rules", "using", "activation_name", "apply_activation", "category_of",
           "CATEGORIES"]


class RuleSet:
    """Rules by class; ``lookup`` walks the MRO and stops at generic bases."""

    def __init__(self, rules: Mapping[type, Rule] | None = None) -> None:
        self._rules: dict[type, Rule] = dict(rules or {})

    def register(self, *classes: type) -> Any:
        def decorate(rule: Rule) -> Rule:
            for cls in classes:
                self._rules[cls] = rule
            return rule

        return decorate

    def with_overrides(self, overrides: Mapping[type, Rule] | None) -> RuleSet:
        _maybe_register_hub()
        if not overrides:
            return self
        for cls, rule in overrides.items():
            if not isinstance(cls, type):
                raise TypeError(
                    f"rules= keys must be layer classes, got {cls!r}; "
                    "e.g. rules={MyLayer: my_rule}"
                )
            if not callable(rule):
                raise TypeError(f"the rule for {cls.__name__} is not callable: {rule!r}")
        merged = dict(self._rules)
        merged.update(overrides)
        return RuleSet(merged)

    def lookup(self, op: Any) -> tuple[Rule, str] | None:
        """The rule for ``op`` and the class it was registered for, or None."""
        if self is DEFAULT_RULES or _HUB_PENDING:
            _maybe_register_hub()
        stops = _generic_bases()
        for cls in type(op).__mro__:
            if cls in self._rules:
                return self._rules[cls], cls.__name__
            if cls in stops:
                return None
        return None

    def __contains__(self, cls: type) -> bool:
        return cls in self._rules

    def classes(self) -> list[type]:
        return list(self._rules)


_STOPS: set[type] = set()


def _generic_bases() -> set[type]:
    if not _STOPS:
        import keras
        from keras.src.models.functional import Functional
        from keras.src.ops.operation import Operation

        _STOPS.update({keras.Layer, keras.Model, keras.Sequential, Functional, Operation, object})
    return _STOPS


DEFAULT_RULES = RuleSet()
register = DEFAULT_RULES.register
_HUB_PENDING = True


def _maybe_register_hub() -> None:
    import sys

    global _HUB_PENDING
    if not _HUB_PENDING or "keras_hub" not in sys.modules:
        return
    from .hub import register_hub_rules

    _HUB_PENDING = False
    register_hub_rules(register)

_CURRENT: contextvars.ContextVar[RuleSet | None] = contextvars.ContextVar(
    "keras_memscope_rules", default=None
)


def current_rules() -> RuleSet:
    """The rule set of the estimate being computed (wrappers look up inner layers)."""
    return _CURRENT.get() or DEFAULT_RULES


@contextlib.contextmanager
def using(rules: RuleSet) -> Iterator[RuleSet]:
    token = _CURRENT.set(rules)
    try:
        yield rules
    finally:
        _CURRENT.reset(token)


CATEGORIES = ("conv", "dense", "norm", "pool", "recurrent", "attention", "other")


def category_of(layer: Any) -> str:
    """The layer's family for time and parameter breakdowns."""
    import keras

    L = keras.layers
    if layer is None:
        return "other"
    if isinstance(layer, L.TimeDistributed):
        return category_of(layer.layer)
    groups = [
        ("attention", ("MultiHeadAttention", "Attention", "AdditiveAttention",
                       "GroupQueryAttention")),
        ("recurrent", ("RNN", "Bidirectional", "SimpleRNN", "LSTM", "GRU", "ConvLSTM1D",
                       "ConvLSTM2D", "ConvLSTM3D")),
        ("conv", ("Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
                  "Conv3DTranspose", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D",
                  "SeparableConv2D")),
        ("dense", ("Dense", "EinsumDense")),
        ("norm", ("BatchNormalization", "LayerNormalization", "GroupNormalization",
                  "UnitNormalization", "RMSNormalization", "SpectralNormalization")),
        ("pool", tuple(n for n in dir(L) if "Pooling" in n)),
    ]
    for name, classes in groups:
        types = tuple(getattr(L, c) for c in classes if isinstance(getattr(L, c, None), type))
        if isinstance(layer, types):
            return name
    return "other"


def _load_defaults() -> None:
    from . import attention, conv, core, merge, norm, ops, pooling, recurrent  # noqa: F401


_load_defaults()
