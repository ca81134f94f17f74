"""Speeds of a 3 x 3 convolution's forward, input-gradient and filter-gradient
kernels on this CPU, per shape, timed alone (median of repeated calls).

The time model orders the CPU's two gradient streams with one speed per
kernel family, taken from ``memscope.calibrate`` on one shape (16 x 56 x 56 x
64 -> 64, stride 1). This shows how far other shapes are from that ratio::

    python -m benchmarks.conv_gradient_speeds
    python -m benchmarks.conv_gradient_speeds --shape 64,16,16,64,128,2
"""

from __future__ import annotations

import argparse
import statistics
import time

#: batch, height, width, input channels, output channels, stride
DEFAULT_SHAPES = [
    (16, 56, 56, 64, 64, 1),  # the calibration's convolution
    (64, 64, 64, 3, 32, 2),  # benchmarks.zoo.multihead's three convolutions
    (64, 32, 32, 32, 64, 2),
    (64, 16, 16, 64, 128, 2),
]


def _median_ms(fn, repeats: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def speeds(shape: tuple[int, ...], repeats: int = 30) -> dict[str, float]:
    """GFLOP/s of the forward, input-gradient and filter-gradient kernels."""
    import tensorflow as tf

    batch, height, width, cin, cout, stride = shape
    x = tf.random.normal((batch, height, width, cin))
    w = tf.random.normal((3, 3, cin, cout))
    strides = [1, stride, stride, 1]
    dy = tf.random.normal(tf.nn.conv2d(x, w, stride, "SAME").shape)
    forward = tf.function(lambda: tf.nn.conv2d(x, w, stride, "SAME"))
    inputs = tf.function(lambda: tf.raw_ops.Conv2DBackpropInput(
        input_sizes=tf.constant(x.shape.as_list()), filter=w, out_backprop=dy,
        strides=strides, padding="SAME"))
    filters = tf.function(lambda: tf.raw_ops.Conv2DBackpropFilter(
        input=x, filter_sizes=tf.constant(w.shape.as_list()), out_backprop=dy,
        strides=strides, padding="SAME"))
    flops = 2 * batch * dy.shape[1] * dy.shape[2] * cout * 9 * cin
    return {name: flops / _median_ms(fn, repeats) / 1e6
            for name, fn in (("forward", forward), ("input gradient", inputs),
                             ("filter gradient", filters))}


def main(argv: list[str] | None = None) -> None:
    from tabulate import tabulate

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", default=None,
                        help="batch,height,width,in,out,stride (repeatable)")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    shapes = ([tuple(int(v) for v in s.split(",")) for s in args.shape] if args.shape
              else DEFAULT_SHAPES)
    rows = []
    for shape in shapes:
        got = speeds(shape, args.repeats)
        rows.append([" x ".join(map(str, shape[:4])) + f" -> {shape[4]}, stride {shape[5]}",
                     *(f"{v:.0f}" for v in got.values()),
                     f"{got['input gradient'] / got['filter gradient']:.2f}"])
    print(tabulate(rows, headers=["convolution", "forward GFLOP/s", "input grad",
                                  "filter grad", "input / filter"]))


if __name__ == "__main__":
    main()
