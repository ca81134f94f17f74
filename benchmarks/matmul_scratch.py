"""What a low-precision weight gradient ``x^T @ dy`` allocates beyond its output.

    python -m benchmarks.matmul_scratch

For each dtype (bfloat16, float16) and shape (``K`` rows of ``x``, ``M``
and ``N`` its and ``dy``'s columns), one matmul in a ``tf.function`` in a
process with TensorFlow's BFC allocator on the CPU (this script sets
``TF_CPU_ALLOCATOR_USE_BFC`` before importing TensorFlow: run it on its
own), after a first call: the allocator's peak above what was in use
before the call, less the ``M x N`` output. oneDNN's bfloat16 kernels on
a CPU with AVX512_BF16 and no AMX hold a float32 buffer of the output
(``DeviceProfile.accumulate_dtypes``, twice the output's bytes); the table
says what this CPU's kernels hold.
"""

from __future__ import annotations

import argparse
import os

SHAPES = ((1000, 384, 1024), (512, 2048, 2048), (512, 1024, 2048), (4096, 512, 512),
          (256, 256, 1024), (2048, 768, 3072), (128, 2048, 2048), (8192, 128, 128))
MIB = 2**20


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    import tensorflow as tf
    from tabulate import tabulate

    from benchmarks import machine

    rows = []
    for dtype in (tf.bfloat16, tf.float16):
        for k, m, n in SHAPES:
            x = tf.cast(tf.random.normal([k, m]), dtype)
            dy = tf.cast(tf.random.normal([k, n]), dtype)
            grad = tf.function(lambda a, b: tf.matmul(a, b, transpose_a=True))
            grad(x, dy)
            tf.config.experimental.reset_memory_stats("CPU:0")
            before = tf.config.experimental.get_memory_info("CPU:0")["current"]
            out = grad(x, dy)
            peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
            del out
            output = m * n * dtype.size
            rows.append([dtype.name, k, m, n, f"{output / MIB:.2f}",
                         f"{(peak - output) / MIB:.2f}", f"{2 * output / MIB:.2f}"])
    print(f"machine: {machine.describe(machine.facts())}")
    print(tabulate(rows, headers=["dtype", "K", "M", "N", "output MiB", "beyond it MiB",
                                  "a float32 buffer of it MiB"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
