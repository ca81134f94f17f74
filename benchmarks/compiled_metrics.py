"""What a model's compiled metrics add to its training step's peak.

Keras computes the metrics given to ``compile`` inside each training step,
from the batch's predictions; ``memscope.estimate`` and ``memscope.measure``
train without them. Each configuration here is trained in ``--processes``
fresh processes (BFC allocator, one warm-up step, then ``--steps`` steps,
each step's peak after ``reset_memory_stats``), with and without its
metrics; the table gives each process's highest step:

    python -m benchmarks.compiled_metrics [--processes 3] [--steps 5]

A per-pixel classifier (two 3 x 3 convolutions of 32 on 128 x 128 x 3, 21
classes, sparse cross-entropy from logits, b16) and a multi-label one
(Dense 512 -> 1024 ReLU -> 200 sigmoid, binary cross-entropy, b1024), both
under Adam.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CONFIGS = [("segmenter", "none", 16), ("segmenter", "accuracy", 16),
           ("multilabel", "none", 1024), ("multilabel", "accuracy", 1024),
           ("multilabel", "auc", 1024), ("multilabel", "auc-multi-label", 1024)]


def _model(name: str):
    import keras
    from keras import layers

    if name == "segmenter":
        x = inputs = keras.Input((128, 128, 3))
        for _ in range(2):
            x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
        return keras.Model(inputs, layers.Conv2D(21, 1)(x))
    inputs = keras.Input((512,))
    x = layers.Dense(1024, activation="relu")(inputs)
    return keras.Model(inputs, layers.Dense(200, activation="sigmoid")(x))


def _one(name: str, metric: str, batch: int, steps: int) -> list[float]:
    """Step peaks (MiB) of one configuration, in this process."""
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    import keras
    import numpy as np
    import tensorflow as tf

    model = _model(name)
    metrics = {"none": [], "accuracy": ["accuracy"], "auc": [keras.metrics.AUC()],
               "auc-multi-label": [keras.metrics.AUC(multi_label=True)]}[metric]
    out = model.outputs[0].shape
    rng = np.random.default_rng(0)
    if name == "multilabel":
        loss = "binary_crossentropy"
        y = rng.integers(0, 2, (batch, out[-1])).astype("float32")
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        y = rng.integers(0, out[-1], (batch, *out[1:-1])).astype("int32")
    x = tf.constant(rng.random((batch, *model.inputs[0].shape[1:]), dtype="float32"))
    y = tf.constant(y)
    model.compile("adam", loss, metrics=metrics, jit_compile=False)
    model.train_on_batch(x, y)
    peaks = []
    for _ in range(steps):
        tf.config.experimental.reset_memory_stats("CPU:0")
        model.train_on_batch(x, y)
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20)
    return peaks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "METRIC", "BATCH"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        name, metric, batch = args.one
        print(json.dumps(_one(name, metric, int(batch), args.steps)))
        return 0
    from tabulate import tabulate

    rows = []
    for name, metric, batch in CONFIGS:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        highest = []
        for _ in range(args.processes):
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.compiled_metrics", "--steps",
                 str(args.steps), "--one", name, metric, str(batch)],
                capture_output=True, text=True, env=env, check=True)
            highest.append(max(json.loads(done.stdout.strip().splitlines()[-1])))
        rows.append([name, batch, metric, " ".join(f"{p:.1f}" for p in sorted(highest))])
    print(tabulate(rows, ["model", "batch", "metrics", "highest step of each process, MiB"],
                   tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
