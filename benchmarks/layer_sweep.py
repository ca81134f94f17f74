"""A sweep of small models of layer types no accuracy set has, one process each.

Twelve models (a DepthwiseConv1D, a Conv1DTranspose, AveragePooling3D,
UpSampling3D with 3-D padding and cropping, dilated and large-kernel Conv2D,
SeparableConv1D, two stacked SimpleRNN, ``keras.layers.Attention``,
AveragePooling1D, LayerNormalization over three axes, UnitNormalization),
each at one batch and optimizer: both methods' estimates against the highest
of four steps measured in one fresh process (BFC allocator). A quick search
for mechanisms the estimator misses, not an accuracy figure: a miss found
here is traced and then measured in more processes.

    python -m benchmarks.layer_sweep [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
from keras import layers  # noqa: E402
from tabulate import tabulate  # noqa: E402

import keras_memscope as memscope  # noqa: E402


def _seq(name: str, shape: tuple[int, ...], *stack: layers.Layer) -> keras.Model:
    return keras.Sequential([keras.Input(shape), *stack], name=name)


def _attention() -> keras.Model:
    inputs = keras.Input((256, 32))
    x = layers.Attention()([layers.Dense(64)(inputs), layers.Dense(64)(inputs)])
    return keras.Model(inputs, layers.Dense(10)(layers.GlobalAveragePooling1D()(x)),
                       name="kattention")


def _stacked_rnn() -> keras.Model:
    from tests.models import stacked_simple_rnn

    return stacked_simple_rnn()


L = layers
MODELS = {
    "dwconv1d": lambda: _seq("dwconv1d", (1024, 32),
                             L.DepthwiseConv1D(7, padding="same", depth_multiplier=2), L.ReLU(),
                             L.Conv1D(32, 1), L.GlobalAveragePooling1D(), L.Dense(10)),
    "convt1d": lambda: _seq("convt1d", (256, 32),
                            L.Conv1DTranspose(32, 5, strides=2, padding="same",
                                              activation="relu"),
                            L.Conv1D(16, 3), L.GlobalAveragePooling1D(), L.Dense(10)),
    "avgpool3d": lambda: _seq("avgpool3d", (8, 32, 32, 8),
                              L.Conv3D(16, 3, padding="same", activation="relu"),
                              L.AveragePooling3D(2), L.Conv3D(16, 3, padding="same"),
                              L.GlobalMaxPooling3D(), L.Dense(10)),
    "upsample3d": lambda: _seq("upsample3d", (4, 16, 16, 8),
                               L.Conv3D(8, 3, padding="same", activation="relu"),
                               L.UpSampling3D(2), L.ZeroPadding3D(1), L.Cropping3D(1),
                               L.Conv3D(4, 1), L.GlobalAveragePooling3D(), L.Dense(10)),
    "dilated": lambda: _seq("dilated", (64, 64, 16),
                            L.Conv2D(32, 3, dilation_rate=2, padding="same", activation="relu"),
                            L.Conv2D(32, 3, dilation_rate=4, padding="same", activation="relu"),
                            L.GlobalAveragePooling2D(), L.Dense(10)),
    "bigkernel": lambda: _seq("bigkernel", (128, 128, 3),
                              L.Conv2D(32, 7, strides=2, padding="same", activation="relu"),
                              L.MaxPooling2D(3, 2, padding="same"),
                              L.Conv2D(64, 5, padding="same"), L.GlobalAveragePooling2D(),
                              L.Dense(10)),
    "sepconv1d_b": lambda: _seq("sepconv1d_b", (512, 24),
                                L.SeparableConv1D(48, 9, padding="same", activation="relu"),
                                L.SeparableConv1D(48, 9, padding="same"),
                                L.GlobalMaxPooling1D(), L.Dense(10)),
    "simplernn": _stacked_rnn,
    "kattention": _attention,
    "avgpool1d": lambda: _seq("avgpool1d", (2048, 16),
                              L.Conv1D(32, 9, padding="same", activation="relu"),
                              L.AveragePooling1D(4), L.Conv1D(32, 9, padding="same"),
                              L.MaxPooling1D(4), L.Flatten(), L.Dense(10)),
    "layernorm4d": lambda: _seq("layernorm4d", (32, 32, 32), L.Conv2D(32, 3, padding="same"),
                                L.LayerNormalization(axis=[1, 2, 3]), L.Activation("gelu"),
                                L.GlobalAveragePooling2D(), L.Dense(10)),
    "unitnorm": lambda: _seq("unitnorm", (512,), L.Dense(1024), L.UnitNormalization(),
                             L.Dense(1024, activation="softplus"), L.Dropout(0.3),
                             L.Dense(10)),
}
CASES = [("dwconv1d", 32, "adam"), ("convt1d", 64, "sgd"), ("avgpool3d", 8, "adam"),
         ("upsample3d", 8, "adam"), ("dilated", 16, "adam"), ("bigkernel", 16, "sgd"),
         ("sepconv1d_b", 64, "rmsprop"), ("simplernn", 64, "adam"), ("kattention", 32, "adam"),
         ("avgpool1d", 64, "adam"), ("layernorm4d", 32, "adamw"), ("unitnorm", 256, "adam")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(MODELS), help="models to run")
    args = parser.parse_args(argv)
    rows = []
    for name, batch, opt in CASES:
        if args.only and name not in args.only:
            continue
        est = {method: memscope.estimate(MODELS[name](), batch, optimizer=opt, device="cpu",
                                         method=method).peak_bytes
               for method in ("graph", "rules")}
        steps = memscope.measure(MODELS[name](), batch, optimizer=opt, steps=4,
                                 device="cpu").step_peak_bytes
        high = max(steps)
        rows.append([name, batch, opt, f"{min(steps) / 2**20:.2f} - {high / 2**20:.2f}",
                     *(f"{est[m] / 2**20:.2f} ({est[m] / high - 1:+.1%})"
                       for m in ("graph", "rules"))])
        print(rows[-1], flush=True)
    print(tabulate(rows, headers=["model", "batch", "optimizer", "measured MiB (4 steps)",
                                  "graph MiB", "rules MiB"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
