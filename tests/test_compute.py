"""FLOPs with the formulas written out, TensorFlow's own count, the time model."""

import dataclasses
import math
import statistics

import keras
import pytest
import tensorflow as tf
from keras import layers

import keras_memscope as memscope
from keras_memscope.report import category_breakdown
from keras_memscope.units import human_bytes


def est(model, batch=2, **kw):
    kw.setdefault("optimizer", "sgd")
    kw.setdefault("device", "a100-40gb")
    return memscope.estimate(model, batch, **kw)


def by_name(e):
    return {r.name: r for r in e.layers}


def test_dense_forward_and_backward_flops():
    model = keras.Sequential([keras.Input((30,)), layers.Dense(20, name="d1"),
                              layers.Dense(5, name="d2")])
    r = by_name(est(model, 8))
    macs = 8 * 30 * 20
    assert r["d1"].forward_macs == macs
    # matmul (2 x MACs) plus the bias add, one FLOP per output element
    assert r["d1"].forward_flops == 2 * macs + 8 * 20
    # the first layer's input needs no gradient: no 2 x MACs for it, only the
    # bias add's gradient pass to the matmul output (one per element) ...
    assert r["d1"].backward_input_flops == 8 * 20
    # ... and the kernel (2 x MACs) and bias (one per element) gradients
    assert r["d1"].backward_weight_flops == 2 * macs + 8 * 20
    assert r["d2"].backward_input_flops == 2 * (8 * 20 * 5) + 8 * 5


