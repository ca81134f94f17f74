"""Why an LSTM's gradient loop sometimes runs ahead of its weight-gradient sums.

For each configuration, in a fresh process with the BFC allocator on: build an
LSTM classifier (200 steps unless given), run one training step with run
metadata to read the graph TensorFlow actually executes (after grappler), and
report which expensive op comes last among the readers of a step's gate
gradient (the executor runs that one on the same thread). Then profile two
steps and count the most partial recurrent-kernel gradients alive at once.

    python -m benchmarks.lstm_schedule

The table is in benchmarks/RESULTS.md (LSTM, under "Where the remaining error
comes from"); the estimate's recurrent notes (``rules.recurrent._backlog_parts``)
cite it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

#: (optimizer, batch, steps, units, inputs, extra environment)
CASES = [
    ("adam", 32, 200, 256, "embedding", {}),
    ("adamw", 32, 200, 256, "embedding", {}),
    ("adagrad", 32, 200, 256, "embedding", {}),
    ("adam", 32, 100, 256, "embedding", {}),
    ("sgd", 32, 200, 256, "embedding", {}),
    ("rmsprop", 32, 200, 256, "embedding", {}),
    ("adam", 8, 200, 512, "embedding", {}),
    ("adam", 8, 200, 256, "float", {}),
    ("sgd", 8, 200, 256, "float", {}),
    ("adam", 8, 200, 256, "frozen embedding", {}),
    ("sgd", 1, 200, 256, "embedding", {}),
    ("adam", 32, 200, 256, "embedding", {"NO_DEPENDENCY_OPTIMIZATION": "1"}),
]

RUN = r"""
import json, os, sys
import numpy as np
import tensorflow as tf
import keras
from keras import layers
from tensorflow.python.eager import context
from keras_memscope.measure import _profiled, _xspace_events

opt, batch, steps, units, inputs = sys.argv[1:6]
batch, steps, units = int(batch), int(steps), int(units)
if os.environ.get("NO_DEPENDENCY_OPTIMIZATION"):
    tf.config.optimizer.set_experimental_options({"dependency_optimization": False})
if inputs == "float":
    inp = keras.Input((steps, 128)); x = inp
    data = np.random.rand(batch, steps, 128).astype("float32")
else:
    inp = keras.Input((steps,), dtype="int32")
    emb = layers.Embedding(10000, 128)
    emb.trainable = inputs == "embedding"
    x = emb(inp)
    data = np.zeros((batch, steps), dtype="int32")
model = keras.Model(inp, layers.Dense(2)(layers.LSTM(units)(x)))
model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
x, y = tf.constant(data), tf.constant(np.zeros((batch,), dtype="int32"))

context.enable_run_metadata()
model.train_on_batch(x, y)
meta = context.export_run_metadata()
context.disable_run_metadata()
graph = max((f.post_optimization_graph for f in meta.function_graphs), key=lambda g: len(g.node))
gate_grad = [n.name for n in graph.node
             if "while_grad" in n.name and n.name.endswith("split_grad/concat")]
readers = [n.name for n in graph.node if n.op == "MatMul"
           and any(i.split(":")[0] == gate_grad[0] for i in n.input)] if gate_grad else []
names = {"MatMul_1_grad/MatMul": "state gradient", "MatMul_grad/MatMul": "input gradient",
         "MatMul_1_grad/MatMul_1": "recurrent kernel", "MatMul_grad/MatMul_1": "input kernel"}
last = next((v for k, v in names.items() if readers and readers[-1].endswith(k)), None)

model.train_on_batch(x, y)
alive_max = []
for _ in range(2):
    events = _profiled(lambda: model.train_on_batch(x, y), lambda path: _xspace_events(
        path, ("MemoryAllocation", "MemoryDeallocation")))
    live, most = set(), 0
    for name, stats in events:
        op = stats.get("tf_op", "")
        partial = "while_grad" in op and op.endswith("MatMul_1_grad/MatMul_1")
        if name == "MemoryAllocation" and partial:
            live.add(stats["addr"])
        elif name == "MemoryDeallocation":
            live.discard(stats.get("addr"))
        most = max(most, len(live))
    alive_max.append(most)
print(json.dumps({"readers": len(readers), "last": last, "alive": alive_max}))
"""


def main() -> int:
    base = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_CPU_ALLOCATOR_USE_BFC="true")
    base["PYTHONPATH"] = os.getcwd() + os.pathsep + base.get("PYTHONPATH", "")
    print("| optimizer | batch | steps | units | inputs | last reader | partials alive |")
    print("|---|---|---|---|---|---|---|")
    for opt, batch, steps, units, inputs, extra in CASES:
        proc = subprocess.run(
            [sys.executable, "-c", RUN, opt, str(batch), str(steps), str(units), inputs],
            capture_output=True, text=True, env=dict(base, **extra))
        label = opt + (" (dependency optimizer off)" if extra else "")
        if proc.returncode != 0:
            print(f"| {label} | {batch} | {steps} | {units} | {inputs} | failed: "
                  f"{proc.stderr.strip().splitlines()[-1][:80]} | |")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        last = r["last"] or f"({r['readers']} readers)"
        alive = "-".join(str(v) for v in sorted(set(r["alive"])))
        print(f"| {label} | {batch} | {steps} | {units} | {inputs} | {last} | {alive} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
