"""Speeds of a convolution's forward, input-gradient and filter-gradient
kernels on this CPU, per shape, timed alone (median of repeated calls).

The time model orders the CPU's two gradient streams with one speed per
kernel family, taken from ``memscope.calibrate`` on one shape (16 x 56 x 56 x
64 -> 64, stride 1). This shows how far other shapes are from that ratio::

    python -m benchmarks.conv_gradient_speeds
    python -m benchmarks.conv_gradient_speeds --shape 64,16,16,64,128,2
    python -m benchmarks.conv_gradient_speeds --fit [--runs 3]
    python -m benchmarks.conv_gradient_speeds --in-step resnet50 --batch 16 --optimizer sgd

Where TensorFlow runs its own CPU kernels (not oneDNN's), both gradients are
an Eigen tensor contraction beside an im2col or col2im copy
(``conv_grad_filter_ops.cc``, ``conv_grad_input_ops.h``): the filter
gradient one product of ``filter_total x (batch x image)`` by ``(batch x
image) x out``, the input gradient one product of ``image x out`` by
``out x filter_total`` per image (on all threads; or, where one image's
product is small, images shared out among the threads, each a single-threaded
product). ``--fit`` fits ``timing.CONV_GRADIENT_CONTRACTIONS``' model of
such a product's speed, ``R0 x M/(M+m0) x N/(N+n0) x K/(K+k0)`` for ``M x
K`` by ``K x N``, to each gradient's measured speeds over the shapes, and
prints each shape's errors and its two gradients' time ratio, measured and
modelled.
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import statistics
import time

#: batch, height, width, input channels, output channels, stride[, kernel size]
DEFAULT_SHAPES = [
    (16, 56, 56, 64, 64, 1),  # the calibration's convolution
    (64, 64, 64, 3, 32, 2),  # benchmarks.zoo.multihead's three convolutions
    (64, 32, 32, 32, 64, 2),
    (64, 16, 16, 64, 128, 2),
]
#: the shapes ``--fit`` times by default: ResNet-style 3 x 3 and 1 x 1
#: convolutions from 7 x 7 to 112 x 112 and 32 to 1024 channels, strided
#: ones, 1-D ones (height 1), and ones into or out of 1 to 16 channels
FIT_SHAPES = [
    (16, 56, 56, 64, 64, 1, 3), (8, 32, 32, 64, 128, 2, 3), (8, 16, 16, 128, 128, 1, 3),
    (16, 28, 28, 128, 128, 1, 3), (16, 14, 14, 256, 256, 1, 3), (16, 7, 7, 512, 512, 1, 3),
    (16, 56, 56, 64, 256, 1, 1), (16, 28, 28, 512, 128, 1, 1), (16, 14, 14, 1024, 256, 1, 1),
    (16, 14, 14, 256, 1024, 1, 1), (8, 64, 64, 3, 32, 2, 3), (64, 32, 32, 32, 64, 2, 3),
    (64, 16, 16, 64, 128, 2, 3), (8, 112, 112, 32, 32, 1, 3), (32, 28, 28, 32, 32, 1, 3),
    (4, 56, 56, 128, 128, 1, 3), (16, 1, 1975, 64, 64, 1, 1), (16, 1, 4000, 32, 64, 1, 5),
    (32, 8, 8, 256, 256, 1, 3), (8, 28, 28, 64, 64, 1, 3), (32, 14, 14, 64, 128, 1, 3),
    (8, 7, 7, 1024, 2048, 1, 1), (8, 56, 56, 32, 16, 1, 3), (16, 1, 512, 128, 128, 1, 3),
    # few output channels (a segmentation head, an image or mask out) or
    # few input ones (an RGB or mono image in)
    (8, 64, 64, 64, 5, 1, 1), (8, 64, 64, 32, 3, 1, 3), (16, 28, 28, 32, 1, 1, 3),
    (8, 32, 32, 3, 16, 1, 3), (32, 32, 32, 3, 32, 1, 3), (8, 128, 128, 16, 1, 1, 1),
    (8, 32, 32, 96, 32, 1, 1), (8, 32, 32, 32, 32, 1, 3), (64, 28, 28, 1, 32, 1, 3),
    (8, 64, 64, 32, 64, 1, 1),
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


def _parse(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape with its kernel size (3 where not given)."""
    return tuple(shape) + (3,) * (7 - len(shape))


