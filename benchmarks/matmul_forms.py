"""How long one batched matrix product takes in each of its forms, on this CPU.

Attention's ``probs v`` (128 matrices of 256 x 256 by 256 x 8 at batch 32,
4 heads) has two gradient products of the same FLOPs: ``dprobs = dout
v^T``, an outer product of rank 8 that writes 32 MiB, and ``dv = probs^T
dout``, which reads the 32 MiB ``probs`` transposed. Which ends first
decides whether ``probs`` is still alive when the softmax's gradient
allocates (``keras_memscope.schedule.PRODUCT_GRADIENTS_SIDE_BY_SIDE``).
This times each form alone (``tf.function``, the BFC allocator, the
median of ``--repeats`` calls after one warm-up) beside an element-wise
product of the same 32 MiB, and gives the time the nominal speeds that
order the CPU's two gradient threads assign it
(``keras_memscope.timing.NOMINAL_CPU_SPEEDS``; the same for every form).

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
    parser.add_argument("--batch", type=int, default=128, help="matrices (batch x heads)")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    if args.batch < 1 or args.repeats < 1:
        parser.error("--batch and --repeats must be at least 1")

    import tensorflow as tf
    from tabulate import tabulate

    from keras_memscope import devices, timing

    n, m, d = args.batch, 256, 8
    probs = tf.random.uniform((n, m, m))
    thin = tf.random.uniform((n, m, d))
    flops = 2 * n * m * m * d
    product_bytes = 4 * (n * m * m + 2 * n * m * d)  # read and written
    # name: (the form, its FLOPs (0: element-wise), the bytes it moves)
    forms = {
        "probs @ v (forward)": (lambda: tf.linalg.matmul(probs, thin), flops, product_bytes),
        "probs^T @ dout (gradient for v)": (
            lambda: tf.linalg.matmul(probs, thin, adjoint_a=True), flops, product_bytes),
        "dout @ v^T (gradient for probs)": (
            lambda: tf.linalg.matmul(thin, thin, adjoint_b=True), flops, product_bytes),
        "probs * probs (element-wise)": (lambda: probs * probs, 0, 4 * 3 * n * m * m),
    }
    nominal = timing.ordering_profile(devices.get_device("cpu"))
    rows = []
    for name, (form, form_flops, moved) in forms.items():
        # (a slice of the result back: the product's own time, not a copy)
        run = tf.function(lambda form=form: tf.reduce_sum(form()[..., :1]))
        run()
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run().numpy()
            seconds.append(time.perf_counter() - start)
        model = timing.op_time(form_flops, moved, nominal,
                               family="matmul" if form_flops else "", min_dim=d)
        rows.append([name, f"{1e3 * statistics.median(seconds):.2f}",
                     f"{1e3 * min(seconds):.2f}", f"{1e3 * model:.2f}"])
    print(f"{n} matrices, {m} x {m} by {m} x {d} ({flops / 1e6:.0f} MFLOP a product); "
          f"TensorFlow {tf.__version__}, oneDNN's kernels: {devices.cpu_uses_onednn()}")
    print(tabulate(rows, headers=["form", "median ms", "fastest ms", "nominal speeds ms"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
