"""Overhead of MemScopeCallback on training time, measured side by side.

Trains the same small convnet three ways in one process, interleaved over
several rounds: without the callback, with it per epoch, and with it per
batch. Reports the median epoch time (the first epoch of each fit, which
traces, is left out), the ratio to the plain run, and the one-time cost of the
estimate the callback makes in ``on_train_begin``.

    python -m benchmarks.callback_overhead
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_memscope as memscope  # noqa: E402


class EpochTimer(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._t = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._t)


def build() -> keras.Model:
    model = keras.Sequential([
        keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main() -> int:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, 2048)
    variants = {
        "none": lambda: [],
        "per epoch": lambda: [memscope.MemScopeCallback(print_fn=lambda s: None)],
        "per batch": lambda: [memscope.MemScopeCallback(log_every="batch",
                                                        print_fn=lambda s: None)],
    }
    epochs: dict[str, list[float]] = {k: [] for k in variants}
    begin_costs: list[float] = []
    rounds = 3
    for _ in range(rounds):
        for name, make in variants.items():
            model = build()
            timer = EpochTimer()
            callbacks = make()
            model.fit(x, y, batch_size=64, epochs=4, verbose=0, callbacks=callbacks + [timer])
            epochs[name] += timer.times[1:]
            if name == "per epoch":
                cb = callbacks[0]
                s = time.perf_counter()
                cb.on_train_begin()  # the one-time estimate, timed alone
                begin_costs.append(time.perf_counter() - s)
    base = statistics.median(epochs["none"])
    print(f"median epoch time over {rounds} rounds x 3 epochs (32 steps of batch 64):")
    for name, times in epochs.items():
        med = statistics.median(times)
        print(f"  {name:<10} {med * 1000:8.1f} ms   ratio to none {med / base:.4f}")
    print(f"one-time estimate in on_train_begin: median {statistics.median(begin_costs):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