def speeds(shape: tuple[int, ...], repeats: int = 30) -> dict[str, float]:
    """GFLOP/s of the forward, input-gradient and filter-gradient kernels
    (and the products' dimensions, for ``--fit``)."""
    import tensorflow as tf

    batch, height, width, cin, cout, stride, size = _parse(shape)
    x = tf.random.normal((batch, height, width, cin))
    w = tf.random.normal((1 if height == 1 else size, size, cin, cout))
    strides = [1, stride, stride, 1]
    dy = tf.random.normal(tf.nn.conv2d(x, w, stride, "SAME").shape)
    forward = tf.function(lambda: tf.nn.conv2d(x, w, stride, "SAME"))
    inputs = tf.function(lambda: tf.raw_ops.Conv2DBackpropInput(
        input_sizes=tf.constant(x.shape.as_list()), filter=w, out_backprop=dy,
        strides=strides, padding="SAME"))
    filters = tf.function(lambda: tf.raw_ops.Conv2DBackpropFilter(
        input=x, filter_sizes=tf.constant(w.shape.as_list()), out_backprop=dy,
        strides=strides, padding="SAME"))
    image = dy.shape[1] * dy.shape[2]
    filter_total = w.shape[0] * w.shape[1] * cin
    flops = 2 * batch * image * cout * filter_total
    got = {name: flops / _median_ms(fn, repeats) / 1e6
           for name, fn in (("forward", forward), ("input gradient", inputs),
                            ("filter gradient", filters))}
    got["dims"] = (batch, image, filter_total, cout)
    return got


def _fit(rows: list[tuple[tuple[int, int, int], float]]) -> tuple[float, float, float, float]:
    """``(R0, m0, n0, k0)`` (FLOP/s and sizes) minimising the squared log
    error of ``R0 x M/(M+m0) x N/(N+n0) x K/(K+k0)`` against the measured
    GFLOP/s
    (a grid over the three sizes, ``R0`` in closed form)."""
    grid = [0, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384]
    best = None
    for m0, n0, k0 in itertools.product(grid, repeat=3):
        logs = [math.log(r * 1e9) - math.log(m / (m + m0) * n / (n + n0) * k / (k + k0))
                for (m, n, k), r in rows]
        log_r0 = statistics.fmean(logs)
        err = sum((v - log_r0) ** 2 for v in logs)
        if best is None or err < best[0]:
            best = (err, math.exp(log_r0), m0, n0, k0)
    return best[1:]


def _nominal_ratio() -> float:
    """The filter gradient's time over the input gradient's at the nominal
    ordering speeds (the input gradient's capped at the peak)."""
    from keras_memscope import timing

    rates, peak = timing.NOMINAL_CPU_SPEEDS["rates"], timing.NOMINAL_CPU_SPEEDS["peak_flops"]
    return min(rates["conv_input_grad"], peak["float32"]) / rates["conv_filter_grad"]


def in_step(name: str, batch: int, optimizer: str, steps: int = 3) -> list[list[str]]:
    """Each Conv2D layer's filter-gradient time over its input-gradient time
    in the training step of zoo model ``name`` (medians over ``steps``
    profiled steps after a warm-up, ``benchmarks.op_timeline``'s way), beside
    ``timing.CONV_GRADIENT_CONTRACTIONS``' ratio and the nominal speeds'.
    Layers are found by their ops' name scopes (a Keras application's
    layer names; a scope that is not one layer's name is left out)."""
    import keras

    from keras_memscope import timing

    from . import zoo
    from .op_timeline import profiled_steps

    model = zoo.named(name)
    shapes = {}
    for layer in model.layers:
        if (isinstance(layer, keras.layers.Conv2D) and type(layer) is keras.layers.Conv2D
                and layer.data_format == "channels_last" and layer.groups == 1
                and tuple(layer.dilation_rate) == (1, 1)):
            out, kernel = layer.output.shape, layer.kernel.shape
            shapes[layer.name] = (batch, out[1] * out[2], kernel[0] * kernel[1] * kernel[2],
                                  kernel[3])
    events = profiled_steps(model, batch, optimizer, steps)
    times: dict[str, dict[str, list[float]]] = {}
    pattern = re.compile(r"/(\w+?)(?:_\d+)?/convolution/Conv2DBackprop(Input|Filter):")
    for step in events:
        for start, end, _, op in step:
            found = pattern.search(op)
            if found and found.group(1) in shapes:
                times.setdefault(found.group(1), {}).setdefault(found.group(2), []).append(
                    end - start)
    nominal = _nominal_ratio()
    rows = []
    for layer, got in times.items():
        if len(got) < 2:
            continue
        filt, inp = timing.conv_gradient_products(*shapes[layer])
        modelled = (timing.contraction_rate(*inp, "input")
                    / timing.contraction_rate(*filt, "filter"))
        measured = statistics.median(got["Filter"]) / statistics.median(got["Input"])
        rows.append([layer, ",".join(map(str, shapes[layer])), f"{measured:.2f}",
                     f"{modelled:.2f}", f"{nominal:.2f}"])
    return rows


