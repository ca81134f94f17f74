"""Train a small convnet on the CPU with MemScopeCallback and show the CSV log.

    TF_CPU_ALLOCATOR_USE_BFC=true python examples/train_with_callback.py [log.csv]

With ``TF_CPU_ALLOCATOR_USE_BFC=true`` (set before TensorFlow is imported) the
CPU allocator counts every tensor, so the measured peak is comparable with the
estimate; without it, small tensors are not counted and the callback says so.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_memscope as memscope  # noqa: E402


def main(csv_path: str = "memscope_log.csv") -> None:
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, 512)
    model.fit(x, y, batch_size=64, epochs=3, verbose=0,
              callbacks=[memscope.MemScopeCallback(device="cpu", print_fn=print),
                         keras.callbacks.CSVLogger(csv_path)])
    with open(csv_path) as f:
        print(f.read())


if __name__ == "__main__":
    main(*sys.argv[1:])
