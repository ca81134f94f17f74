"""``keras.layers.RNN`` around other cells, measured beside its estimate.

A custom cell (as Keras' RNN guide writes one), Keras' ``LSTMCell`` and a
stack of ``GRUCell`` and ``SimpleRNNCell``, beside a SimpleRNN doing what
the custom cell does.

    python -m benchmarks.rnn_cells [--processes 2] [--steps 4]

Batch 64 under Adam; each variant measured in ``--processes`` fresh
processes and estimated (``benchmarks.quantized.table``). Each is a
function here, for ``python -m benchmarks.allocation_trace --model
benchmarks.rnn_cells:custom_cell``.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def custom_cell() -> Any:
    from tests.models import custom_cell_rnn

    return custom_cell_rnn()


def simple_rnn() -> Any:
    import keras

    x = keras.Input((200, 64))
    h = keras.layers.SimpleRNN(256, activation=None, use_bias=False)(x)
    return keras.Model(x, keras.layers.Dense(4)(h), name="simple_rnn")


def lstm_cell() -> Any:
    import keras

    x = keras.Input((100, 32))
    h = keras.layers.RNN(keras.layers.LSTMCell(128), return_sequences=True)(x)
    return keras.Model(x, keras.layers.Dense(4)(h), name="lstm_cell")


def stacked_cells() -> Any:
    import keras

    x = keras.Input((100, 32))
    h = keras.layers.RNN([keras.layers.GRUCell(64), keras.layers.SimpleRNNCell(64)])(x)
    return keras.Model(x, keras.layers.Dense(4)(h), name="stacked_cells")


VARIANTS = {"RNN(custom cell of 256), 200 x 64": custom_cell,
            "SimpleRNN(256, linear, no bias), 200 x 64": simple_rnn,
            "RNN(LSTMCell(128)) returning sequences, 100 x 32": lstm_cell,
            "RNN([GRUCell(64), SimpleRNNCell(64)]), 100 x 32": stacked_cells}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.quantized import run

    return run(argv, __doc__.splitlines()[0], VARIANTS, 64, processes=2, steps=4)


if __name__ == "__main__":
    raise SystemExit(main())