def main(argv: list[str] | None = None) -> None:
    from tabulate import tabulate

    from keras_memscope import timing

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", default=None,
                        help="batch,height,width,in,out,stride[,kernel size] (repeatable)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--fit", action="store_true",
                        help="fit the contraction model to the gradients' speeds "
                             "(default shapes: FIT_SHAPES)")
    parser.add_argument("--runs", type=int, default=1,
                        help="time the shapes this many times over, one after the other, "
                             "and fit to all (the CPU's speed drifts from minute to minute)")
    parser.add_argument("--in-step", metavar="MODEL",
                        help="a zoo model's Conv2D layers in its training step instead "
                             "(with --batch and --optimizer)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (--in-step)")
    args = parser.parse_args(argv)
    if args.in_step:
        rows = in_step(args.in_step, args.batch, args.optimizer, args.steps)
        print(tabulate(rows, headers=["layer", "batch, image, filter_total, out",
                                      "filter / input time in the step", "model", "nominal"]))
        errors = {k: statistics.median(abs(math.log(float(r[k]) / float(r[2]))) for r in rows)
                  for k in (3, 4)}
        print(f"median |log| error of the ratio: model {errors[3]:.2f}, nominal {errors[4]:.2f} "
              f"({len(rows)} layers)")
        return
    shapes = ([tuple(int(v) for v in s.split(",")) for s in args.shape] if args.shape
              else FIT_SHAPES if args.fit else DEFAULT_SHAPES)
    rows, measured = [], []
    for shape in shapes * args.runs:
        got = speeds(shape, args.repeats)
        batch, image, filter_total, cout = got.pop("dims")
        b, h, w, cin, _, stride, size = _parse(shape)
        rows.append([f"{b} x {h} x {w} x {cin} -> {cout}, {size} x {size}, stride {stride}",
                     *(f"{v:.0f}" for v in got.values()),
                     f"{got['input gradient'] / got['filter gradient']:.2f}"])
        filt, inp = timing.conv_gradient_products(batch, image, filter_total, cout)
        measured.append((shape, filt, got["filter gradient"], inp, got["input gradient"]))
    print(tabulate(rows, headers=["convolution", "forward GFLOP/s", "input grad",
                                  "filter grad", "filter / input time"]))
    if not args.fit:
        return
    fitted = {"filter": _fit([(f, rf) for _, f, rf, _, _ in measured]),
              "input": _fit([(i, ri) for _, _, _, i, ri in measured])}
    for gradient, (r0, m0, n0, k0) in fitted.items():
        print(f"\n{gradient} gradient fitted: R0 {r0 / 1e9:.1f} GFLOP/s, m0 {m0}, n0 {n0}, "
              f"k0 {k0} (timing.CONV_GRADIENT_CONTRACTIONS: "
              f"{timing.CONV_GRADIENT_CONTRACTIONS[gradient]})")

    def model(dims: tuple[int, int, int], gradient: str) -> float:
        """GFLOP/s of the fitted model"""
        r0, m0, n0, k0 = fitted[gradient]
        m, n, k = dims
        return r0 / 1e9 * m / (m + m0) * n / (n + n0) * k / (k + k0)

    nominal = _nominal_ratio()
    table = []
    errors: dict[str, list[float]] = {"filter": [], "input": []}
    for shape, filt, rf, inp, ri in measured:
        mf, mi = model(filt, "filter"), model(inp, "input")
        errors["filter"].append(abs(mf / rf - 1))
        errors["input"].append(abs(mi / ri - 1))
        table.append([",".join(map(str, _parse(shape))), f"{filt}", f"{rf:.0f}", f"{mf:.0f}",
                      f"{inp}", f"{ri:.0f}", f"{mi:.0f}", f"{ri / rf:.2f}", f"{mi / mf:.2f}",
                      f"{nominal:.2f}"])
    print(tabulate(table, headers=["shape", "filter M,N,K", "GFLOP/s", "model",
                                   "input M,N,K", "GFLOP/s", "model",
                                   "filter / input time", "model", "nominal"]))
    for gradient, errs in errors.items():
        print(f"{gradient} gradient speeds' errors: median {100 * statistics.median(errs):.0f}%, "
              f"worst {100 * max(errs):.0f}%")


if __name__ == "__main__":
    main()
