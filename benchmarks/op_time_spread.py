"""How much one op's duration varies from one training step to the next.

The allocation history of a step depends on how TensorFlow's CPU executor
interleaves its two streams of ops, and so on the ops' durations; this
measures their step-to-step spread, the ``--sigma`` of
``benchmarks/history_spread.py``. ResNet-50 (batch 16, Adam) is trained for
two warm-up steps, then three steps are profiled one by one; for every op
that takes over 0.2 ms in each of them, the log of its duration in one step
over another is taken, and the spread of those logs around their mean,
divided by sqrt(2), is one op's log-normal sigma. The same spread is also
given for ops by their duration (below 1 ms, 1-4 ms, 4 ms and over: the
mean of the two steps), to show whether long ops vary as much as short
ones; ``--model`` profiles another zoo model (or ``module:function``)
instead.

The two gradients of one layer (a convolution's input and filter
gradients, a matmul's ``MatMul`` and ``MatMul_1`` under
``gradient_tape``) start together; the simulated orders scale their
durations by independent factors, so the log of their ratio spreads by
sqrt(2) x sigma from one order to another. The same spread is given over
the profiled steps, each layer's (its median ratio and the ratio in each
step for the eight that spread most) and their median.

    python -m benchmarks.op_time_spread [--batch 16] [--steps 3]
    python -m benchmarks.op_time_spread --model transformer --batch 16
    python -m benchmarks.op_time_spread --model tests.models:gated_mlp --batch 512 --steps 8
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model", default="resnet50", help="a builder of benchmarks.zoo")
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf

    from keras_memscope.measure import _op_durations, _profiled

    from . import zoo

    model = zoo.named(args.model)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x = tf.constant(np.random.rand(args.batch, *model.inputs[0].shape[1:]).astype("float32"))
    y = tf.constant(np.zeros((args.batch,), dtype="int32"))
    model.train_on_batch(x, y)
    model.train_on_batch(x, y)
    steps = []
    for _ in range(args.steps):
        steps.append(_profiled(lambda: model.train_on_batch(x, y), _op_durations))
    ops = [op for op in steps[0] if all(s.get(op, 0.0) > 2e-4 for s in steps)]
    print(f"{args.model}, batch {args.batch}, Adam: {len(ops)} ops over 0.2 ms in each of "
          f"{args.steps} profiled steps")
    buckets = [("under 1 ms", 0.0, 1e-3), ("1-4 ms", 1e-3, 4e-3), ("4 ms and over", 4e-3, 1e9)]
    for a, b in itertools.combinations(range(args.steps), 2):
        logs = [math.log(steps[b][op] / steps[a][op]) for op in ops]
        sigma = statistics.pstdev(logs) / math.sqrt(2)
        parts = []
        for label, low, high in buckets:
            these = [math.log(steps[b][op] / steps[a][op]) for op in ops
                     if low <= (steps[a][op] + steps[b][op]) / 2 < high]
            if len(these) > 1:
                parts.append(f"{label} {statistics.pstdev(these) / math.sqrt(2):.2f} "
                             f"({len(these)} ops)")
        print(f"steps {a + 1} and {b + 1}: one op's sigma {sigma:.2f} "
              f"(median duration ratio {math.exp(statistics.median(logs)):.2f}); "
              + ", ".join(parts))
    pairs = gradient_pairs(steps)
    spreads = []
    for i, w in pairs:
        logs = [math.log(s[w] / s[i]) for s in steps]
        spreads.append((statistics.pstdev(logs), math.exp(statistics.median(logs)), w, logs))
    if spreads:
        print(f"{len(pairs)} layers with both gradients over 0.2 ms in every step; the log of "
              f"their weight/input duration ratio spreads over the steps by (median over "
              f"layers) {statistics.median(x[0] for x in spreads):.2f} (the simulated "
              f"orders': sqrt(2) x sigma)")
    for spread, ratio, w, logs in sorted(spreads, key=lambda x: -x[0])[:8]:
        print(f"  {w.rsplit('/', 3)[-3]}: median ratio {ratio:.2f}, spread {spread:.2f} "
              f"({' '.join(f'{math.exp(x):.2f}' for x in logs)})")
    return 0


def gradient_pairs(steps: list[dict[str, float]]) -> list[tuple[str, str]]:
    """The (input gradient, weight gradient) op names of each layer whose
    two gradient ops took over 0.2 ms in every profiled step."""
    found = []
    for name in steps[0]:
        if name.endswith("Conv2DBackpropInput"):
            other = name[: -len("Input")] + "Filter"
        elif name.startswith("gradient_tape/") and name.endswith("/MatMul/MatMul"):
            other = name + "_1"
        else:
            continue
        if all(s.get(name, 0.0) > 2e-4 and s.get(other, 0.0) > 2e-4 for s in steps):
            found.append((name, other))
    return found


if __name__ == "__main__":
    # a measuring process's allocator (here, not in main(): a process that
    # calls main() keeps its own setting, and measure() runs in a process
    # with the BFC allocator on instead of starting a fresh one)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    sys.exit(main())