def test_conv_family_macs():
    x = keras.Input((16, 16, 8))
    a = layers.DepthwiseConv2D(3, padding="same", name="dw")(x)
    b = layers.SeparableConv2D(12, 3, padding="same", name="sep")(a)
    c = layers.Conv2DTranspose(4, 3, strides=2, padding="same", name="tr")(b)
    d = layers.Conv2D(6, 3, strides=2, groups=2, name="grouped")(c)
    r = by_name(est(keras.Model(x, d), 1))
    # depthwise: out elements x k_h x k_w
    assert r["dw"].forward_macs == 16 * 16 * 8 * 3 * 3
    # separable: depthwise (16x16x8 x 9) + pointwise (16x16x12 x 8)
    assert r["sep"].forward_macs == 16 * 16 * 8 * 9 + 16 * 16 * 12 * 8
    # transposed: every input element through the kernel: 16x16x12 x (3x3x4)
    assert r["tr"].forward_macs == 16 * 16 * 12 * 3 * 3 * 4
    # grouped, strided: out elements x k_h x k_w x (in / groups); out 15x15x6
    assert r["grouped"].output_shapes == ((1, 15, 15, 6),)
    assert r["grouped"].forward_macs == 15 * 15 * 6 * 3 * 3 * (4 // 2)


def test_lstm_over_time_steps():
    t, d, u = 12, 5, 7
    model = keras.Sequential([keras.Input((t, d)), layers.LSTM(u, name="lstm")])
    r = by_name(est(model, 3))
    # per step: [x_t, h] (d + u) times the four gates' kernels (4u)
    assert r["lstm"].forward_macs == t * 3 * (d + u) * 4 * u


def test_attention_with_sequence_length():
    length, width, heads, key_dim = 10, 16, 2, 8
    x = keras.Input((length, width))
    y = layers.MultiHeadAttention(heads, key_dim, name="mha")(x, x)
    r = by_name(est(keras.Model(x, y), 1))
    projections = 3 * length * width * heads * key_dim + length * heads * key_dim * width
    scores_and_context = heads * length * length * (key_dim + key_dim)
    assert r["mha"].forward_macs == projections + scores_and_context


def test_forward_flops_equal_tensorflows_count():
    """TensorFlow's own FLOP statistics for the traced forward graph's
    convolutions and matmuls equal 2 x the MACs of the conv and dense layers."""
    from tensorflow.python.framework import ops

    inputs = keras.Input((24, 24, 3))
    h = layers.Conv2D(8, 3, activation="relu")(inputs)
    h = layers.Conv2D(16, 3, strides=2)(h)
    h = layers.Flatten()(h)
    out = layers.Dense(10)(layers.Dense(32, activation="relu")(h))
    model = keras.Model(inputs, out)
    graph = tf.function(lambda x: model(x, training=True)).get_concrete_function(
        tf.TensorSpec((4, 24, 24, 3))).graph
    tf_flops = sum(ops.get_stats_for_node_def(graph, op.node_def, "flops").value or 0
                   for op in graph.get_operations() if op.type in ("Conv2D", "MatMul"))
    e = est(model, 4)
    ours = sum(2 * r.forward_macs for r in e.layers if r.category in ("conv", "dense"))
    assert tf_flops == ours


def test_time_model_and_breakdown():
    model = keras.Sequential([keras.Input((32, 32, 3)), layers.Conv2D(16, 3),
                              layers.Flatten(), layers.Dense(10)])
    e = est(model, 8)
    assert e.step_time_s > 0 and e.update_time_s > 0
    assert math.isclose(sum(r.time_s for r in e.layers) + e.update_time_s, e.step_time_s)
    rows = category_breakdown(e)
    assert math.isclose(sum(r["param_share"] for r in rows), 1.0)
    assert math.isclose(sum(r["flop_share"] for r in rows), 1.0)
    assert math.isclose(sum(r["time_share"] for r in rows), 1.0)
    assert {r["category"] for r in rows} >= {"conv", "dense", "optimizer"}


def test_no_time_without_speeds():
    model = keras.Sequential([keras.Input((4,)), layers.Dense(2)])
    e = memscope.estimate(model, 2, optimizer="sgd", device="gpu")
    assert e.step_time_s is None and e.layers[0].time_s is None
    assert e.forward_flops > 0


@pytest.mark.slow
def test_calibrate_cpu_gives_rates():
    profile = memscope.calibrate("cpu", repeats=2)
    assert profile.rates["matmul"] > 1e9 and profile.bandwidth_bytes_s > 1e8
    assert memscope.get_device("cpu").rates == profile.rates


def _grad_rates_profile(**extra):
    rates = {f"matmul@{n}": r for n, r in ((16, 1e10), (64, 4e10), (256, 8e10), (2048, 1e11))}
    rates.update({f"matmul_input_grad@{n}": r / 10 for n, r in ((16, 1e10), (64, 4e10),
                                                                  (256, 8e10))})
    rates.update({f"matmul_weight_grad@{n}": r / 5 for n, r in ((16, 1e10), (64, 4e10),
                                                                  (256, 8e10))})
    return memscope.DeviceProfile(name="test", kind="cpu", overhead_bytes=0,
                                  peak_flops={"float32": 1e11}, bandwidth_bytes_s=1e12,
                                  op_overhead_s=0.0, rates=rates, **extra)


@pytest.mark.parametrize("method", ["graph", "rules"])
def test_matmul_gradients_run_at_their_own_skinny_speeds(method):
    """dy @ W^T and x^T @ dy with 16 rows: 2 x 16 x 2048 x 2048 FLOPs each, at
    the calibrated input-gradient and weight-gradient speeds for 16 rows."""
    model = keras.Sequential([keras.Input((2048,)), keras.layers.Dense(2048, use_bias=False),
                              keras.layers.Dense(2048, use_bias=False, name="second")])
    est = memscope.estimate(model, 16, optimizer="sgd", device=_grad_rates_profile(),
                            method=method)
    second = next(r for r in est.layers if r.name == "second")
    flops = 2 * 16 * 2048 * 2048
    assert second.backward_time_s == pytest.approx(flops / 1e9 + flops / 2e9, rel=0.02)
    assert second.forward_time_s == pytest.approx(flops / 1e10, rel=0.02)


def test_a_reference_kernel_runs_at_its_own_rate(monkeypatch):
    """A float16 convolution's filter gradient on a device that runs it with
    oneDNN's reference loops takes its FLOPs at the reference rate (the
    calibrated one where there is one); its input gradient and float32's
    filter gradient keep the device's speeds. Which CPUs: their flags."""
    from keras_memscope import devices, timing

    model = keras.Sequential([keras.Input((16, 16, 32)),
                              layers.Conv2D(64, 3, padding="same", use_bias=False,
                                            name="conv", dtype="float16")])
    flops = 2 * 8 * 16 * 16 * 32 * 64 * 9
    plain = _grad_rates_profile()
    ref = _grad_rates_profile(reference_kernels=("conv_filter_grad:float16",))
    calibrated = dataclasses.replace(ref, rates={**ref.rates,
                                                 "conv_filter_grad:float16": 1e9})
    times, notes = {}, {}
    for name, profile in (("plain", plain), ("ref", ref), ("calibrated", calibrated)):
        est = memscope.estimate(model, 8, optimizer="sgd", device=profile, method="graph")
        times[name] = next(r for r in est.layers if r.name == "conv").backward_time_s
        notes[name] = any("reference loops" in n for n in est.notes)
    # and the estimate tells the user
    assert notes == {"plain": False, "ref": True, "calibrated": True}
    # (half the backward FLOPs are the filter gradient's)
    assert times["ref"] - times["plain"] == pytest.approx(
        flops / timing.REFERENCE_KERNEL_FLOPS, rel=0.05)
    assert times["calibrated"] - times["plain"] == pytest.approx(flops / 1e9, rel=0.05)
    monkeypatch.setattr(devices, "cpu_onednn_runs", lambda dtype="float32": True)
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"avx512_fp16"}))
    assert devices.cpu_reference_kernels() == ("conv_filter_grad:float16",)
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"avx512_fp16", "amx_fp16"}))
    assert devices.cpu_reference_kernels() == ()
    monkeypatch.setattr(devices, "cpu_onednn_runs", lambda dtype="float32": dtype != "float16")
    assert devices.cpu_reference_kernels() == ()
    # a profile given as a dict keeps them
    assert devices.profile_from_dict(ref.to_dict()).reference_kernels == (
        "conv_filter_grad:float16",)


