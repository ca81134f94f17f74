"""Overhead of MemScopeCallback on training time.

Two measurements in one run, on the same small convnet (32 steps of batch 64
per epoch):

1. side by side: fits without the callback, with it per epoch and with it per
   batch, interleaved over several rounds; median and minimum epoch time (the
   first epoch of each fit, which traces, is left out);
2. directly: the time spent inside the callback's own hooks, against the
   epoch time of the same fits. On a shared 2-core virtual machine epoch times
   jump between two levels from one epoch to the next, whatever runs, so (2) is
   the precise figure and (1) shows the ratio is within that noise.

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


def timed(cb: memscope.MemScopeCallback, hooks: dict[str, float]) -> None:
    """Wrap the callback's hooks to add their time to ``hooks``."""
    for name in ("on_train_begin", "on_epoch_end", "on_train_batch_end"):
        original = getattr(cb, name)

        def wrapper(*args, _f=original, _n=name, **kwargs):
            t = time.perf_counter()
            try:
                return _f(*args, **kwargs)
            finally:
                hooks[_n] = hooks.get(_n, 0.0) + time.perf_counter() - t

        setattr(cb, name, wrapper)


def main() -> int:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, 2048)
    variants = ["none", "per epoch", "per batch"]
    epochs: dict[str, list[float]] = {k: [] for k in variants}
    hooks: dict[str, dict[str, float]] = {k: {} for k in variants[1:]}
    totals: dict[str, float] = {k: 0.0 for k in variants[1:]}
    rounds = 4
    for _ in range(rounds):
        for name in variants:
            model = build()
            timer = EpochTimer()
            callbacks: list = []
            if name != "none":
                cb = memscope.MemScopeCallback(log_every="batch" if name == "per batch"
                                               else "epoch", print_fn=lambda s: None)
                timed(cb, hooks[name])
                callbacks = [cb]
            model.fit(x, y, batch_size=64, epochs=4, verbose=0, callbacks=callbacks + [timer])
            epochs[name] += timer.times[1:]
            if name != "none":
                totals[name] += sum(timer.times)
    base = statistics.median(epochs["none"])
    print(f"1. epoch time over {rounds} rounds x 3 epochs (32 steps of batch 64):")
    for name, times in epochs.items():
        med, low = statistics.median(times), min(times)
        print(f"   {name:<10} median {med * 1000:7.1f} ms (ratio {med / base:.3f})  "
              f"min {low * 1000:7.1f} ms (ratio {low / min(epochs['none']):.3f})")
    print("2. time inside the callback's hooks, share of the epochs' time:")
    for name in variants[1:]:
        h = hooks[name]
        per_epoch = h.get("on_epoch_end", 0.0) + h.get("on_train_batch_end", 0.0)
        print(f"   {name:<10} per-epoch hooks {per_epoch / totals[name]:.4%} of epoch time; "
              f"on_train_begin (the estimate, once per fit) "
              f"{h.get('on_train_begin', 0.0) / rounds:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
