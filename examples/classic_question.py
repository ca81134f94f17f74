"""The classic question: how much memory does training this MLP need?

A 1000-dimensional input, four hidden layers of 100 units, 10 outputs,
mini-batch 256 (131,410 parameters). Prints the estimate for SGD and Adam on
the CPU and a GPU, with the parts that the usual "3x the weights" leaves out.

    python examples/classic_question.py
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import keras_memscope as memscope  # noqa: E402
from keras_memscope.units import human_bytes  # noqa: E402


def build() -> keras.Model:
    return keras.Sequential(
        [keras.Input((1000,))]
        + [keras.layers.Dense(100, activation="relu") for _ in range(4)]
        + [keras.layers.Dense(10, activation="softmax")],
        name="classic_mlp",
    )


def main() -> None:
    model = build()
    memscope.summary(model, batch_size=256, optimizer="sgd", device="cpu")
    print()
    for optimizer in ("sgd", "adam"):
        for device in ("cpu", "gpu"):
            est = memscope.estimate(model, batch_size=256, optimizer=optimizer, device=device)
            print(f"{optimizer:>4} on {device}: allocator peak {human_bytes(est.peak_bytes)} "
                  f"= {est.peak_bytes / est.weights_bytes:.1f} x the weights; with the "
                  f"runtime {human_bytes(est.total_bytes)}")


if __name__ == "__main__":
    main()
