"""What ``fit`` holds beside the training step, by how it is fed.

The zoo's CNN at batch 128 under Adam, trained for three epochs of 16
batches with ``MemScopeCallback`` in a fresh process with the BFC
allocator, fed two ways: NumPy arrays of the 2048 images and labels (24
MiB), which ``fit`` holds as tensors in the same allocator, and a
``tf.data`` pipeline from a generator that makes each batch as it goes
(prefetching two). Per epoch: the memory held at its end (the
allocator's ``current``), its peak, and the callback's ratio to the
estimate.

    python -m benchmarks.fit_inputs [--processes 2]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CHILD = r"""
import json, sys, warnings
import numpy as np, tensorflow as tf, keras
import keras_memscope as memscope
from benchmarks import zoo

feed = sys.argv[1]
model = zoo.cnn()
model.compile(optimizer="adam",
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
callback = memscope.MemScopeCallback(batch_size=128, print_fn=lambda line: None)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    if feed == "arrays":
        x, y = np.ones((2048, 32, 32, 3), "float32"), np.zeros(2048, "int32")
        model.fit(x, y, batch_size=128, epochs=3, verbose=0, callbacks=[callback])
    else:
        def batches():
            for _ in range(16):
                yield np.ones((128, 32, 32, 3), "float32"), np.zeros(128, "int32")
        spec = (tf.TensorSpec((128, 32, 32, 3)), tf.TensorSpec((128,), tf.int32))
        data = tf.data.Dataset.from_generator(batches, output_signature=spec).prefetch(2)
        model.fit(data.repeat(), steps_per_epoch=16, epochs=3, verbose=0,
                  callbacks=[callback])
est = callback.estimate
print(json.dumps({"estimate": est.peak_bytes, "held_estimate": est.held_bytes,
                  "data_bytes": callback.data_bytes,
                  "epochs": [[h["memscope_current_bytes"], h["memscope_peak_bytes"],
                              h["memscope_ratio"]] for h in callback.history]}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    from benchmarks import machine
    from benchmarks.allocator_replay import record

    mib = 2**20
    print(f"machine: {machine.describe(machine.facts())}")
    for feed in ("arrays", "generator"):
        for _ in range(args.processes):
            r = record(CHILD, [feed])
            epochs = "; ".join(f"held {c / mib:.1f}, peak {p / mib:.1f} MiB ({q:.2f}x)"
                               for c, p, q in r["epochs"])
            print(f"{feed:9s} estimate {r['estimate'] / mib:.1f} MiB, held "
                  f"{r['held_estimate'] / mib:.1f} estimated, arrays given "
                  f"{r['data_bytes'] / mib:.1f} MiB: {epochs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
