"""Keras' preprocessing layers inside the model, measured beside the estimate.

Raw strings through ``TextVectorization`` into an Embedding-Conv1D
classifier (and the same layers over int tokens), string features through
``StringLookup`` and a multi-hot ``CategoryEncoding``, ``Hashing`` into an
Embedding, ``Normalization`` beside ``Discretization`` into an Embedding,
and ``IntegerLookup`` into an Embedding; each adapted to a vocabulary or to
data when built.

    python -m benchmarks.preprocessing [--batch 256] [--processes 2] [--steps 4]

Adam; each variant measured in ``--processes`` fresh processes and
estimated (``benchmarks.quantized.table``). A batch of strings is empty
strings (``measure.synthetic_tensor``): what the layers make from the text
itself before padding is in neither figure. Each variant is a function
here, for ``python -m benchmarks.allocation_trace --model
benchmarks.preprocessing:hashing``.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def raw_text() -> Any:
    from tests.models import raw_text

    return raw_text()


def int_tokens() -> Any:
    from tests.models import raw_text

    return raw_text(vectorize=False)


def lookup_multi_hot() -> Any:
    """Five string features through StringLookup (500 tokens) and a
    multi-hot CategoryEncoding into Dense 512 ReLU and a two-way head."""
    import keras
    import numpy as np

    features = keras.Input((5,), dtype="string")
    lookup = keras.layers.StringLookup(max_tokens=500)
    lookup.adapt(np.array([[f"v{i + j}" for j in range(5)] for i in range(600)]))
    x = keras.layers.CategoryEncoding(num_tokens=500, output_mode="multi_hot")(lookup(features))
    x = keras.layers.Dense(512, activation="relu")(x)
    return keras.Model(features, keras.layers.Dense(2)(x), name="lookup_multi_hot")


def hashing() -> Any:
    """Eight string features hashed into 4096 bins, embedded in 64,
    flattened into Dense 256 ReLU and a sigmoid (binary cross-entropy)."""
    import keras

    features = keras.Input((8,), dtype="string")
    x = keras.layers.Embedding(4096, 64)(keras.layers.Hashing(num_bins=4096)(features))
    x = keras.layers.Dense(256, activation="relu")(keras.layers.Flatten()(x))
    model = keras.Model(features, keras.layers.Dense(1, activation="sigmoid")(x),
                        name="hashing")
    model.compile(loss="binary_crossentropy")
    return model


def normalized() -> Any:
    """32 numeric features normalized into Dense 256 ReLU beside the same
    features discretized into 16 bins and embedded in 8, concatenated into
    Dense 256 ReLU and a regression head (mean squared error)."""
    import keras
    import numpy as np

    values = np.random.default_rng(0).random((200, 32)).astype("float32")
    x = keras.Input((32,))
    normalization = keras.layers.Normalization()
    normalization.adapt(values)
    discretization = keras.layers.Discretization(num_bins=16)
    discretization.adapt(values)
    a = keras.layers.Dense(256, activation="relu")(normalization(x))
    b = keras.layers.Flatten()(keras.layers.Embedding(16, 8)(discretization(x)))
    h = keras.layers.Dense(256, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model(x, keras.layers.Dense(1)(h), name="normalized")
    model.compile(loss="mse")
    return model


def integer_lookup() -> Any:
    """20 int ids through IntegerLookup (1000 tokens), embedded in 64,
    averaged, Dense 128 ReLU and ten classes."""
    import keras
    import numpy as np

    ids = keras.Input((20,), dtype="int64")
    lookup = keras.layers.IntegerLookup(max_tokens=1000)
    lookup.adapt(np.arange(5000).reshape(-1, 20) % 1200)
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(1000, 64)(lookup(ids)))
    x = keras.layers.Dense(128, activation="relu")(x)
    return keras.Model(ids, keras.layers.Dense(10)(x), name="integer_lookup")


VARIANTS = {"TextVectorization (64 tokens), Embedding, Conv1D": raw_text,
            "the same over int tokens": int_tokens,
            "StringLookup, multi-hot CategoryEncoding, Dense 512": lookup_multi_hot,
            "Hashing (4096 bins), Embedding, Dense 256": hashing,
            "Normalization beside Discretization, Embedding": normalized,
            "IntegerLookup, Embedding, mean, Dense 128": integer_lookup}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.quantized import run

    return run(argv, __doc__.splitlines()[0], VARIANTS, 256, processes=2, steps=4)


if __name__ == "__main__":
    raise SystemExit(main())
