"""Layers that compute between the layers they call, measured beside their estimate.

Keras' ``GroupQueryAttention`` (its attention runs between its four
projections), a custom attention layer, a custom gated feed-forward block
and Swin-style window attention with a relative-position bias. The graph
method traces such a layer whole; the column "graph MiB before" is its
estimate with the layer opened into its sub-layers and the ops between
them one glue call, as it was before.

    python -m benchmarks.composite_layers [--processes 2] [--steps 5]

Batch 32 under Adam; each variant measured in ``--processes`` fresh
processes and estimated (``benchmarks.quantized.table``). Each is a
function here, for ``python -m benchmarks.allocation_trace --model
benchmarks.composite_layers:gqa``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
from keras import layers  # noqa: E402

from tests.models import (  # noqa: E402
    ScaledAttention,
    WindowAttention,
    causal_gqa,
    gated_feed_forward,
    pooled,
)


def gqa() -> Any:
    x = keras.Input((64, 128))
    return pooled(x, layers.GroupQueryAttention(32, 8, 2)(x, x), "gqa")


def gqa_dropout() -> Any:
    x = keras.Input((64, 128))
    h = layers.GroupQueryAttention(32, 8, 4, dropout=0.1)(x, x)
    return pooled(x, h, "gqa_dropout")


def scaled_attention() -> Any:
    x = keras.Input((96, 128))
    h = layers.LayerNormalization()(ScaledAttention()(x) + x)
    return pooled(x, h, "scaled_attention")


def window_attention() -> Any:
    inputs = keras.Input((64, 96))  # one 8 x 8 window of 96 channels per sample
    x = inputs
    for _ in range(2):
        x = layers.Add()([x, WindowAttention()(layers.LayerNormalization()(x))])
        h = layers.Dense(384, activation="gelu")(layers.LayerNormalization()(x))
        x = layers.Add()([x, layers.Dense(96)(h)])
    return pooled(inputs, x, "window_attention")


VARIANTS = {"GroupQueryAttention(32, 8, 2), 64 x 128": gqa,
            "GroupQueryAttention(32, 8, 2), causal, 128 x 128": causal_gqa,
            "GroupQueryAttention(32, 8, 4, dropout=0.1), 64 x 128": gqa_dropout,
            "custom attention, scores / sqrt(32), 96 x 128": scaled_attention,
            "two custom GELU-gated feed-forward blocks of 512, 64 x 128": gated_feed_forward,
            "two Swin-style blocks, window attention with a relative-position bias, "
            "64 x 96": window_attention}


@contextlib.contextmanager
def opened() -> Iterator[None]:
    """Estimates made inside open every layer without a rule into its calls."""
    from unittest import mock

    from keras_memscope.graph import _Tracer

    with mock.patch.object(_Tracer, "computes_between", lambda self, frame: False):
        yield


def main(argv: list[str] | None = None) -> int:
    from benchmarks.quantized import run

    return run(argv, __doc__.splitlines()[0], VARIANTS, 32, processes=2, steps=5,
               before=opened)


if __name__ == "__main__":
    raise SystemExit(main())
