"""How long a Dense layer's product and its two gradient products take on
this CPU, timed alone, beside the times the speeds that order the CPU's two
gradient threads give them.

TensorFlow's gradient of ``y = x @ W`` (``_MatMulGrad``) computes the input
gradient as ``dy @ W^T`` (``transpose_b``: the kernel read transposed) and
the weight gradient as ``x^T @ dy`` (``transpose_a``). On TensorFlow's own
CPU kernels the first takes far longer than the forward product that reads
the same kernel as stored, by about the kernel's bytes over a fixed rate,
whatever the batch; the second does not. Beside them, the times the
ordering speeds give the two gradients with the kernel counted as read
transposed (``keras_memscope.tfgraph.DENSE_TRANSPOSED_READS``, tried and
not adopted). Each product is a ``tf.function`` with the BFC allocator,
the median of ``--repeats`` calls after two warm-up calls.

    python -m benchmarks.dense_gradient_speeds [--repeats 7]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

#: (rows of the kernel, columns): VGG16's fc1 and fc2, a 1024-wide layer
KERNELS = [(25088, 4096), (4096, 4096), (1024, 1024)]
BATCHES = (8, 64, 512)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    import tensorflow as tf
    from tabulate import tabulate

    from keras_memscope import devices, timing
    from keras_memscope.schedule import PrimCost

    from .conv_gradient_speeds import _median_ms

    profile = timing.ordering_profile(devices.get_device("cpu"))
    rows = []
    for k, n in KERNELS:
        w = tf.random.normal((k, n))
        kernel_mb = k * n * 4 / 1e6
        for m in BATCHES:
            x, dy = tf.random.normal((m, k)), tf.random.normal((m, n))
            forward = _median_ms(tf.function(lambda x=x, w=w: tf.matmul(x, w)), args.repeats)
            inputs = _median_ms(tf.function(
                lambda dy=dy, w=w: tf.matmul(dy, w, transpose_b=True)), args.repeats)
            weights = _median_ms(tf.function(
                lambda x=x, dy=dy: tf.matmul(x, dy, transpose_a=True)), args.repeats)
            flops = 2 * m * k * n
            nbytes = 4 * (m * k + k * n + m * n)
            # (as tfgraph.DENSE_TRANSPOSED_READS counts them: the kernel in
            # dy @ W^T, nothing in x^T @ dy)
            cost = PrimCost(0, flops, nbytes, flops, flops, 2 * nbytes, m * k * n, "matmul",
                            min(m, k, n), backward_input_transposed=4 * k * n)
            t_in, t_w = timing.backward_seconds(cost, profile)
            rows.append([f"{k} x {n} ({kernel_mb:.0f} MB)", m, f"{forward:.1f}",
                         f"{inputs:.1f}", f"{weights:.1f}",
                         f"{kernel_mb / (inputs - forward):.2f}" if inputs > forward else "-",
                         f"{1e3 * t_in:.1f}", f"{1e3 * t_w:.1f}"])
    print(tabulate(rows, headers=["kernel", "batch", "x @ W ms", "dy @ W^T ms", "x^T @ dy ms",
                                  "GB/s of W^T beyond x @ W", "ordering: dy @ W^T ms",
                                  "ordering: x^T @ dy ms"]))
    rate = profile.rates.get("transposed_read")
    print("ordering speeds: " + (f"an operand read transposed adds 1 s per "
                                 f"{rate / 1e9:.1f} GB" if rate else
                                 "no transposed-read rate (oneDNN's kernels)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
