"""What ``compile(steps_per_execution=N)`` adds to a ``fit`` step's peak.

With ``steps_per_execution`` greater than 1, Keras' TensorFlow trainer runs
``fit``'s steps in a ``tf.while_loop`` whose body fetches the next batch
from the iterator beside the step it runs (the fetch does not wait for the
step), so two batches are alive through each step where ``fit`` with one
step per call has one; the estimate of a model compiled so counts two
(``MemoryEstimate.input_batches``).

Each configuration is trained with ``fit`` in fresh processes with the
BFC allocator, ``steps_per_execution`` 1 and 4 side by side, on a
``tf.data`` pipeline that makes each batch anew (a copy of one synthetic
batch, ``x + 0``), as a real pipeline does; a callback resets the
allocator's peak before each call of the training function and reads it
after (one step, or four). Printed per configuration: the highest call of
the second epoch in each process, the measured rise from 1 to 4 (median
process against median process, and lowest against lowest) against the
estimates' rise, and the estimates themselves. The lowest processes
isolate the batch: in some processes the allocator also keeps a batch in
a chunk it did not split (the same tensors alive at the peak in an
allocator trace, the count one batch higher), which the median may
include. ``fit`` holds more than the step (the pipeline's
own buffered batches, a prefetch that tf.data adds after a ``map`` by
default), so the absolute peaks exceed the estimates by what the pipeline
holds; the rise is what ``steps_per_execution`` adds.

With ``--traced`` each setting is also profiled once (``TRACED``): the
highest sum of the requested bytes of the tensors alive at once, which
leaves the allocator's layout out.

    python -m benchmarks.steps_per_execution [--processes 6] [--traced]
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

#: (zoo model, batch, optimizer)
CONFIGS = [("mlp", 2048, "adam"), ("mlp", 4096, "sgd"), ("cnn", 128, "sgd"),
           ("dcn", 4096, "adam"), ("transformer", 8, "adam")]

CHILD = r"""
import json, sys
import tensorflow as tf, keras
import keras_memscope as memscope
from keras_memscope.measure import synthetic_batch
from benchmarks.accuracy import named_optimizer
from benchmarks.zoo import named

name, batch, opt, per_call = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
model = named(name)
x, y, loss = synthetic_batch(model, batch)
x = tuple(x) if isinstance(x, list) else x  # several inputs: one element each
model.compile(optimizer=named_optimizer(opt), loss=loss, steps_per_execution=per_call,
              jit_compile=False)
fresh = lambda *batch: tf.nest.map_structure(lambda t: t + tf.zeros((), t.dtype), batch)
data = tf.data.Dataset.from_tensors((x, y)).repeat().map(fresh)
peaks = []
class Peaks(keras.callbacks.Callback):
    def on_train_batch_begin(self, step, logs=None):
        tf.config.experimental.reset_memory_stats("CPU:0")
    def on_train_batch_end(self, step, logs=None):
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
model.fit(data, steps_per_epoch=16, epochs=2, verbose=0, callbacks=[Peaks()])
est = memscope.estimate(model, batch, device="cpu")
calls = len(peaks) // 2
print(json.dumps({"peak": max(peaks[calls:]), "estimate": est.peak_bytes,
                  "batch_bytes": est.input_bytes // est.input_batches}))
"""

#: The same training (zoo model, batch, optimizer, steps per call) with a
#: second epoch profiled: prints the highest sum of the bytes requested by
#: the tensors the epoch made and had alive at once (the allocator's
#: layout left out), and the estimate's batch bytes.
TRACED = CHILD.split("peaks = []")[0] + r"""
import glob, tempfile
from keras_memscope.measure import _xspace_events
model.fit(data, steps_per_epoch=16, epochs=1, verbose=0)
logdir = tempfile.mkdtemp()
tf.profiler.experimental.start(logdir)
model.fit(data, steps_per_epoch=16, epochs=1, verbose=0)
tf.profiler.experimental.stop()
live, now, most = {}, 0, 0
path = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0]
for kind, s in _xspace_events(path, ("MemoryAllocation", "MemoryDeallocation")):
    if not str(s.get("allocator_name", "")).startswith("bfc_cpu"):
        continue
    if kind == "MemoryAllocation":
        live[s.get("addr")] = s.get("requested_bytes") or 0
        now += live[s.get("addr")]
        most = max(most, now)
    else:
        now -= live.pop(s.get("addr"), 0)
est = memscope.estimate(model, batch, device="cpu")
print(json.dumps({"live_peak": most, "batch_bytes": est.input_bytes // est.input_batches}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--traced", action="store_true",
                        help="also profile one process per setting: the highest sum of "
                             "requested bytes alive at once (no allocator layout)")
    parser.add_argument("--only", nargs="*",
                        help="configurations to run: zoo model names, or NAME/bBATCH")
    args = parser.parse_args(argv)
    from tabulate import tabulate

    from benchmarks import machine
    from benchmarks.allocator_replay import record

    mib = 2**20
    print(f"machine: {machine.describe(machine.facts())}", flush=True)
    rows = []
    for name, batch, opt in CONFIGS:
        if args.only and name not in args.only and f"{name}/b{batch}" not in args.only:
            continue
        runs = {n: [record(CHILD, [name, str(batch), opt, str(n)])
                    for _ in range(args.processes)] for n in (1, 4)}
        peaks = {n: [r["peak"] for r in rs] for n, rs in runs.items()}
        est = {n: rs[0]["estimate"] for n, rs in runs.items()}
        rise = statistics.median(peaks[4]) - statistics.median(peaks[1])
        low_rise = min(peaks[4]) - min(peaks[1])
        predicted = est[4] - est[1]
        rows.append([name, batch, opt, f"{runs[1][0]['batch_bytes'] / mib:.2f}",
                     " ".join(f"{p / mib:.1f}" for p in sorted(peaks[1])),
                     " ".join(f"{p / mib:.1f}" for p in sorted(peaks[4])),
                     f"{rise / mib:+.2f}", f"{low_rise / mib:+.2f}", f"{predicted / mib:+.2f}",
                     f"{est[1] / mib:.1f} / {est[4] / mib:.1f}"])
        print(" | ".join(str(c) for c in rows[-1]), flush=True)
        if args.traced:
            live = {n: record(TRACED, [name, str(batch), opt, str(n)])["live_peak"]
                    for n in (1, 4)}
            print(f"  traced: tensors alive at most {live[1] / mib:.2f} MiB with 1 step per "
                  f"call, {live[4] / mib:.2f} with 4: {(live[4] - live[1]) / mib:+.2f} MiB "
                  f"(a batch: {runs[1][0]['batch_bytes'] / mib:.2f})", flush=True)
    print(tabulate(rows, headers=["model", "batch", "optimizer", "batch MiB",
                                  "fit peak MiB, 1 step per call", "4 steps per call",
                                  "measured rise MiB (medians)", "(lowest)",
                                  "estimated rise MiB",
                                  "estimate MiB (1 / 4)"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