def test_new_pages_are_paid_above_the_threshold():
    from keras_memscope import timing

    profile = _grad_rates_profile(fresh_pages_above=32 << 20, first_touch_bytes_s=2e9)
    assert timing.first_touch_time([16 << 20, 64 << 20], profile) == (64 << 20) / 2e9
    plain = _grad_rates_profile()
    assert timing.first_touch_time([64 << 20], plain) == 0.0
    # Adam writes three new buffers per variable: a 64 MiB kernel pays them
    with_pages = timing.update_time([64 << 20], 12, profile, allocations_per_variable=3)
    without = timing.update_time([64 << 20], 12, plain, allocations_per_variable=3)
    assert with_pages - without == pytest.approx(3 * (64 << 20) / 2e9)


def test_cpu_profile_knows_which_allocator_reuses_pages(monkeypatch):
    from keras_memscope import devices

    monkeypatch.setattr(devices, "_CALIBRATED", {})  # the uncalibrated profile
    monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC", raising=False)
    assert devices._cpu_profile().fresh_pages_above == 32 << 20  # malloc: mmap above 32 MiB
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "true")
    assert devices._cpu_profile().fresh_pages_above is None


def test_slow_weight_gradient_outlasts_later_input_gradients(monkeypatch):
    """On the CPU a weight gradient runs beside the input gradients: when its
    kernel is slow, later layers' input gradients are computed while it (and
    its buffers) are still alive; when fast, it ends first. A GPU runs one
    stream. (16 output channels: a full vector of them, whose filter
    gradient runs at the rate given on any CPU.) Where the executor's order
    puts each weight gradient last (as TensorFlow's rewrite of this step
    does), a layer whose gradients come while the other thread is busy runs
    its weight gradient first and its input gradient after the first of the
    two ends: the slow weight gradient then ends before the next input
    gradient starts."""
    import dataclasses

    from keras_memscope import executor

    model = keras.Sequential(
        [keras.Input((32, 32, 8))]
        + [layers.Conv2D(16, 3, padding="same", name=f"c{i}") for i in (1, 2, 3)]
        + [layers.GlobalAveragePooling2D(), layers.Dense(2)])
    base = memscope.devices.get_device("cpu")

    def run(filter_rate, profile=base):
        profile = dataclasses.replace(
            profile, peak_flops={"float32": 1e11}, bandwidth_bytes_s=1e10, op_overhead_s=1e-6,
            rates={"conv": 1e11, "conv_input_grad": 1e11, "conv_filter_grad": filter_rate},
            order_histories=0)  # the nominal order only
        est = memscope.estimate(model, 8, optimizer="sgd", device=profile)
        events = [(p.layer, p.event) for p in est.timeline if p.phase == "backward"]
        c3_weights = events.index(("c3", "Conv2D (weight gradients)"))
        c2_inputs = events.index(("c2", "Conv2D"))
        return c3_weights > c2_inputs

    orders = executor.weight_gradient_first(model, 8, "sgd")
    assert orders is not None and all(o == ((True, True),) for o in orders.values())
    assert not run(1e9)
    # every input gradient first (the order where it cannot be read)
    monkeypatch.setattr(executor, "weight_gradient_first", lambda *a, **k: None)
    assert run(1e9)  # 100 times slower than the input gradients: outlasts them
    assert not run(1e12)
    assert not run(1e9, memscope.devices.get_device("a100-40gb"))


