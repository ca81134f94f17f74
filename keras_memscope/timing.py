"""Where training time goes: a roofline per operation, and calibration.

Each primitive op of the simulated step takes ``max(FLOPs / peak FLOP/s,
bytes moved / bandwidth) + a fixed per-op overhead``; the backward pass runs
one gradient kernel per wanted gradient. The optimizer update of each weight
reads and writes the weight, its gradient and its slots. Ops run one after
the other (the model does not credit TensorFlow's inter-op parallelism).

``calibrate`` measures this machine's device instead of trusting a datasheet:
a large float32 matmul and a 3x3 convolution for FLOP/s, an element-wise add
over 128 MiB arrays for bandwidth, and a chain of tiny ops for the per-op
overhead. One multiply-accumulate (MAC) is two FLOPs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

from .devices import DeviceProfile, get_device, register_calibration
from .schedule import PrimCost

#: Per-op overhead assumed for GPUs when not calibrated: TensorFlow's executor
#: dispatch plus a kernel launch.
GPU_OP_OVERHEAD_S = 10e-6


@dataclasses.dataclass(frozen=True)
class LayerTime:
    forward_flops: int
    backward_input_flops: int
    backward_weight_flops: int
    forward_time_s: float
    backward_time_s: float
    bytes_moved: int


def has_timing(profile: DeviceProfile) -> bool:
    return bool(profile.peak_flops) and bool(profile.bandwidth_bytes_s)


def _peak(profile: DeviceProfile, dtype: str) -> float:
    flops = profile.peak_flops
    if dtype in flops:
        return float(flops[dtype])
    return float(flops.get("float32", max(flops.values())))


def _overhead(profile: DeviceProfile) -> float:
    if profile.op_overhead_s is not None:
        return profile.op_overhead_s
    return GPU_OP_OVERHEAD_S if profile.kind == "gpu" else 0.0


def _bandwidth(profile: DeviceProfile, nbytes: float, kernels: int) -> float:
    """Bytes per second for an op moving ``nbytes``: the cache's bandwidth when
    one kernel's data fits the last-level cache, the memory's otherwise."""
    per_kernel = nbytes / max(kernels, 1)
    if (profile.cache_bytes and profile.cache_bandwidth_bytes_s
            and per_kernel <= profile.cache_bytes):
        return float(profile.cache_bandwidth_bytes_s)
    return float(profile.bandwidth_bytes_s or 1)


_GEMM_SIZES = (16, 64, 256, 2048)

#: FLOP/s of oneDNN's reference convolution filter gradient in float16 (both
#: threads), where the CPU runs it (``devices.cpu_reference_kernels``):
#: measured on an Intel Xeon with AVX512_FP16 (no AMX-FP16), 0.40-0.46
#: GFLOP/s alone for five 3 x 3 filter gradients from 3 -> 32 channels over
#: 64 x 64 maps at batch 8 to 64 -> 128 over 16 x 16 at batch 4 (the best of
#: three runs each): a rate of FLOPs whatever the shape. ``calibrate``
#: measures it where the CPU runs it.
REFERENCE_KERNEL_FLOPS = 0.42e9


#: A matmul's gradients are products of their own shapes: the input gradient
#: multiplies by a transposed operand (``dy @ W^T``), the weight gradient
#: contracts over the rows (``x^T @ dy``); with few rows both run well below
#: the forward product's speed (measured by ``calibrate``).
MATMUL_GRAD_FAMILIES = ("matmul_input_grad", "matmul_weight_grad")


#: The kernel families of the input and weight gradients of the prims whose
#: gradients run as kernels of their own (a transposed convolution's input
#: gradient is a forward convolution).
GRADIENT_FAMILIES = {"conv": ("conv_input_grad", "conv_filter_grad"),
                     "conv_transpose": ("conv", "conv_filter_grad"),
                     "matmul": MATMUL_GRAD_FAMILIES}


def matmul_rate(profile: DeviceProfile, min_dim: int, family: str = "matmul") -> float | None:
    """Calibrated FLOP/s of a matmul (or one of its gradients, ``family``)
    whose smallest dimension is ``min_dim``, interpolated in log-space
    between the calibrated shapes; a gradient family without calibrated
    points uses the forward product's."""
    import math

    points = [(n, profile.rates[f"{family}@{n}"]) for n in _GEMM_SIZES
              if f"{family}@{n}" in profile.rates]
    if not points and family != "matmul":
        return matmul_rate(profile, min_dim)
    if not points or min_dim <= 0:
        return profile.rates.get(family, profile.rates.get("matmul"))
    if min_dim <= points[0][0]:
        return points[0][1] * min_dim / points[0][0]
    for (n0, r0), (n1, r1) in zip(points, points[1:]):
        if min_dim <= n1:
            t = (math.log(min_dim) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return math.exp(math.log(r0) + t * (math.log(r1) - math.log(r0)))
    return points[-1][1]


def op_time(flops: float, nbytes: float, profile: DeviceProfile, dtype: str = "float32",
            kernels: int = 1, family: str = "", min_dim: int = 0) -> float:
    """Roofline time of ``kernels`` kernels doing ``flops`` and moving ``nbytes``.

    ``family`` picks a calibrated rate (``profile.rates``) for the compute
    part, and for ``"reduce"`` the bandwidth of reductions across the batch.
    """
    if kernels <= 0:
        return 0.0
    special = f"{family}:{dtype}"
    if special in profile.rates or special in profile.reference_kernels:
        # a kernel of its own for this type (a library's reference loops)
        rate = profile.rates.get(special, REFERENCE_KERNEL_FLOPS)
        return flops / rate + kernels * _overhead(profile)
    if family == "matmul" or family in MATMUL_GRAD_FAMILIES:
        rate = matmul_rate(profile, min_dim, family)
    else:
        rate = profile.rates.get(family) if family and family != "reduce" else None
    peak = _peak(profile, dtype)
    compute = flops / (min(rate, peak) if rate and dtype == "float32" else peak)
    memory = nbytes / _bandwidth(profile, nbytes, kernels)
    if family == "reduce" and "reduce" in profile.rates:
        memory = max(memory, nbytes / profile.rates["reduce"])
    return max(compute, memory) + kernels * _overhead(profile)


def conv_lane_factor(out_channels: int, profile: DeviceProfile) -> float:
    """How many times its multiply-accumulates a convolution's forward and
    filter-gradient kernels take on this device: oneDNN's CPU kernels work on
    a vector of output channels at a time (16 floats with AVX-512, 8 with
    AVX2), so a convolution into fewer takes as long as one into a full
    vector. Measured here (AVX-512; 16 x 64 x 64 x 32 inputs): a 3 x 3
    convolution's forward 3.4-4.3 ms and filter gradient 3.6-4.8 ms for 1 to
    16 output channels, 7.8 and 8.3 ms for 32; a 1 x 1's 0.8-1.9 and
    0.9-1.5 ms for 1 to 16, 2.0 and 2.0 ms for 32. Its input gradient runs
    over the input's channels and is not affected. 1 elsewhere, and for
    other prims (``out_channels`` 0)."""
    if profile.kind != "cpu" or out_channels <= 0:
        return 1.0
    from .devices import cpu_float_lanes, cpu_uses_onednn

    if not cpu_uses_onednn():
        return 1.0
    return max(1.0, cpu_float_lanes() / out_channels)


def first_touch_time(allocations: Iterable[int], profile: DeviceProfile) -> float:
    """Seconds spent touching new pages for the allocations that get them
    (``DeviceProfile.fresh_pages_above``)."""
    above, speed = profile.fresh_pages_above, profile.first_touch_bytes_s
    if above is None or not speed:
        return 0.0
    return sum(n for n in allocations if n > above) / speed


def layer_times(costs: Iterable[PrimCost], profile: DeviceProfile,
                dtypes: dict[int, str]) -> dict[int, LayerTime]:
    """Sum the prims of each layer call (by layer index) into FLOPs and times."""
    acc: dict[int, list[float]] = {}
    for c in costs:
        a = acc.setdefault(c.layer_index, [0, 0, 0, 0.0, 0.0, 0])
        dtype = dtypes.get(c.layer_index, "float32")
        a[0] += c.forward_flops
        a[1] += c.backward_input_flops
        a[2] += c.backward_weight_flops
        a[5] += c.forward_bytes + c.backward_bytes
        if not c.forward_flops and not c.forward_bytes:
            continue  # a view: no kernel runs
        fwd_t = forward_seconds(c, profile, dtype)
        a[3] += fwd_t
        if c.recomputed:  # run again before its gradients
            a[4] += fwd_t
        if not (c.backward_input_flops or c.backward_weight_flops or c.backward_bytes):
            continue
        a[4] += first_touch_time(c.backward_allocs, profile)
        a[4] += sum(backward_seconds(c, profile, dtype))
    return {k: LayerTime(int(v[0]), int(v[1]), int(v[2]), v[3], v[4], int(v[5]))
            for k, v in acc.items()}


def forward_seconds(c: PrimCost, profile: DeviceProfile, dtype: str = "float32") -> float:
    """Roofline seconds of a prim's forward kernel, with the first touch of
    the buffers it writes."""
    if not c.forward_flops and not c.forward_bytes:
        return 0.0  # a view: no kernel runs
    lanes = conv_lane_factor(c.out_channels, profile)  # (1 but for convolutions)
    family = "conv_input_grad" if c.kernel == "conv_transpose" else c.kernel
    return op_time(c.forward_flops * lanes, c.forward_bytes, profile, dtype,
                   family=family, min_dim=c.gemm_min_dim) + first_touch_time(
        c.forward_allocs, profile)


def backward_seconds(c: PrimCost, profile: DeviceProfile,
                     dtype: str = "float32") -> tuple[float, float]:
    """Roofline seconds of a prim's gradients with respect to activations and
    to weights. Convolutions and matmuls run each as its own kernel at its own
    speed, each moving its share of the bytes; other prims' one kernel time is
    split by FLOPs."""
    bwd_flops = c.backward_input_flops + c.backward_weight_flops
    if not (bwd_flops or c.backward_bytes):
        return 0.0, 0.0
    parts = (c.backward_input_flops, c.backward_weight_flops)
    if c.conv_gemm and "conv_gemm" in profile.rates and dtype == "float32":
        # TensorFlow's own kernels: each gradient a contraction of its own shape
        filt, inp = conv_gradient_products(*c.conv_gemm)
        bandwidth = _bandwidth(profile, c.backward_bytes, 2)
        return tuple(
            max(part / contraction_rate(*dims, gradient),
                c.backward_bytes * part / bwd_flops / bandwidth) + _overhead(profile)
            if part else 0.0
            for part, dims, gradient in zip(parts, (inp, filt), ("input", "filter")))
    if c.kernel in GRADIENT_FAMILIES and bwd_flops:
        families = GRADIENT_FAMILIES[c.kernel]
        # (a convolution's filter gradient works on its output channels too)
        scale = (1.0, conv_lane_factor(c.out_channels, profile))
        t_in, t_w = (op_time(part * k, c.backward_bytes * part / bwd_flops, profile, dtype,
                             family=family, min_dim=c.gemm_min_dim) if part else 0.0
                     for part, family, k in zip(parts, families, scale))
        transposed_rate = profile.rates.get("transposed_read")
        if transposed_rate:
            # reading an operand transposed: the time beyond the same product
            # untransposed (TensorFlow's own CPU kernels)
            t_in += c.backward_input_transposed / transposed_rate
            t_w += c.backward_weight_transposed / transposed_rate
        read_rate = profile.rates.get("gemm_read")
        if read_rate:
            # a thin product's time is its reading of its operands
            t_in = max(t_in, c.backward_input_reads / read_rate
                       + c.backward_input_transposed / (transposed_rate or math.inf))
            t_w = max(t_w, c.backward_weight_reads / read_rate
                      + c.backward_weight_transposed / (transposed_rate or math.inf))
        return t_in, t_w
    kernels = (parts[0] > 0) + (parts[1] > 0)
    total = op_time(bwd_flops, c.backward_bytes, profile, dtype, max(kernels, 1),
                    family=c.kernel, min_dim=c.gemm_min_dim)
    if not bwd_flops:
        return total, 0.0
    return total * parts[0] / bwd_flops, total * parts[1] / bwd_flops


#: Eigen's tensor contractions of a convolution's two gradients on the CPU's
#: threads, where TensorFlow runs its own kernels: the FLOP/s of an ``M x K``
#: by ``K x N`` product, ``R0 x M/(M+m0) x N/(N+n0) x K/(K+k0)``, as ``(R0,
#: m0, n0, k0)`` for the filter gradient's one product and for the input
#: gradient's per image (``conv_gradient_products``; each beside an im2col
#: or col2im copy). Fitted to both gradients of convolutions timed alone on
#: a 2-core AMD EPYC with AVX2 (``python -m benchmarks.conv_gradient_speeds
#: --fit``: three runs, of 24 shapes twice and 34 once; median errors 21%
#: and 15%), where the filter gradient took 0.23-6.6 times as long as the
#: input gradient with the shape (its last dimension the output channels,
#: the input gradient's rows one image's positions), and the nominal speeds
#: make it 1.55 times as long every time (58.9 GFLOP/s against 104.1,
#: capped at the 91.1 peak). Tried, not adopted (benchmarks/RESULTS.md): it
#: orders most of ResNet-50's layers as its step does, but a memory-bound
#: convolution into a few channels splits the other way round in the step
#: than alone.
CONV_GRADIENT_CONTRACTIONS = {"filter": (153.3e9, 32, 96, 128), "input": (170.0e9, 192, 64, 32)}
#: Order a convolution's gradients by :data:`CONV_GRADIENT_CONTRACTIONS`
#: where TensorFlow runs its own CPU kernels and the CPU is not calibrated
#: (``ordering_profile``).
CONV_GEMM_SHAPES = False


def conv_gradient_products(batch: int, image: int, filter_total: int, out_channels: int
                           ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """``(M, N, K)`` of the products TensorFlow's own CPU kernels compute a
    2-D convolution's filter and input gradients with (conv_grad_filter_ops.cc,
    conv_grad_input_ops.h): the filter gradient ``col^T @ dy``, ``filter_total
    x out_channels`` contracting over every image's positions; the input
    gradient ``dy @ W^T`` per image, ``image x filter_total`` contracting over
    the output channels, one image at a time on all threads, or (where one
    image's product is small, ``rules.conv.input_gradient_parallel``) the
    images shared out among the threads (as one product of all their rows)."""
    from .rules.conv import input_gradient_parallel

    rows = image if input_gradient_parallel(batch, image, filter_total, out_channels) \
        else batch * image
    return (filter_total, out_channels, batch * image), (rows, filter_total, out_channels)


def contraction_rate(m: int, n: int, k: int, gradient: str) -> float:
    """FLOP/s of a convolution's ``gradient`` (``"filter"`` or ``"input"``)
    as an ``m x k`` by ``k x n`` product (:data:`CONV_GRADIENT_CONTRACTIONS`)."""
    r0, m0, n0, k0 = CONV_GRADIENT_CONTRACTIONS[gradient]
    return r0 * m / (m + m0) * n / (n + n0) * k / (k + k0)


#: Speeds that only order the two gradient streams of a CPU (which kernel ends
#: first) when the CPU is not calibrated: one calibration of a 2-core x86-64
#: machine (tensorflow-cpu 2.21; ``memscope.calibrate``, benchmarks/RESULTS.md),
#: where a 3x3 convolution's filter gradient ran at 59 GFLOP/s and its input
#: gradient at 104. No time is reported from them.
NOMINAL_CPU_SPEEDS: dict[str, Any] = {
    "peak_flops": {"float32": 91.1e9},
    "bandwidth_bytes_s": 17.6e9,
    "op_overhead_s": 1.8e-6,
    "rates": {"matmul": 91.1e9, "conv": 86.7e9, "conv_filter_grad": 58.9e9,
              "conv_input_grad": 104.1e9, "reduce": 3.6e9},
}


#: Bytes per second at which TensorFlow's own CPU kernels (not oneDNN's)
#: read a batched product's operand transposed, beyond reading it as
#: stored: a thin product (64 or 128 matrices of 256 x 256 by 256 x 8)
#: took 5.0-10.4 ms more with ``adjoint_a`` or ``adjoint_b`` on its large
#: operand than without, 3.2-3.6 GB/s over three runs on a 2-core AMD EPYC
#: with AVX2 (``benchmarks/matmul_forms.py``); oneDNN's kernels read it as
#: fast either way. Added to the nominal speeds where TensorFlow runs its
#: own kernels; ``calibrate`` measures it. A Dense layer's input gradient
#: ``dy @ W^T`` reads its kernel so: on the AVX2 EPYC with 1 MiB of L2 it
#: took the kernel's bytes at 2.1-2.6 GB/s longer than ``x @ W`` for VGG16's
#: fc1 and fc2 kernels at batches 8 and 64 (``benchmarks/
#: dense_gradient_speeds.py``: fc1 at batch 8, 216 ms against 33); counted
#: only with ``tfgraph.DENSE_TRANSPOSED_READS`` (tried, not adopted).
NOMINAL_TRANSPOSED_READ_BYTES_S = 3.4e9
#: Bytes per second at which TensorFlow's own CPU kernels read the operands
#: of a thin batched product: attention's gradient for ``v`` (Keras'
#: Einsum, 128 matrices of 8 x 256 by 256 x 256 at batch 32, reading the
#: 32 MiB ``probs`` as stored) took 8.1-9.1 ms at the fastest in each of
#: six runs on a 2-core AMD EPYC with AVX2 (3.8-4.3 GB/s), the gradient for
#: ``probs`` (an outer product writing 32 MiB) 3.9-5.3 (``benchmarks/
#: matmul_forms.py``):
#: reading a product's operand runs at about half the speed of writing its
#: result. A gradient of a product of two activations takes at least the
#: time to read what it reads at this rate (``backward_seconds``), where
#: TensorFlow runs its own kernels; oneDNN's took 2.2-4.3 ms for every form.
NOMINAL_GEMM_READ_BYTES_S = 3.9e9


def ordering_profile(profile: DeviceProfile) -> DeviceProfile:
    """``profile`` where it has speeds, else it with :data:`NOMINAL_CPU_SPEEDS`
    (and, where TensorFlow runs its own CPU kernels,
    :data:`NOMINAL_TRANSPOSED_READ_BYTES_S` and
    :data:`NOMINAL_GEMM_READ_BYTES_S`). ``calibrate`` measures the first,
    not the second: a calibrated profile runs a product's two gradients one
    after the other (``schedule.PRODUCT_GRADIENTS_SIDE_BY_SIDE``)."""
    if has_timing(profile):
        return profile
    speeds = dict(NOMINAL_CPU_SPEEDS)
    from .devices import cpu_uses_onednn

    if profile.kind == "cpu" and not cpu_uses_onednn():
        speeds["rates"] = {**speeds["rates"], "transposed_read": NOMINAL_TRANSPOSED_READ_BYTES_S,
                           "gemm_read": NOMINAL_GEMM_READ_BYTES_S}
        if CONV_GEMM_SHAPES:
            speeds["rates"]["conv_gemm"] = 1.0  # (a flag: CONV_GRADIENT_CONTRACTIONS)
    return dataclasses.replace(profile, **speeds)


def update_time(variable_bytes: Sequence[int], kernels_per_variable: int,
                profile: DeviceProfile,
                allocations_per_variable: int | Sequence[int] = 0) -> float:
    """The optimizer's updates: for each trainable variable, that many
    element-wise kernels, each reading and writing variable-sized data, of
    which ``allocations_per_variable`` (one count, or one per variable) write
    new variable-sized buffers."""
    counts = (list(allocations_per_variable) if isinstance(allocations_per_variable, Sequence)
              else [allocations_per_variable] * len(variable_bytes))
    total = 0.0
    for nbytes, allocations in zip(variable_bytes, counts):
        moved = 2 * nbytes * kernels_per_variable
        flops = kernels_per_variable * nbytes // 4
        total += op_time(flops, moved, profile, "float32", kernels=kernels_per_variable)
        total += first_touch_time([nbytes] * allocations, profile)
    return total


# --- calibration ---------------------------------------------------------------


def _last_level_cache_bytes() -> int:
    from pathlib import Path

    best = 8 << 20
    try:
        for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 1024, "M": 1024**2}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KM")) * scale)
    except (OSError, ValueError):
        pass
    return best


def _best_time(fn: Any, repeats: int) -> float:
    fn()  # warm-up (traces)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def calibrate(device: str | DeviceProfile = "cpu", *, repeats: int = 5) -> DeviceProfile:
    """Measure this machine's FLOP/s, bandwidth and per-op overhead.

    Returns the device's profile with the measured figures; later
    ``get_device("cpu")`` (or ``"gpu"``) in this process returns it too, so
    ``estimate(..., device="cpu")`` reports calibrated times. Takes a few
    seconds.
    """
    import tensorflow as tf

    profile = get_device(device)
    if profile.kind == "gpu" and not tf.config.list_physical_devices("GPU"):
        raise ValueError("no GPU on this machine to calibrate; calibrate device='cpu', or use "
                         "a catalogue GPU profile (datasheet figures)")
    dev = "/GPU:0" if profile.kind == "gpu" else "/CPU:0"
    with tf.device(dev):
        n = 2048
        a = tf.random.normal((n, n))
        b = tf.random.normal((n, n))
        # each function returns one element, so that reading it waits for the
        # work without copying a large result
        mm = tf.function(lambda: tf.matmul(a, b)[0, 0])
        t_mm = _best_time(lambda: mm().numpy(), repeats)
        skinny = {}
        for m in _GEMM_SIZES[:-1]:
            left = tf.random.normal((m, n))
            f = tf.function(lambda left=left: tf.matmul(left, b)[0, 0])
            skinny[f"matmul@{m}"] = 2 * m * n * n / _best_time(lambda f=f: f().numpy(), repeats)
            # the gradients of x @ W with m rows: dy @ W^T and x^T @ dy
            dx = tf.function(lambda left=left: tf.matmul(left, b, transpose_b=True)[0, 0])
            dw = tf.function(lambda left=left: tf.matmul(left, left, transpose_a=True)[0, 0])
            skinny[f"matmul_input_grad@{m}"] = (
                2 * m * n * n / _best_time(lambda f=dx: f().numpy(), repeats))
            skinny[f"matmul_weight_grad@{m}"] = (
                2 * m * n * n / _best_time(lambda f=dw: f().numpy(), repeats))
        # a thin batched product reading its large operand as stored, and
        # transposed (``adjoint_a``): TensorFlow's own kernels take longer
        stack = tf.random.normal((64, 256, 256))
        thin = tf.random.normal((64, 256, 8))
        stored = tf.function(lambda: tf.matmul(stack, thin)[0, 0, 0])
        t_stored = _best_time(lambda: stored().numpy(), repeats)
        across = tf.function(lambda: tf.matmul(stack, thin, adjoint_a=True)[0, 0, 0])
        t_across = _best_time(lambda: across().numpy(), repeats)
        if t_across > 1.25 * t_stored:
            skinny["transposed_read"] = 4 * 64 * 256 * 256 / (t_across - t_stored)
        x = tf.random.normal((16, 56, 56, 64))
        k = tf.random.normal((3, 3, 64, 64))
        conv = tf.function(lambda: tf.nn.conv2d(x, k, 1, "SAME")[0, 0, 0, 0])
        t_conv = _best_time(lambda: conv().numpy(), repeats)
        g = tf.random.normal((16, 56, 56, 64))
        filt = tf.function(lambda: tf.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=[3, 3, 64, 64], out_backprop=g, strides=[1, 1, 1, 1],
            padding="SAME")[0, 0, 0, 0])
        t_filt = _best_time(lambda: filt().numpy(), repeats)
        reference = {}
        if "conv_filter_grad:float16" in profile.reference_kernels:
            # oneDNN's reference loops: a small one (9.4 MFLOP, ~20 ms)
            x16 = tf.cast(x[:1, :16, :16, :32], tf.float16)
            g16 = tf.cast(g[:1, :16, :16, :64], tf.float16)
            filt16 = tf.function(lambda: tf.raw_ops.Conv2DBackpropFilter(
                input=x16, filter_sizes=[3, 3, 32, 64], out_backprop=g16,
                strides=[1, 1, 1, 1], padding="SAME")[0, 0, 0, 0])
            reference["conv_filter_grad:float16"] = (
                2 * 16 * 16 * 32 * 64 * 9 / _best_time(lambda: filt16().numpy(), repeats))
        inp = tf.function(lambda: tf.raw_ops.Conv2DBackpropInput(
            input_sizes=[16, 56, 56, 64], filter=k, out_backprop=g, strides=[1, 1, 1, 1],
            padding="SAME")[0, 0, 0, 0])
        t_inp = _best_time(lambda: inp().numpy(), repeats)
        r = tf.random.normal((8, 112, 112, 64))
        red = tf.function(lambda: tf.reduce_mean(r, axis=[0, 1, 2])[0])
        t_red = _best_time(lambda: red().numpy(), repeats)
        # chained adds write in place (TensorFlow forwards the buffer), as a
        # training step does once its allocator has warmed up: no page faults
        big = 32 * 1024 * 1024
        u = tf.random.normal((big,))
        v = tf.random.normal((big,))

        @tf.function
        def big_adds() -> Any:
            y = u + v
            for _ in range(9):
                y = y + v
            return y[0]

        t_add = _best_time(lambda: big_adds().numpy(), repeats) / 10

        # one kernel writing a new buffer of the same size: with TensorFlow's
        # default CPU allocator its pages are new at every call
        @tf.function
        def fresh_square(a: Any) -> Any:
            return tf.square(a)[0]

        t_fresh = _best_time(lambda: fresh_square(u).numpy(), repeats)
        # the same at 16 MiB: malloc's mapping threshold moves below its
        # 32 MiB ceiling with the allocation history
        mid = 4 * 1024 * 1024
        w = tf.random.normal((mid,))
        t_fresh_mid = _best_time(lambda: fresh_square(w).numpy(), repeats)
        # the same over arrays that stay in the last-level cache, many times
        cache = _last_level_cache_bytes()
        small_n = max(1024, cache // 4 // 4 // 4)  # three arrays in a quarter of it
        us = tf.random.normal((small_n,))
        vs = tf.random.normal((small_n,))

        @tf.function
        def cached_adds() -> Any:
            y = us
            for _ in range(50):
                y = y + vs
            return y[0]

        t_cached = _best_time(lambda: cached_adds().numpy(), repeats)

        small = tf.random.normal((8,))

        @tf.function
        def chain() -> Any:
            y = small
            for _ in range(200):
                y = y + 1.0
            return y

        t_chain = _best_time(lambda: chain().numpy(), repeats)
    matmul_flops = 2 * n**3 / t_mm
    conv_work = 2 * 16 * 56 * 56 * 64 * (3 * 3 * 64)
    conv_flops = conv_work / t_conv
    rates = {"matmul": matmul_flops, "conv": conv_flops,
             "conv_filter_grad": conv_work / t_filt, "conv_input_grad": conv_work / t_inp,
             "reduce": 8 * 112 * 112 * 64 * 4 / t_red,
             **skinny, f"matmul@{n}": matmul_flops, **reference}
    bandwidth = 3 * big * 4 / t_add
    overhead = t_chain / 200
    # the time beyond reading and writing the data is touching new pages
    touch_s = t_fresh - 2 * big * 4 / bandwidth
    first_touch = (big * 4 / touch_s if profile.fresh_pages_above is not None
                   and touch_s > 0.05 * t_fresh else None)
    fresh_above = profile.fresh_pages_above
    if first_touch and fresh_above is not None:
        # a 16 MiB buffer paying for its pages too: the threshold is below it
        touch_mid = t_fresh_mid - 2 * mid * 4 / bandwidth
        if touch_mid > 0.5 * mid * 4 / first_touch:
            fresh_above = min(fresh_above, mid * 4 - 1)
    cached_bytes = 3 * small_n * 4  # what one cached kernel moved
    cache_bandwidth = max(bandwidth, 50 * cached_bytes / max(t_cached - 50 * overhead, 1e-9))
    flops = {"float32": max(matmul_flops, conv_flops)}
    calibrated = dataclasses.replace(
        profile,
        peak_flops={**profile.peak_flops, **flops},
        bandwidth_bytes_s=bandwidth,
        # the cache speed holds for the data calibrated at it, not for any
        # kernel whose data would fit the cache on paper
        cache_bytes=cached_bytes if profile.kind == "cpu" else None,
        cache_bandwidth_bytes_s=cache_bandwidth if profile.kind == "cpu" else None,
        op_overhead_s=overhead,
        rates=rates,
        first_touch_bytes_s=first_touch,
        fresh_pages_above=fresh_above if first_touch else None,
        source=(f"calibrated on this machine: matmul {matmul_flops / 1e9:.1f} GFLOP/s, 3x3 "
                f"conv {conv_flops / 1e9:.1f} (filter gradient "
                f"{rates['conv_filter_grad'] / 1e9:.1f}, input gradient "
                f"{rates['conv_input_grad'] / 1e9:.1f}) GFLOP/s, reductions over the batch "
                f"{rates['reduce'] / 1e9:.1f} GB/s, element-wise "
                f"{bandwidth / 1e9:.1f} GB/s ({cache_bandwidth / 1e9:.1f} GB/s within the "
                f"{cache >> 20} MiB cache, for kernels moving up to {cached_bytes >> 20} MiB), "
                f"{overhead * 1e6:.1f} us per op"
                + (f", an operand read transposed adds 1 s per "
                   f"{rates['transposed_read'] / 1e9:.1f} GB" if "transposed_read" in rates
                   else "")
                + "".join(f", {key.split(':')[1]} {key.split(':')[0].replace('_', ' ')} "
                          f"(a reference kernel) {rate / 1e9:.2f} GFLOP/s"
                          for key, rate in reference.items())
                + (f", new pages touched at {first_touch / 1e9:.1f} GB/s for buffers above "
                   f"{(fresh_above or 0) / 2**20:.0f} MiB" if first_touch else "") + "; "
                + profile.source),
    )
    register_calibration(calibrated)
    return calibrated
