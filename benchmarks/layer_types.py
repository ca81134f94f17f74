"""Estimate against measurement for layer types and batch sizes outside the zoo.

Small models built around one layer type each (Conv1D, Conv3D, depthwise,
transposed convolution, Embedding, attention), at batch 1 and at a larger
batch, Adam: the graph estimate against the highest peak of two measuring
processes of six steps each (fresh processes, BFC allocator).

    python -m benchmarks.layer_types
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
from keras import layers  # noqa: E402

import keras_memscope as memscope  # noqa: E402


def conv1d() -> keras.Model:
    return keras.Sequential([keras.Input((512, 16)), layers.Conv1D(64, 5, activation="relu"),
                             layers.Conv1D(64, 5), layers.GlobalAveragePooling1D(),
                             layers.Dense(10)], name="conv1d")


def conv3d() -> keras.Model:
    return keras.Sequential([keras.Input((16, 32, 32, 3)),
                             layers.Conv3D(16, 3, activation="relu"), layers.MaxPooling3D(),
                             layers.Conv3D(32, 3), layers.GlobalAveragePooling3D(),
                             layers.Dense(10)], name="conv3d")


def depthwise() -> keras.Model:
    return keras.Sequential([keras.Input((64, 64, 16)), layers.DepthwiseConv2D(3, padding="same"),
                             layers.Conv2D(32, 1), layers.BatchNormalization(), layers.ReLU(),
                             layers.GlobalAveragePooling2D(), layers.Dense(10)], name="depthwise")


def transpose() -> keras.Model:
    return keras.Sequential([keras.Input((16, 16, 32)),
                             layers.Conv2DTranspose(32, 3, strides=2, padding="same",
                                                    activation="relu"),
                             layers.Conv2D(16, 3, padding="same"),
                             layers.GlobalAveragePooling2D(), layers.Dense(10)], name="transpose")


def embedding() -> keras.Model:
    return keras.Sequential([keras.Input((200,), dtype="int32"), layers.Embedding(20000, 64),
                             layers.GlobalAveragePooling1D(), layers.Dense(10)], name="embedding")


def attention() -> keras.Model:
    inp = keras.Input((64, 128))
    x = layers.MultiHeadAttention(4, 32)(inp, inp)
    x = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(x + inp))
    return keras.Model(inp, layers.Dense(10)(x), name="attention")


CASES = [(conv1d, 1), (conv1d, 32), (conv3d, 1), (conv3d, 8), (depthwise, 1), (depthwise, 16),
         (transpose, 1), (transpose, 32), (embedding, 1), (embedding, 64), (attention, 1),
         (attention, 16)]


def main() -> int:
    print("| model | batch | measured MiB (2 processes x 6 steps) | graph MiB | error |")
    print("|---|---|---|---|---|")
    errors = []
    for make, batch in CASES:
        model = make()
        runs = [memscope.measure(model, batch, optimizer="adam", steps=6, device="cpu")
                for _ in range(2)]
        steps = [p for r in runs for p in r.step_peak_bytes]
        est = memscope.estimate(model, batch, optimizer="adam", device="cpu")
        error = (est.peak_bytes - max(steps)) / max(steps)
        errors.append(abs(error))
        print(f"| {model.name} | {batch} | {min(steps) / 2**20:.1f} - {max(steps) / 2**20:.1f} "
              f"| {est.peak_bytes / 2**20:.1f} | {error:+.1%} |", flush=True)
    errors.sort()
    print(f"\nmedian |error| {errors[len(errors) // 2]:.1%}, worst {errors[-1]:.1%} "
          f"({len(errors)} configurations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