def test_cpu_estimate_is_the_highest_of_its_simulated_orders():
    """On the CPU the two gradient streams interleave as op times say, and op
    times vary from step to step: the estimate simulates the nominal order and
    ``order_histories`` others (fixed seeds) and reports the highest peak. A
    GPU runs one stream: one order."""
    import dataclasses

    from .models import gated_mlp

    model = gated_mlp()
    cpu = memscope.devices.get_device("cpu")
    est = memscope.estimate(model, 8, optimizer="adam", device="cpu")
    assert len(est.history_peaks) == cpu.order_histories + 1 == 11
    assert est.peak_bytes == max(est.history_peaks)
    assert max(p.live_bytes for p in est.timeline) <= est.peak_bytes
    note = next(n for n in est.notes if "simulated orders" in n)
    assert f"(median {human_bytes(statistics.median(est.history_peaks))})" in note
    # the same orders in every call and process: fixed seeds
    assert memscope.estimate(model, 8, optimizer="adam", device="cpu").history_peaks \
        == est.history_peaks
    nominal = memscope.estimate(model, 8, optimizer="adam",
                                device=dataclasses.replace(cpu, order_histories=0))
    assert nominal.history_peaks == ()
    assert nominal.peak_bytes == est.history_peaks[0]
    still = memscope.estimate(model, 8, optimizer="adam",
                              device=dataclasses.replace(cpu, op_time_sigma=0.0))
    assert set(still.history_peaks) == {nominal.peak_bytes}
    assert not any("simulated orders" in n for n in still.notes)
    assert memscope.estimate(model, 8, optimizer="adam", device="a100-40gb").history_peaks == ()
    assert memscope.MemoryEstimate.from_json(est.to_json()).history_peaks == est.history_peaks


def test_other_orders_vary_the_forward_times_too():
    """Op times vary from step to step in the forward pass as in the
    backward one (``benchmarks/op_time_spread.py`` measures every op), so
    each simulated order scales every prim's forward seconds by a factor of
    its own as well: the same seed gives the same factors, another seed
    others, and no spread leaves the times as they are."""
    from keras_memscope.estimator import _scaled_forward

    def second(cost):
        return 1.0

    prims = [object() for _ in range(6)]
    first = _scaled_forward(second, 0.33, seed=1)
    times = [first(p) for p in prims]
    assert times == [first(p) for p in prims]  # one factor per prim
    again, other = _scaled_forward(second, 0.33, seed=1), _scaled_forward(second, 0.33, seed=2)
    assert times == [again(p) for p in prims]
    assert times != [other(p) for p in prims]
    assert len(set(times)) == len(prims) and all(t > 0 for t in times)
    assert {_scaled_forward(second, 0.0, seed=1)(p) for p in prims} == {1.0}


