"""How long one batched matrix product takes in each of its forms, on this CPU.

Attention's ``probs v`` (128 matrices of 256 x 256 by 256 x 8 at batch 32,
4 heads) has two gradient products of the same FLOPs: ``dprobs = dout
v^T``, an outer product of rank 8 that writes 32 MiB, and ``dv``, which
reads the 32 MiB ``probs``. Which ends first decides whether ``probs`` is
still alive when the softmax's gradient allocates
(``keras_memscope.schedule.PRODUCT_GRADIENTS_SIDE_BY_SIDE``). This times
each form alone (``tf.function``, the BFC allocator, the median of
``--repeats`` calls after one warm-up): the forward product, the same
product reading ``probs`` transposed (``adjoint_a``: TensorFlow's own
kernels read a transposed operand more slowly), the gradient for
``probs``, the gradient for ``v`` as Keras' attention computes it (an
Einsum that reads ``probs`` as stored), and an element-wise product of the
same 32 MiB; beside each, the time the nominal speeds that order the CPU's
two gradient threads assign it (``keras_memscope.timing.ordering_profile``:
one speed for every matrix product, and where TensorFlow runs its own
kernels, ``NOMINAL_TRANSPOSED_READ_BYTES_S`` for what it reads transposed).

    python -m benchmarks.matmul_forms [--batch 128] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128,
                        help="matrices (batch x 4 heads)")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    if args.batch < 4 or args.batch % 4 or args.repeats < 1:
        parser.error("--batch must be a positive multiple of 4 (batch x 4 heads), "
                     "--repeats at least 1")

    import tensorflow as tf
    from tabulate import tabulate

    from keras_memscope import devices, timing
    from keras_memscope.schedule import PrimCost

    n, m, d = args.batch, 256, 8
    probs = tf.random.uniform((n, m, m))
    thin = tf.random.uniform((n, m, d))
    flops = 2 * n * m * m * d
    heads = 4
    big, small = 4 * n * m * m, 4 * n * m * d  # probs, and v or dout
    product_bytes = big + 2 * small  # read and written
    probs4 = tf.reshape(probs, (n // heads, heads, m, m))  # (batch, heads, query, key)
    thin4 = tf.reshape(thin, (n // heads, m, heads, d))  # (batch, key, heads, depth)
    # name: (the form, its FLOPs (0: element-wise), the bytes it moves, the
    # bytes it reads transposed, the bytes of its operands)
    forms = {
        "probs @ v (forward)": (lambda: tf.linalg.matmul(probs, thin), flops, product_bytes,
                                0, big + small),
        "probs^T @ dout": (lambda: tf.linalg.matmul(probs, thin, adjoint_a=True),
                           flops, product_bytes, big, big + small),
        "dout @ v^T (gradient for probs)": (
            lambda: tf.linalg.matmul(thin, thin, adjoint_b=True), flops, product_bytes,
            small, 2 * small),
        # Keras' attention: its gradient for v, as TensorFlow's einsum
        # gradient writes it (probs read as stored: tfgraph.einsum_transposed_reads)
        "einsum abcd,acbe->aecd (gradient for v)": (
            lambda: tf.einsum("abcd,acbe->aecd", thin4, probs4), flops, product_bytes,
            0, big + small),
        "probs * probs (element-wise)": (lambda: probs * probs, 0, 3 * big, 0, 0),
    }
    nominal = timing.ordering_profile(devices.get_device("cpu"))
    rows = []
    for name, (form, form_flops, moved, transposed, reads) in forms.items():
        # (a slice of the result back: the product's own time, not a copy)
        run = tf.function(lambda form=form: tf.reduce_sum(form()[..., :1]))
        run()
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run().numpy()
            seconds.append(time.perf_counter() - start)
        if form_flops:  # timed as the gradient of a product of two activations
            model = timing.backward_seconds(PrimCost(
                0, 0, 0, form_flops, 0, moved, form_flops // 2, "matmul", d,
                backward_input_transposed=transposed, backward_input_reads=reads), nominal)[0]
        else:
            model = timing.op_time(0, moved, nominal)
        rows.append([name, f"{1e3 * statistics.median(seconds):.2f}",
                     f"{1e3 * min(seconds):.2f}", f"{1e3 * model:.2f}"])
    print(f"{n} matrices, {m} x {m} by {m} x {d} ({flops / 1e6:.0f} MFLOP a product); "
          f"TensorFlow {tf.__version__}, oneDNN's kernels: {devices.cpu_uses_onednn()}")
    print(tabulate(rows, headers=["form", "median ms", "fastest ms", "nominal speeds ms"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