def test_convolution_into_few_channels_takes_a_vectors_time():
    """oneDNN's convolution kernels work on a vector of output channels at a
    time: a 3 x 3 convolution into one channel takes about as long as one
    into a full vector (16 floats with AVX-512), where the multiply-accumulates
    alone would say a sixteenth. The time model follows the kernels, measured
    side by side here (best of 20 calls each, alternating)."""
    import time

    import numpy as np

    from keras_memscope.devices import cpu_float_lanes, cpu_uses_onednn, get_device
    from keras_memscope.timing import conv_lane_factor, op_time, ordering_profile

    if not cpu_uses_onednn():
        pytest.skip("TensorFlow runs its own convolution kernels on this CPU")
    lanes = cpu_float_lanes()
    x = tf.constant(np.random.rand(16, 64, 64, 32).astype("float32"))
    conv = tf.function(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"))
    kernels = {c: tf.constant(np.random.rand(3, 3, 32, c).astype("float32"))
               for c in (1, lanes)}
    times: dict[int, list[float]] = {c: [] for c in kernels}
    for w in kernels.values():
        conv(x, w).numpy()
    # side by side: the two convolutions alternate, so that whatever else
    # the machine does slows both alike
    for _ in range(20):
        for c, w in kernels.items():
            t = time.perf_counter()
            conv(x, w).numpy()
            times[c].append(time.perf_counter() - t)
    best = {c: min(ts) for c, ts in times.items()}
    measured = best[1] / best[lanes]
    profile = ordering_profile(get_device("cpu"))

    def modelled(channels):
        flops = 2 * 16 * 64 * 64 * 9 * 32 * channels
        moved = 4 * 16 * 64 * 64 * (32 + channels)
        return op_time(flops * conv_lane_factor(channels, profile), moved, profile,
                       family="conv")

    assert measured > 0.5, best  # far from the 1/16 of the multiply-accumulates
    assert conv_lane_factor(1, profile) == lanes
    assert modelled(1) / modelled(lanes) > 0.5  # (0.07 by the MACs alone)


def test_a_transposed_convolution_is_timed_as_the_kernels_it_runs():
    """Conv2DTranspose runs a convolution's input-gradient kernel forward
    (Conv2DBackpropInput) and a forward convolution for its own input
    gradient: the time model takes each at that kernel's speed."""
    import dataclasses

    from keras_memscope import tfgraph
    from keras_memscope.devices import get_device
    from keras_memscope.graph import trace_model
    from keras_memscope.schedule import PrimCost
    from keras_memscope.timing import backward_seconds, forward_seconds, ordering_profile

    model = keras.Sequential([keras.Input((8, 8, 16)),
                              layers.Conv2DTranspose(32, 3, strides=2, padding="same")])
    call = next(c for c in trace_model(model, 4).calls if "transpose" in c.name)
    kernels = {p.name: p.kernel for p in tfgraph.traced_prims(call)}
    assert "conv_transpose" in kernels.values(), kernels
    profile = dataclasses.replace(ordering_profile(get_device("cpu")), op_overhead_s=0.0,
                                  peak_flops={"float32": 1e12},
                                  rates={"conv": 1e11, "conv_input_grad": 2e11,
                                         "conv_filter_grad": 5e10})
    flops = 10**9  # large enough that the bytes do not decide
    cost = PrimCost(layer_index=0, forward_flops=flops, forward_bytes=0,
                    backward_input_flops=flops, backward_weight_flops=flops,
                    backward_bytes=0, macs=flops // 2, kernel="conv_transpose",
                    gemm_min_dim=0, recomputed=False, forward_allocs=(),
                    backward_allocs=(), out_channels=0)
    assert forward_seconds(cost, profile) == pytest.approx(flops / 2e11, rel=0.01)
    t_in, t_w = backward_seconds(cost, profile)
    assert t_in == pytest.approx(flops / 1e11, rel=0.01)  # a forward convolution
    assert t_w == pytest.approx(flops / 5e10, rel=0.01)
    plain = dataclasses.replace(cost, kernel="conv")
    assert forward_seconds(plain, profile) == pytest.approx(flops / 1e11, rel=0.01)
    assert backward_seconds(plain, profile)[0] == pytest.approx(flops / 2e11, rel=0.01)
