"""The graph method: prims read off TensorFlow's graph of each layer call."""

import dataclasses
import logging
import warnings
from typing import Any
from unittest import mock

import keras
import pytest
from keras import layers

import keras_memscope as memscope
from keras_memscope.rules.conv import col_buffers
from keras_memscope.units import human_bytes

from .models import (
    Gated,
    causal_gqa,
    custom_cell_rnn,
    dropout_feed_forward,
    gated_feed_forward,
    gated_mlp,
    small_cnn,
)


def test_graph_method_agrees_with_rules_on_known_layers():
    model = small_cnn()
    rules = memscope.estimate(model, 32, optimizer="adam", device="cpu", method="rules")
    graph = memscope.estimate(model, 32, optimizer="adam", device="cpu", method="graph")
    assert graph.method == "graph" and rules.method == "rules"
    assert graph.params == rules.params
    # both keep what TensorFlow's gradients read: the same saved activations,
    # layer by layer; BatchNormalization's graph also keeps its small
    # per-channel statistics separately (8 channels: a few 256-byte chunks)
    for r, g in zip(rules.layers, graph.layers):
        if r.class_name == "BatchNormalization":
            assert 0 <= g.activation_bytes - r.activation_bytes <= 4 * 256
        else:
            assert g.activation_bytes == r.activation_bytes, r.name


def test_custom_layer_internals_seen_by_the_graph_method():
    model = gated_mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rules = memscope.estimate(model, 512, optimizer="sgd", device="cpu", method="rules")
    graph = memscope.estimate(model, 512, optimizer="sgd", device="cpu", method="graph")
    assert dict(rules.unsupported) == {"Gated": 2}
    assert not graph.unsupported
    gated = [r for r in graph.layers if r.class_name == "Gated"]
    # x^2 and the sigmoid: two new 512 x 2048 float32 tensors kept per call
    assert all(r.activation_bytes >= 2 * 512 * 2048 * 4 for r in gated)


def test_custom_layer_against_measurement():
    """Graph estimate within the issue's 15% of a real measurement (fresh
    process, BFC allocator, the highest of three processes)."""
    model = gated_mlp()
    runs = [memscope.measure(model, 512, optimizer="sgd", steps=4, device="cpu")
            for _ in range(3)]
    worst = max(r.peak_bytes for r in runs)
    graph = memscope.estimate(model, 512, optimizer="sgd", device="cpu", method="graph")
    assert abs(graph.peak_bytes / worst - 1) <= 0.15, (graph.peak_bytes, worst)


def test_bad_method():
    with pytest.raises(ValueError, match="method must be"):
        memscope.estimate(small_cnn(), 2, method="magic")


def test_recurrent_layers_fall_back_to_their_rule(caplog):
    model = keras.Sequential([keras.Input((10, 4)), keras.layers.LSTM(8), keras.layers.Dense(1)])
    with caplog.at_level(logging.INFO, logger="keras_memscope"):
        graph = memscope.estimate(model, 4, optimizer="sgd", device="cpu", method="graph")
    lstm = next(r for r in graph.layers if r.class_name == "LSTM")
    assert lstm.rule == "LSTM"
    # the loop is the reason, not a failure to trace (LSTM's read-only activation)
    assert any("While" in r.getMessage() for r in caplog.records), caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert Gated  # imported for serialization in the measuring process


def _text_lstm(return_sequences: bool) -> keras.Model:
    inputs = keras.Input((100,), dtype="int32")
    x = keras.layers.Embedding(1000, 64)(inputs)
    x = keras.layers.LSTM(128, return_sequences=return_sequences)(x)
    if return_sequences:
        x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(2)(x))


def test_lstm_loop_bound_noted():
    """The gradient loop may run ahead of its weight-gradient sums: the
    estimate says by how much at most (32 iterations, or fewer steps)."""
    est = memscope.estimate(_text_lstm(False), 8, optimizer="sgd", device="cpu")
    (note,) = [n for n in est.notes if "gradient loop" in n]
    kernels = ((64 + 128) * 4 * 128 + 4 * 128) * 4
    assert human_bytes(32 * kernels) in note
    # the step simulated again with the 32 partials held while the loop's
    # gradient runs: the peak rises, by at most twice their bytes (a chunk is
    # split unless it is under twice the request)
    assert 0 < est.possible_extra_bytes <= 2 * 32 * kernels
    assert human_bytes(est.possible_extra_bytes) in " ".join(est.notes)
    short = keras.Sequential([keras.Input((5, 3)), keras.layers.GRU(4)])
    unrolled = keras.Sequential([keras.Input((5, 3)), keras.layers.GRU(4, unroll=True)])
    (short_note,) = [n for n in memscope.estimate(short, 2, device="cpu").notes
                     if "gradient loop" in n]
    kernels = ((3 + 4) * 3 * 4 + 2 * 3 * 4) * 4
    assert human_bytes(4 * kernels) in short_note
    assert 0 < memscope.estimate(short, 2, device="cpu").possible_extra_bytes <= 2 * 4 * kernels
    unrolled_est = memscope.estimate(unrolled, 2, device="cpu")
    assert not [n for n in unrolled_est.notes if "gradient loop" in n]
    assert unrolled_est.possible_extra_bytes == 0


def test_fit_report_gives_the_loop_bound():
    """A memory that holds the estimate but not the loop's bound: it fits, and
    the report says it would not if the loop ran ahead."""
    from keras_memscope.report import render_fit

    model = _text_lstm(False)
    est = memscope.estimate(model, 8, optimizer="adam", device="cpu")
    memory = int((est.peak_bytes + est.possible_extra_bytes // 2) / 0.95)
    report = memscope.fits(model, 8, optimizer="adam", device="cpu", memory_bytes=memory)
    assert report.fits
    assert report.worst_case_bytes == est.peak_bytes + est.possible_extra_bytes
    assert report.to_dict()["worst_case_bytes"] == report.worst_case_bytes
    assert "would not fit" in render_fit(report)


@pytest.mark.parametrize("return_sequences", [False, True])
def test_lstm_against_measurement(return_sequences):
    """The measured peak lies between the estimate and the estimate plus the
    loop's noted bound (within 15%; fresh process, BFC allocator): the
    per-step tensors, and the sequence's gradient only when the layer returns
    the sequence."""
    model = _text_lstm(return_sequences)
    measured = memscope.measure(model, 16, optimizer="sgd", steps=4, device="cpu").peak_bytes
    est = memscope.estimate(model, 16, optimizer="sgd", device="cpu")
    bound = est.possible_extra_bytes  # 32 partial kernels held (test_lstm_loop_bound_noted)
    assert est.peak_bytes * 0.85 <= measured <= (est.peak_bytes + bound) * 1.15, (
        est.peak_bytes, measured)


def test_an_rnn_around_any_cell_against_measurement():
    """``keras.layers.RNN`` around a custom cell (and around Keras' own cells)
    is one recurrent call whose loop keeps, per step, what the traced loop
    pushes for its gradient. Before, the inspector walked into it and found
    the cell's calls and loose TensorFlow ops, and none of the 200 steps'
    kept tensors: 5.0 MiB estimated against 21.7-22.2 measured (b64 Adam);
    now the median step within 5% of the estimate (21.63 MiB), as its
    SimpleRNN twin is. Its loop may run ahead of its weight-gradient sums
    (the notes say so; ``possible_extra_bytes`` 10.2 MiB): a step doing so
    measured 27.5 MiB beside three at 21.6-22.0, so every step is held to
    the range from the estimate to the estimate plus that, within 5%."""
    import statistics

    model = custom_cell_rnn()
    est = memscope.estimate(model, 64, optimizer="adam", device="cpu")
    assert [r.class_name for r in est.layers] == ["RNN", "Dense"]
    assert est.possible_extra_bytes > 0
    measured = memscope.measure(model, 64, optimizer="adam", steps=4, device="cpu")
    steps = measured.step_peak_bytes
    assert abs(statistics.median(steps) / est.peak_bytes - 1) <= 0.05, (est.peak_bytes, steps)
    low, high = est.peak_bytes, est.peak_bytes + est.possible_extra_bytes
    assert all(0.95 * low <= step <= 1.05 * high for step in steps), (low, high, steps)


@pytest.mark.parametrize("make, batch, whole", [
    (causal_gqa, 32, "GroupedQueryAttention"),
    (gated_feed_forward, 32, "GatedFeedForward"),
])
def test_a_layer_computing_between_its_sublayers_is_traced_whole(make, batch, whole):
    """A layer whose own ``call`` computes between the layers it calls
    (grouped-query attention between its projections; a custom gated block's
    product of two Dense outputs) is traced whole: opened into its sub-layers,
    those ops were one glue call that kept neither the attention's
    probabilities nor the key and value repeated for every head. Estimated
    before: 35.7 MiB for the attention and 50.3 for the gated blocks, against
    79.2 and 70.1-73.6 measured (the highest step of each of two processes;
    ``python -m benchmarks.composite_layers``); now 85.1 and 78.3, within
    the issue's 15% of the highest (the gated blocks' two weight-gradient
    products side by side in the highest simulated order, one after the other
    in the measured steps). The rules still open the layer (they have no rule
    for it)."""
    model = make()
    est = memscope.estimate(model, batch, optimizer="adam", device="cpu")
    assert whole in [r.class_name for r in est.layers]
    rules = memscope.estimate(model, batch, optimizer="adam", device="cpu", method="rules")
    assert whole not in [r.class_name for r in rules.layers]
    runs = [memscope.measure(model, batch, optimizer="adam", steps=5, device="cpu")
            for _ in range(2)]
    worst = max(r.peak_bytes for r in runs)
    assert abs(est.peak_bytes / worst - 1) <= 0.15, (est.history_peaks,
                                                     [r.step_peak_bytes for r in runs])


def test_a_block_traced_whole_runs_its_dropout_as_in_training():
    """A block traced whole whose ``call`` takes no training argument runs
    its Dropout as in training, as Keras does inside ``fit`` (it strips the
    argument from such a call and hands it on to the layers it calls): the
    block keeps the dropout's mask, one byte per hidden element, beyond what
    it keeps without dropout. Before, the block ran its Dropout as in
    inference and kept the same with and without."""
    kept = {}
    for rate in (0.0, 0.3):
        est = memscope.estimate(dropout_feed_forward(rate), 8, optimizer="sgd", device="cpu")
        (record,) = [r for r in est.layers if r.class_name == "DropoutFeedForward"]
        kept[rate] = record.activation_bytes
    assert kept[0.3] - kept[0.0] >= 8 * 64 * 512, kept


def test_a_layer_around_a_model_is_opened_though_it_computes():
    """A layer that computes around a model it calls (here a GELU of a small
    CNN's output, scaled by a weight) is opened as before, not traced whole:
    as one call, a whole network's gradient would be scheduled as one
    layer's. (A MobileNetV2 so wrapped: 511 MiB traced whole against
    402-417 measured, 462 opened.)"""

    class Scaled(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = small_cnn()

        def build(self, input_shape):
            self.scale = self.add_weight(shape=(10,), initializer="ones", name="scale")

        def call(self, x):
            return keras.ops.gelu(self.inner(x)) * self.scale

    x = keras.Input((16, 16, 3))
    model = keras.Model(x, layers.Dense(2)(Scaled(name="scaled")(x)))
    est = memscope.estimate(model, 4, optimizer="sgd", device="cpu")
    names = [r.name for r in est.layers]
    assert "scaled" not in names
    assert any(n.startswith("scaled/") for n in names), names


def test_calls_differing_only_in_arguments_are_traced_apart():
    """The same layer configuration and shapes called with and without a
    causal mask builds two graphs; the trace cache must not share them. (On
    two inputs: on one, the plain call's score product is the causal call's,
    which TensorFlow computes once.)"""
    x, y = keras.Input((16, 32)), keras.Input((16, 32))
    causal = keras.layers.Attention(name="causal")([x, x], use_causal_mask=True)
    plain = keras.layers.Attention(name="plain")([y, y])
    est = memscope.estimate(keras.Model([x, y], [causal, plain]), 4, optimizer="sgd",
                            device="cpu", method="graph")
    by_name = {r.name: r for r in est.layers}
    # the mask's ops make the causal call's forward longer than the plain one's
    assert by_name["causal"].forward_flops > by_name["plain"].forward_flops


def test_raw_ops_nodes_are_traced_and_masks_have_a_rule(caplog):
    """keras.ops calls in a Functional model (Operations, without variables)
    trace like layers; the mask an Embedding(mask_zero=True) computes is a
    comparison with a rule (no gradient), so neither method falls back."""
    import logging

    from keras import ops

    x = keras.Input((10, 6))
    h = keras.layers.Conv1D(8, 3)(x)
    mean = keras.Model(x, ops.mean(h, axis=1))
    with caplog.at_level(logging.WARNING, logger="keras_memscope"):
        est = memscope.estimate(mean, 8, method="graph", device="cpu")
    assert not [r for r in caplog.records if "could not trace" in r.getMessage()]
    assert {r.name: r.rule for r in est.layers}[est.layers[-1].name] == "graph"

    t = keras.Input((12,), dtype="int32")
    e = keras.layers.Embedding(50, 8, mask_zero=True)(t)
    masked = keras.Model(t, keras.layers.LSTM(8)(e))
    for method in ("graph", "rules"):
        est = memscope.estimate(masked, 8, method=method, device="cpu")
        assert not est.unsupported, (method, est.unsupported)


@pytest.mark.parametrize("kind", ["transpose", "conv1d"])
@pytest.mark.parametrize("method", ["graph", "rules"])
def test_first_layer_filter_gradient_beside_the_second(kind, method):
    """The first layer has no input gradient, so TensorFlow's idle thread runs
    its filter gradient while the other still runs the second layer's: both
    column buffers are alive at the peak. Allocator traces of these models at
    batch 1: some steps peaked at both buffers (64.7 and 48.7 MiB), others at
    one. A transposed convolution's filter gradient has a column buffer too:
    the convolution it transposes has this layer's input as its output."""
    from benchmarks import layer_types
    from keras_memscope.rules.conv import col_buffers

    model = getattr(layer_types, kind)()
    est = memscope.estimate(model, 1, optimizer="sgd", device="cpu", method=method)
    first, second = model.layers[0], model.layers[1]
    workspace = {h.layer: h.bytes for h in est.peak_holders if h.kind == "workspace"}
    own, _ = col_buffers(tuple(first.input.shape if kind == "transpose"
                               else first.output.shape), tuple(first.kernel.shape))
    other, _ = col_buffers(tuple(second.output.shape), tuple(second.kernel.shape))
    assert workspace.get(first.name, 0) >= own and workspace.get(second.name, 0) >= other


def test_normalization_partial_gradients_counted_once():
    """BatchNormalization's input gradient is the sum of three partials (through
    the mean, the variance and the normalization), which the schedule holds
    as the partials of a tensor three ops read. Its gradient's own workspace
    is only what comes on top: the ``x - mean`` temporary of the variance's
    gradient, one input-sized tensor, which TensorFlow writes into ``x``
    when nothing else holds it (a convolution keeps its input, not its
    output: allocator trace of the layer-types depthwise model, whose
    estimate went from 48.0 to 40.0 MiB against 40.1 measured); a ReLU
    before it keeps its output, the normalization's input. And the scale's
    gradient: ``x * inv`` broadcasts ``inv`` (one value a channel) over the
    batch, so its gradient is the input-sized product of the incoming
    gradient with ``x``, summed down afterwards (``batchnorm/mul_1/Mul_1``,
    1 MiB beside ``x`` and the input gradient in the allocator trace of
    this network with a Dense layer after it), a temporary of that
    product's own prim: one input-sized tensor at a time either way."""
    from keras_memscope.graph import trace_model
    from keras_memscope.tfgraph import traced_prims

    size = 16 * 32 * 32 * 16 * 4
    inp = keras.Input((32, 32, 16))
    x = keras.layers.Conv2D(16, 1)(inp)
    for before, free in ((x, True), (keras.layers.ReLU()(x), False)):
        model = keras.Model(inp, keras.layers.BatchNormalization()(before))
        call = next(c for c in trace_model(model, 16).calls
                    if type(c.layer).__name__ == "BatchNormalization")
        prims = traced_prims(call)
        # the partials' temporary: one input-sized tensor, or none in x
        assert prims[0].backward_workspace_parts == (size,)
        assert prims[0].backward_workspace_parts_if_free == ()
        scaled = next(p for p in prims if p.name == "Mul" and "in0" in p.inputs)
        assert [n for _, n in scaled.workspace_for] == [size]
        est = memscope.estimate(model, 16, optimizer="sgd", device="cpu", method="graph")
        norm = next(r for r in est.layers if r.class_name == "BatchNormalization")
        assert norm.workspace_bytes == size
        # where its gradient starts, the partials' temporary is written
        # into x when x is free
        points = list(est.timeline)
        start = next(p.high_bytes - q.live_bytes for q, p in zip(points, points[1:])
                     if p.phase == "backward" and p.layer == model.layers[-1].name)
        assert (start < size) == free, (start, free)


HLO = """HloModule m, is_scheduled=true

%fused (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %n = f32[8]{0} negate(%p)
}

ENTRY %main (a: f32[1024], b: f32[256]) -> (f32[256], f32[1024]) {
  %a = f32[1024]{0} parameter(0), metadata={op_name="XLA_Args"}
  %b = f32[256]{0} parameter(1)
  %c = f32[] constant(0)
  %t1 = f32[2048]{0} fusion(%a), kind=kLoop, calls=%fused
  %t2 = f32[4096]{0} convolution(%t1, %b), window={size=2}
  %v = f32[64,64]{1,0} bitcast(%t2)
  %t3 = f32[512]{0} fusion(%v, %c), kind=kLoop, calls=%fused
  %out1 = f32[256]{0} fusion(%t3), kind=kLoop, calls=%fused
  %out2 = f32[1024]{0} fusion(%a), kind=kLoop, calls=%fused
  ROOT %r = (f32[256]{0}, f32[1024]{0}) tuple(%out1, %out2)
}
"""


def test_xla_temporary_buffer_from_the_scheduled_module():
    """``xla.hlo_temp_bytes`` walks the entry computation in order: t1 and t2
    alive together (8 + 16 KiB) is the most; the bitcast reads t2's buffer,
    which stays until t3; parameters, the constant and the results are not in
    the temporary buffer; the fused computation's instructions make none."""
    from keras_memscope.xla import hlo_temp_bytes

    assert hlo_temp_bytes(HLO) == (2048 + 4096) * 4
    assert hlo_temp_bytes("HloModule empty") == 0


def grouped_last() -> keras.Model:
    """A convolution with one input channel per group: Keras runs it with XLA
    on the CPU, whose filter gradient is a dense 7 x 7 x 256 x 256 convolution
    masked into a second buffer of that size (2 x 12.25 MiB)."""
    inp = keras.Input((2, 2, 256))
    x = layers.Conv2D(256, 7, padding="same", groups=256)(inp)
    return keras.Model(inp, layers.Dense(10)(layers.GlobalAveragePooling2D()(x)))


def test_grouped_convolution_xla_buffer_against_measurement():
    """Measured 32.25 and 32.26 MiB in two processes, estimate 32.22; without
    XLA's buffer the estimate was 7.7 MiB (ConvNeXt-Tiny's depthwise
    convolutions: 220.5 MiB each at 768 channels)."""
    model = grouped_last()
    est = memscope.estimate(model, 4, optimizer="sgd", device="cpu", method="graph")
    assert est.workspace_bytes >= 2 * 7 * 7 * 256 * 256 * 4
    measured = memscope.measure(model, 4, optimizer="sgd", steps=3, device="cpu")
    assert abs(est.peak_bytes - measured.peak_bytes) <= 0.05 * measured.peak_bytes, (
        est.peak_bytes, measured.step_peak_bytes)


def grouped_wide() -> keras.Model:
    """A grouped Conv1D on the model's input with 16 input channels per
    group (4 groups), which Keras runs with XLA on the CPU."""
    inp = keras.Input((256, 64))
    x = layers.Conv1D(128, 5, padding="same", groups=4, activation="relu")(inp)
    return keras.Model(inp, layers.Dense(8)(layers.GlobalAveragePooling1D()(x)))


def test_grouped_convolution_buffer_assignment_against_measurement():
    """With 16 input channels per group XLA's buffer assignment shares
    buffers that a walk of the module in schedule order does not: the
    gradient's temporary allocation is 4.04 MiB at batch 32 (the allocator
    trace: one allocation of that size while the gradient runs), the walk's
    6.08. The compiled gradient also returns the gradient with respect to the
    model's input, 2 MiB that nothing reads. Measured 14.20 MiB in two
    processes; estimated 18.2 with the walk's buffer and 12.2 without the
    input's gradient."""
    model = grouped_wide()
    est = memscope.estimate(model, 32, optimizer="sgd", device="cpu", method="graph")
    measured = memscope.measure(model, 32, optimizer="sgd", steps=3, device="cpu")
    assert abs(est.peak_bytes - measured.peak_bytes) <= 0.03 * measured.peak_bytes, (
        est.peak_bytes, measured.step_peak_bytes)


def assert_near_highest_process(model: keras.Model, batch: int, optimizer: str,
                                tolerance: float = 0.10) -> None:
    """The graph estimate lies within ``tolerance`` of the highest of two
    measuring processes' peaks (four steps each)."""
    est = memscope.estimate(model, batch, optimizer=optimizer, device="cpu", method="graph")
    measured = [memscope.measure(model, batch, optimizer=optimizer, steps=4, device="cpu")
                for _ in range(2)]
    highest = max(m.peak_bytes for m in measured)
    assert abs(est.peak_bytes - highest) <= tolerance * highest, (
        est.peak_bytes, [m.step_peak_bytes for m in measured])


def test_float16_convolutions_against_measurement():
    """TensorFlow runs oneDNN's kernels for a dtype only where the CPU has
    instructions for it (``devices.cpu_onednn_runs``): here float32 and
    bfloat16, not float16, whose convolutions run TensorFlow's own kernels
    with their column buffers (a filter gradient's 23.625 MiB in the
    allocator trace, ``rules.conv.col_buffers`` to the byte). The filter
    gradient with respect to the kernel's float16 copy runs on the weight-
    gradient thread, as a weight's does. Batch 8, SGD: measured 61.8-65.6 MiB
    in two processes, estimated 61.7; 17.3 without the column buffers. On a
    CPU with AVX512_FP16 oneDNN runs float16 too, and its filter gradients
    are its reference loops (``devices.cpu_reference_kernels``), a second
    each: the input gradients wait for a thread with their operands alive
    (an Intel Xeon: measured 18.9-20.1 MiB in two processes, estimated 19.8;
    17.1 with the filter gradients at the float32 speed)."""
    from benchmarks.zoo import fp16cnn

    assert_near_highest_process(fp16cnn(), 8, "sgd")


def test_added_loss_gradient_against_measurement():
    """What a layer adds to the loss (``ActivityRegularization`` here) is
    traced with its gradient. Its incoming gradient is a constant, so the
    gradient's product with the layer's input is ready in the forward pass,
    where TensorFlow computes it and holds it until the backward pass adds
    it to the gradient arriving through the layer (4 MiB per layer in the
    allocator trace), and its broadcast of the constant is a folded
    constant held between steps. The accuracy set's constrained MLP, batch
    1024, Adam: measured 62.1-71.2 MiB in two processes, estimated 68.0;
    58.1 without the added losses, 59.2 with their constant alone."""
    from benchmarks.zoo import constrained

    assert_near_highest_process(constrained(), 1024, "adam")


def test_separable_convolution_gradients_counted_once():
    """``tf.nn.separable_conv2d`` names its pointwise ``Conv2D``
    ``separable_conv2d`` and its depthwise kernel ``separable_conv2d/
    depthwise``; the tape names both kernels' gradient ops after the first.
    The depthwise gradients belong to the depthwise op (their type names
    it), so the gradient the pointwise op hands it is the schedule's own
    allocation and not also a gradient intermediate of the layer: no
    temporary of the layer's input size (the allocator trace of the
    accuracy set's ``sepspatial`` has the two 16 MiB gradients of each
    separable layer and no third)."""
    inp = keras.Input((32, 32, 16))
    x = layers.SeparableConv2D(16, 3, padding="same", activation="relu")(inp)
    model = keras.Model(inp, layers.Dense(4)(layers.GlobalAveragePooling2D()(x)))
    est = memscope.estimate(model, 8, optimizer="sgd", device="cpu", method="graph")
    separable = next(r for r in est.layers if r.class_name == "SeparableConv2D")
    # beside the pointwise convolution's column buffers where TensorFlow's own
    # kernels run (none with oneDNN's; an allocator trace on an AVX2 CPU
    # without oneDNN: 14.9 MiB for each of its two gradients, the same as
    # col_buffers gives)
    columns = max(col_buffers((8, 32, 32, 16), (1, 1, 16, 16)))
    assert separable.workspace_bytes < columns + 8 * 32 * 32 * 16 * 4


class _Scaled(layers.Layer):
    """A custom layer whose class name starts with an underscore: Keras
    names it ``__scaled``, which TensorFlow does not take as a root name
    scope (inside a model it is never one)."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.scale


def test_layer_named_with_a_leading_underscore_is_traced(caplog):
    inp = keras.Input((64,))
    layer = _Scaled()
    model = keras.Model(inp, layers.Dense(4)(layer(inp)))
    assert layer.name.startswith("_")
    with caplog.at_level(logging.WARNING, logger="keras_memscope"):
        est = memscope.estimate(model, 8, optimizer="sgd", device="cpu", method="graph")
    assert "could not trace" not in caplog.text
    assert est.peak_bytes > 0


def swish_after_conv() -> keras.Model:
    return keras.Sequential([keras.Input((64, 64, 8)), layers.Conv2D(64, 1),
                             layers.Activation("swish"), layers.GlobalAveragePooling2D()],
                            name="swish_after_conv")


def test_custom_gradient_goes_to_the_arguments():
    """``tf.nn.silu`` is a ``tf.custom_gradient``: its gradient reads only the
    input and recomputes the sigmoid, so the swish keeps nothing of its own
    for the backward pass (the convolution's output is what is kept), its
    ``beta * x`` with beta = 1 is folded away, and the gradient of the unused
    ``beta`` is pruned. The recomputed sigmoid and ``1 - sigmoid`` are alive
    together and the products end in one of them, which becomes the input
    gradient: one input-sized buffer beyond the gradients."""
    est = memscope.estimate(swish_after_conv(), 16, optimizer="sgd", device="cpu",
                            method="graph")
    swish = next(r for r in est.layers if r.class_name == "Activation")
    conv = next(r for r in est.layers if r.class_name == "Conv2D")
    size = 16 * 64 * 64 * 64 * 4
    assert swish.activation_bytes == 0 and conv.activation_bytes == size
    assert swish.workspace_bytes == size


class _StraightThrough(layers.Layer):
    """``round(x)`` forward; backward, the gradient as it came (a
    straight-through estimator) or, with ``hand_on=False``, twice it."""

    def __init__(self, hand_on: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.hand_on = hand_on

    def call(self, x):
        import tensorflow as tf

        @tf.custom_gradient
        def f(x):
            return tf.round(x), (lambda dy: dy) if self.hand_on else (lambda dy: dy * 2.0)

        return f(x)


def straight_through(hand_on: bool) -> keras.Model:
    x = keras.Input((1024,))
    h = layers.Dense(2048, activation="relu")(layers.Dense(2048, activation="relu")(x))
    h = _StraightThrough(hand_on)(h)
    return keras.Model(x, layers.Dense(10)(layers.Dense(2048, activation="relu")(h)))


def test_a_custom_gradient_that_returns_its_upstream_hands_it_on():
    """A ``tf.custom_gradient`` whose gradient returns ``dy`` as it came
    makes no buffer for its input's gradient: TensorFlow hands the tensor on
    (allocator trace of Dense 2048, a straight-through ``round``, Dense 2048
    at batch 512: the next layer's 4 MiB input gradient goes straight to the
    ReLU's gradient, and nothing is allocated between). The step allocates
    one input-sized gradient less than with a gradient that computes ``2 *
    dy``. Keras' float8 layers quantize their input and kernel so: a float8
    Dense hands on both gradients, and computes only its output gradient's
    quantization."""
    from keras_memscope.graph import trace_model
    from keras_memscope.tfgraph import traced_prims

    on = memscope.estimate(straight_through(True), 512, optimizer="sgd", device="cpu")
    off = memscope.estimate(straight_through(False), 512, optimizer="sgd", device="cpu")
    assert off.step_allocated_bytes - on.step_allocated_bytes == 512 * 2048 * 4

    dense = keras.Sequential([keras.Input((64,)), layers.Dense(32)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the input layer has no quantize)
        dense.quantize("float8")
    call = next(c for c in trace_model(dense, 8).calls if c.layer is dense.layers[0])
    passes = [p for p in traced_prims(call) if p.name == "IdentityN"]
    assert [p.grad_passes for p in passes] == [("in0",), ("w:kernel",), ()]


def test_identity_arithmetic_is_a_view():
    import tensorflow as tf

    from keras_memscope.tfgraph import _identity_arithmetic

    def ops_of(fn):
        graph = tf.function(fn).get_concrete_function(tf.TensorSpec((4, 8))).graph
        return [op for op in graph.get_operations() if op.type in ("Mul", "AddV2", "Sub")]

    assert all(_identity_arithmetic(op) for op in ops_of(lambda x: x * 1.0 + 0.0 - 0.0))
    assert not any(_identity_arithmetic(op) for op in ops_of(lambda x: x * 2.0 + 1.0))
    # ones that broadcast the input to a larger shape are a real product
    assert not any(_identity_arithmetic(op)
                   for op in ops_of(lambda x: x[:, :1] * tf.ones((4, 8))))


def test_grouped_convolution_note_and_host_only_xla_buffer():
    """The note names the layer and the remedy; XLA's CPU buffer is not
    assumed for a GPU estimate (XLA compiles the function for the GPU
    there)."""
    cpu = memscope.estimate(grouped_last(), 4, optimizer="sgd", device="cpu", method="graph")
    note = next(n for n in cpu.notes if "one input channel per group" in n)
    assert "DepthwiseConv2D" in note and human_bytes(2 * 7 * 7 * 256 * 256 * 4) in note
    gpu = memscope.estimate(grouped_last(), 4, optimizer="sgd", device="gpu", method="graph")
    assert gpu.workspace_bytes < 7 * 7 * 256 * 256 * 4
    assert not any("one input channel per group" in n for n in gpu.notes)


def test_gradients_handed_back_as_views_are_not_workspace():
    """Conv1D runs as a 2-D convolution between reshapes: its input and filter
    gradients are 4-D tensors the layer hands back reshaped, the same buffers.
    They were also counted among the gradient ops' intermediates, a second
    input gradient (4 MiB here; the layer-types Conv1D at batch 32 went from
    23.2 to 19.2 MiB against 12.5-17.9 measured)."""
    from keras_memscope.graph import trace_model
    from keras_memscope.tfgraph import traced_prims

    model = keras.Sequential([keras.Input((512, 16)), layers.Conv1D(64, 5),
                              layers.Conv1D(64, 5)])
    second = [c for c in trace_model(model, 32).calls if c.layer is model.layers[1]][0]
    prims = traced_prims(second)
    assert {p.name for p in prims} >= {"ExpandDims", "Conv2D", "Squeeze"}
    assert sum(p.backward_workspace_bytes for p in prims) == 0, [
        (p.name, p.backward_workspace_bytes) for p in prims]


def test_an_activation_gradient_writes_into_the_incoming_gradient():
    """ReluGrad is an element-wise kernel: when nothing else reads the
    gradient arriving at a Dense layer with a ReLU, TensorFlow writes the
    ReLU's gradient into it and allocates nothing (allocator trace, with
    oneDNN's kernels and without: no allocation by a ReluGrad). The schedule
    holds that incoming gradient, so the layer's gradient ops need no
    temporary of their own; a Dense layer without an activation, whose
    gradient reads the incoming one directly, needs none either."""
    from keras_memscope.graph import trace_model
    from keras_memscope.tfgraph import traced_prims

    for activation in ("relu", "tanh", "sigmoid", None):
        model = keras.Sequential([keras.Input((64,)), layers.Dense(256, activation=activation),
                                  layers.Dense(10)])
        first = [c for c in trace_model(model, 32).calls if c.layer is model.layers[0]][0]
        prims = traced_prims(first)
        assert sum(p.backward_workspace_bytes for p in prims) == 0, (activation, [
            (p.name, p.backward_workspace_bytes) for p in prims])


def _branches(shared: bool, activations=("relu", "relu", "relu")) -> keras.Model:
    """One tensor through a ReLU into three convolutions: a ReLU layer per
    branch (NASNet's cells), or one ReLU the branches share."""
    inp = keras.Input((32, 32, 8))
    h = layers.Conv2D(16, 3, padding="same")(inp)
    one = layers.Activation("relu")(h)
    branches = [layers.Conv2D(8, 3, padding="same")(
        one if shared else layers.Activation(a)(h)) for a in activations]
    out = layers.Dense(10)(layers.GlobalAveragePooling2D()(layers.Add()(branches)))
    return keras.Model(inp, out)


@pytest.mark.parametrize("method", ["graph", "rules"])
def test_the_same_computation_twice_is_one_tensor(method):
    """Grappler merges ops that compute the same thing from the same tensors
    (allocator trace of ``_branches(shared=False)``: one allocation by a ReLU
    op, not three; NASNet-Mobile at batch 4 went from 86.7 to 69.4 MiB against
    67.7-69.6 measured). Layers applied separately to one tensor cost what one
    shared layer costs; different activations, random layers and layers with
    weights stay separate."""
    from keras_memscope.graph import trace_model

    separate = memscope.estimate(_branches(False), 16, optimizer="sgd", method=method)
    shared = memscope.estimate(_branches(True), 16, optimizer="sgd", method=method)
    assert separate.peak_bytes == shared.peak_bytes
    assert separate.saved_activations_bytes == shared.saved_activations_bytes
    traced = trace_model(_branches(False), 16)
    assert sum(c.class_name == "Activation" for c in traced.calls) == 1
    assert len(traced.merged) == 2
    assert any("grappler merges them" in n for n in separate.notes)
    # a ReLU and a tanh of one tensor are two tensors
    mixed = trace_model(_branches(False, ("relu", "tanh", "relu")), 16).calls
    assert sum(c.class_name == "Activation" for c in mixed) == 2
    # two dropouts of one tensor draw different masks
    inp = keras.Input((64,))
    drops = [layers.Dropout(0.5)(inp) for _ in range(2)]
    model = keras.Model(inp, layers.Dense(1)(layers.Add()(drops)))
    assert sum(c.class_name == "Dropout" for c in trace_model(model, 8).calls) == 2
    # two Dense layers of one tensor have their own weights
    dense = [layers.Dense(4)(inp) for _ in range(2)]
    model = keras.Model(inp, layers.Add()(dense))
    assert sum(c.class_name == "Dense" for c in trace_model(model, 8).calls) == 2


def test_conv_lstm_has_a_rule_and_against_measurement():
    """ConvLSTM2D runs its cell in TensorFlow's loop like an LSTM and keeps
    an LSTM's seven state-sized tensors per step, here per position of the
    output map (8 frames of 32 x 32 x 16 at batch 8: 28 MiB). Without the
    rule the cell was estimated as an unknown layer (6.0 MiB against 32.9-34.9
    measured in three processes with oneDNN's kernels; 36.2 with the rule).
    With TensorFlow's own kernels each step's filter gradients make column
    buffers, two of 27 MiB alive together (allocator traces: 88-98 MiB in use
    at the peak; the estimate was 37.9 MiB before it had them). The highest
    of two processes."""
    from benchmarks import zoo

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no cost rule" warning
        est = memscope.estimate(zoo.convlstm(), 8, optimizer="rmsprop", device="cpu")
    assert not est.unsupported
    assert est.layers[0].rule == "ConvLSTM2D"
    assert est.layers[0].activation_bytes >= 8 * 7 * 8 * 32 * 32 * 16 * 4
    measured = max(memscope.measure(zoo.convlstm(), 8, optimizer="rmsprop", steps=4,
                                    device="cpu").peak_bytes for _ in range(2))
    assert abs(est.peak_bytes / measured - 1) <= 0.15, (est.peak_bytes, measured)


def test_conv_lstm_step_gradient_column_buffers(monkeypatch):
    """With TensorFlow's own kernels a ConvLSTM step's gradient holds as many
    filter-gradient column buffers at once as the CPU has threads, the
    largest first (the state convolutions'), each its own allocation; with
    oneDNN's kernels none."""
    from benchmarks import zoo
    from keras_memscope import devices
    from keras_memscope.rules.conv import col_buffers

    def workspace(onednn: bool, threads: int) -> int:
        monkeypatch.setattr(devices, "cpu_uses_onednn", lambda: onednn)
        monkeypatch.setattr(devices, "cpu_cache_facts", lambda: (512 * 1024, threads))
        est = memscope.estimate(zoo.convlstm(), 8, optimizer="rmsprop", device="cpu",
                                method="rules")
        return est.layers[0].workspace_bytes

    monkeypatch.setattr(devices, "cpu_uses_onednn", lambda: False)
    state, _ = col_buffers((8, 32, 32, 16), (3, 3, 16, 16))
    assert state == 48 * 1024 * 144 * 4  # ceil(30 MiB / 4 / 166144) images
    two, one, none = workspace(False, 2), workspace(False, 1), workspace(True, 2)
    assert two - one == state and one - none == state


def test_a_loop_beside_a_running_weight_gradient_holds_one_column_buffer(monkeypatch):
    """A ConvLSTM step's gradient holds one column buffer per thread running
    it, and while a weight gradient still runs on the second thread the loop
    has one: two ConvLSTM1D (32 filters over 64 positions, 10 steps) and a
    Conv1D, batch 16, Adam, TensorFlow's own kernels. The allocator traces
    (``python -m benchmarks.allocation_trace --model convlstm1d --batch 16
    --optimizer adam --steps 3 --min-kib 1024``) peak at 76.1-76.6 MiB when
    the Conv1D's two 21.1 MiB column buffers are made; its gradients end
    before the loop's, which then holds two 16.4 MiB buffers at a time. The
    simulation ends the Conv1D's input gradient a little before its filter
    gradient, and the loop starting beside that held both of its buffers
    and the filter gradient's: 94.1 MiB, +23%; with one buffer until the
    filter gradient ends, 77.7."""
    from benchmarks import zoo
    from keras_memscope import devices

    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    monkeypatch.setattr(devices, "cpu_uses_onednn", lambda: False)
    est = memscope.estimate(zoo.convlstm1d(), 16, optimizer="adam", device="cpu")
    # the steps peak at 72.0-72.4 or at 76.4-77.0 MiB (eight processes of
    # three steps: 8 of 24 at the lower level, all three of one process in
    # one); six steps reach the higher one but in about one process of 700
    measured = memscope.measure(zoo.convlstm1d(), 16, optimizer="adam", steps=6, device="cpu")
    assert abs(est.peak_bytes / measured.peak_bytes - 1) <= 0.05, (
        est.history_peaks, measured.step_peak_bytes)


def test_conv3d_column_buffers_against_the_allocator_trace(monkeypatch):
    """TensorFlow's Conv3D filter gradient on the video network's first
    convolution (8 x 32 x 32 x 3 -> 16, 3 x 3 x 3), traced on an AMD EPYC
    whose L3 Eigen reads as 320 MiB: no buffer at batch 8, where it would be
    56 times the op's tensors (Eigen's contraction instead), and 268.3125
    MiB (106 volumes of 8192 x 81) at batch 32 (14 times)."""
    from keras_memscope import devices
    from keras_memscope.rules.conv import conv3d_col_buffers

    assert devices.eigen_l3_bytes() >= 512 << 10
    monkeypatch.setattr(devices, "cpu_uses_onednn", lambda: False)
    monkeypatch.setattr(devices, "eigen_l3_bytes", lambda: 320 << 20)
    for batch, filt in ((8, 0), (32, 281346048)):
        assert conv3d_col_buffers((batch, 8, 32, 32, 3), (batch, 8, 32, 32, 16),
                                  (3, 3, 3, 3, 16))[0] == filt
    # the input gradient takes one volume's buffer at batch 1
    assert conv3d_col_buffers((1, 8, 32, 32, 3), (1, 8, 32, 32, 16),
                              (3, 3, 3, 3, 16))[1] == 8192 * 81 * 4


def test_a_convlstm3d_step_takes_conv3d_buffers(monkeypatch):
    """A ConvLSTM3D's cell runs TensorFlow's Conv3D gradient kernels: one
    step of 8 filters over 8 x 16 x 16 x 2 at batch 8 would need a column
    buffer hundreds of times its tensors (with Eigen's L3 at 320 MiB), so
    the kernels fall back and take none; the 2-D buffers the rule gave
    before were 27 MiB each (83.3 MiB estimated against 17.6-18.1 measured
    on an AMD EPYC, TensorFlow's own kernels). At batch 64 with a 2 MiB L3
    the state convolutions' gradients take theirs: 2 MiB / 4 / work rounded
    up, 2 volumes of 2048 x 216, one per thread."""
    import keras

    from keras_memscope import devices
    from keras_memscope.rules.recurrent import _cell_column_buffers

    layer = keras.layers.ConvLSTM3D(8, 3, padding="same")
    monkeypatch.setattr(devices, "cpu_uses_onednn", lambda: False)
    monkeypatch.setattr(devices, "eigen_l3_bytes", lambda: 320 << 20)
    assert _cell_column_buffers(layer, 8, (8, 16, 16, 8), 2, 8, False, "float32",
                                (8, 16, 16)) == ()
    monkeypatch.setattr(devices, "eigen_l3_bytes", lambda: 2 << 20)
    monkeypatch.setattr(devices, "cpu_cache_facts", lambda: (1 << 20, 2))
    work = 2048 * 216 + 2048 * 8 + 216 * 8
    state = -(-(2 << 20) // 4 // work) * 2048 * 216 * 4
    assert _cell_column_buffers(layer, 64, (8, 16, 16, 8), 2, 8, False, "float32",
                                (8, 16, 16)) == (state, state)


def test_conv3d_gradients_against_measurement(monkeypatch):
    """The video network (two 3 x 3 x 3 Conv3D over 8 frames of 32 x 32 x 3)
    with SGD, TensorFlow's own kernels: at batch 8 (13.0 MiB measured on an
    AMD EPYC) no Conv3D gradient buffer, at batch 32 (288.4) the first
    filter gradient's, sized by this machine's L3 as Eigen reads it. Both
    methods within 10% (before: the layer rules +457% at batch 8, a 2-D
    kernel's buffer; both methods -85% at batch 32, none)."""
    from benchmarks import zoo
    from keras_memscope import devices

    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    monkeypatch.setattr(devices, "cpu_uses_onednn", lambda: False)
    for batch in (8, 32):
        measured = memscope.measure(zoo.video(), batch, optimizer="sgd", steps=3, device="cpu")
        for method in ("graph", "rules"):
            est = memscope.estimate(zoo.video(), batch, optimizer="sgd", device="cpu",
                                    method=method)
            assert abs(est.peak_bytes / measured.peak_bytes - 1) <= 0.10, (
                batch, method, est.peak_bytes, measured.step_peak_bytes)


def test_transposes_between_stacked_loops_allocate_nothing(monkeypatch):
    """Two stacked SimpleRNN at batch 64: the allocator trace (``python -m
    benchmarks.allocation_trace --model tests.models:stacked_simple_rnn
    --batch 64 --optimizer adam --steps 2 --min-kib 512``, TensorFlow's own
    kernels) has the first loop's 3.125 MiB sequence stacked once and read
    by the second loop's unstack, and one 3.125 MiB gradient stack: no
    transposed copy of either (grappler removes the transposes to
    batch-major and back). The estimate's transposes are views: the
    forward pass allocates nothing between the loops."""
    from keras_memscope import devices

    from .models import stacked_simple_rnn

    monkeypatch.setattr(devices, "cpu_uses_onednn", lambda: False)
    est = memscope.estimate(stacked_simple_rnn(), 64, optimizer="adam", device="cpu")
    forward = [t for t in est.timeline if t.phase == "forward"]
    k = next(i for i, t in enumerate(forward) if t.event == "to_batch_major")
    assert forward[k + 1].event == "to_time_major"
    assert forward[k].high_bytes == forward[k + 1].high_bytes == forward[k - 1].live_bytes
    backward = [t for t in est.timeline if t.phase == "backward"
                and t.event in ("to_batch_major", "to_time_major")]
    assert len(backward) == 2
    assert all(t.high_bytes == t.live_bytes for t in backward), backward


def test_input_gradient_buffer_against_tensorflows_fixed_cache_size(monkeypatch):
    """TensorFlow's CPU input-gradient kernel contracts one image at a time
    (a one-image column buffer) when a thread's share of one image's work
    reaches a fixed 256 KiB, whatever the machine's L2: at 2 threads the 32 x
    32 x 16 -> 16 convolution's 166144 elements (83072 a thread, over 65536)
    take one image's buffer, at 4 threads (41536) a 48-image shard."""
    from keras_memscope import devices
    from keras_memscope.rules.conv import col_buffers

    monkeypatch.setattr(devices, "cpu_uses_onednn", lambda: False)
    for l2 in (512 * 1024, 1024 * 1024):
        monkeypatch.setattr(devices, "cpu_cache_facts", lambda l2=l2: (l2, 2))
        assert col_buffers((8, 32, 32, 16), (3, 3, 16, 16))[1] == 1024 * 144 * 4
    monkeypatch.setattr(devices, "cpu_cache_facts", lambda: (512 * 1024, 4))
    assert col_buffers((8, 32, 32, 16), (3, 3, 16, 16))[1] == 48 * 1024 * 144 * 4


def test_loss_graph_read_off_tensorflow():
    """The loss's own tensors, from TensorFlow's graph of the loss and its
    gradient: a cross-entropy on logits writes the softmax's gradient into
    the logits (nothing else kept); the same loss on values taken as
    probabilities keeps the clipped values (for the logarithm's gradient),
    the softmax's gradient (written into the logarithm) and the clip's two
    boolean masks: 62.5 + 62.5 + 2 x 15.6 MiB for 16 x 128 x 8000 logits,
    as the allocator trace of such a step holds at its peak."""
    from keras_memscope.tfgraph import trace_loss

    shape = (16, 128, 8000)
    logits = trace_loss(keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        shape, "float32", True)
    assert logits.output_reused and logits.saved_bytes < 1024
    assert logits.gradient_bytes == 16 * 128 * 8000 * 4
    probabilities = trace_loss(keras.losses.SparseCategoricalCrossentropy(), shape,
                               "float32", True)
    out = 16 * 128 * 8000
    assert 0 <= probabilities.saved_bytes - (2 * out * 4 + 2 * out) <= 1024  # (+ scalars)
    assert not probabilities.output_reused


def _additive_attention(tokens: int = 64, dim: int = 64) -> keras.Model:
    inputs = keras.Input((tokens, dim))
    x = layers.Dense(dim)(inputs)  # (a gradient for the queries and keys)
    x = layers.AdditiveAttention()([x, x])
    return keras.Model(inputs, layers.Dense(3)(layers.GlobalMaxPooling1D()(x)))


def test_gradient_ops_ready_together_do_not_write_into_their_input():
    """AdditiveAttention sums ``scale * tanh(q + k)`` over its features: the
    incoming gradient tiled over them is read by the products for the
    ``tanh`` and for ``scale``, which TensorFlow's executor runs side by
    side, so the second does not write into the tiled gradient. Batch 16,
    64 tokens, 64 features: tensors of 16 MiB, four alive together in an
    allocator trace (the kept ``tanh``, the tiled gradient, both products);
    the estimate held three before it knew, 23% under the measured peak.
    The tiled gradient and the ``tanh``'s product are the gradients the
    schedule gives the sum and the product (the tape records which forward
    op each gradient op is for); the product for the ``tanh`` does not write
    into the tiled gradient, which the scale's product reads too
    (``schedule.WEIGHT_GRADIENT_READS_FIRST``): the four together, in the
    layer's gradient."""
    model = _additive_attention()
    big = 16 * 64 * 64 * 64 * 4
    est = memscope.estimate(model, 16, optimizer="sgd", device="cpu", method="graph")
    attention = next(r for r in est.layers if r.class_name == "AdditiveAttention")
    assert attention.activation_bytes >= big  # the tanh
    peak = max(est.timeline, key=lambda p: p.high_bytes)
    name = next(x.name for x in model.layers if isinstance(x, layers.AdditiveAttention))
    assert (peak.phase, peak.layer) == ("backward", name)
    assert est.peak_bytes >= 4 * big, est.peak_bytes / big
    runs = [memscope.measure(model, 16, optimizer="sgd", steps=3, device="cpu")
            for _ in range(2)]
    worst = max(r.peak_bytes for r in runs)
    assert worst >= 4 * big
    assert abs(est.peak_bytes / worst - 1) <= 0.15, (est.peak_bytes, worst)


def test_the_tape_tells_which_forward_op_each_gradient_op_is_for():
    """A gradient op's name tells its forward op only where the forward op's
    name scope holds nothing else: a softmax's gradient makes ``mul``,
    ``Sum``, ``sub`` and ``mul_1`` in the scope it shares with the product
    before it, whose own gradient makes ``Mul``s there too. The tape looks
    each gradient function up in TensorFlow's registry as it goes; noting
    what each makes tells them apart."""
    import tensorflow as tf

    from keras_memscope.tfgraph import _recording_owners

    owners: dict[str, str] = {}

    def step(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = tf.nn.softmax(x * w)
        with _recording_owners(owners):
            return tape.gradient(y, [x, w], output_gradients=tf.ones_like(y))

    graph = tf.function(step).get_concrete_function(
        tf.TensorSpec((4, 8)), tf.TensorSpec(())).graph
    ops = {op.name: op for op in graph.get_operations()}
    softmax = next(n for n, op in ops.items() if op.type == "Softmax")
    product = next(n for n, op in ops.items() if op.type == "Mul" and "gradient" not in n)
    kinds = {}
    for name, forward in owners.items():
        if ops[name].type != "Const":
            kinds.setdefault(forward, []).append(ops[name].type)
    assert set(kinds) == {softmax, product}, owners
    assert sorted(kinds[softmax]) == ["Mul", "Mul", "Sub", "Sum"], kinds
    # the product's: one for x, one for w summed down to its shape
    assert kinds[product].count("Mul") == 2 and "Sum" in kinds[product], kinds
    # and the registry is TensorFlow's own again
    from tensorflow.python.framework import ops as tf_ops
    assert type(tf_ops._gradient_registry).__name__ == "Registry"


def test_a_forward_tensor_only_its_gradient_reads_is_written_into():
    """RMSNormalization's scale gradient is the sum of the incoming gradient
    times the normalized input, which nothing else reads in the backward
    pass: TensorFlow writes the product into it (an allocator trace at
    32 x 256 x 256 has no buffer for it, and frees the normalized input's
    buffer after the sum). The scale's product is no temporary of its own."""
    from keras_memscope.graph import trace_model
    from keras_memscope.tfgraph import traced_prims

    inp = keras.Input((16, 64))
    model = keras.Model(inp, layers.RMSNormalization()(layers.Dense(64)(inp)))
    call = next(c for c in trace_model(model, 8).calls
                if type(c.layer).__name__ == "RMSNormalization")
    prims = traced_prims(call)
    scaled = next(p for p in prims if any(r.startswith("w:") for r in p.inputs))
    assert scaled.workspace_for == (), scaled.workspace_for
    # the product of the input and the reciprocal root still has its own:
    # the input is the layer's, which the Dense before it may hold
    assert any(n == 8 * 16 * 64 * 4 for p in prims for _, n in p.workspace_for)


def test_two_running_gradient_ops_share_the_cores():
    """A weight gradient beside an input gradient: each at half its speed
    alone while both run, the one left at full speed."""
    from keras_memscope.schedule import INF, _Job, _share

    def job(seconds: float) -> _Job:
        return _Job(None, [], [], INF, INF, left=seconds)  # type: ignore[arg-type]

    long_job = job(3.0)
    jobs = [long_job]
    # 1 s of input gradient beside a 3 s job: it ends at 2 s, the job has 2 s left
    assert _share(jobs, 0.0, 1.0) == pytest.approx(2.0)
    assert long_job.start == 0.0 and long_job.end == INF
    assert long_job.left == pytest.approx(2.0)
    # 4 s more: the job ends after 2 x 2 s, then the input gradient runs alone
    assert _share(jobs, 2.0, 4.0) == pytest.approx(8.0)
    assert long_job.end == pytest.approx(6.0)
    # with no input gradient, both threads take jobs in order until one is left
    first, second, third = job(1.0), job(3.0), job(1.0)
    jobs = [first, second, third]
    assert _share(jobs, 0.0, 0.0, keep_waiting=1) == pytest.approx(4.0)
    assert (first.end, third.start, third.end) == pytest.approx((2.0, 2.0, 4.0))
    assert second.left == pytest.approx(1.0) and second.end == INF
    assert _share(jobs, 4.0, 0.0, keep_waiting=0) == pytest.approx(5.0)
    assert second.end == pytest.approx(5.0)
    # no work and nothing to wait for: the time does not move
    assert _share(jobs, 5.0, 0.0) == 5.0


def _nominal_step(monkeypatch, seconds: dict[int, tuple[float, float]],
                  first: bool = True, timed: bool = True) -> tuple[keras.Model, Any]:
    """A 256 -> 512 -> 1024 -> 8 MLP (Dense ``a``, ``b``, ``c``; batch 64,
    SGD) and the nominal order of its simulated CPU step, with each matrix
    product's input and weight gradients taking the seconds given by its
    weight-gradient FLOPs and every other prim none; the simulated times
    decide the copies (``schedule.TIMED_COPIES``), and with ``first`` a
    matrix product's weight gradient starts first while the second thread is
    busy (``schedule.WEIGHT_GRADIENT_FIRST``, the rule where the executor's
    order is not read: here it is not). Both were tried and not adopted
    (benchmarks/RESULTS.md); the executor's order, read where it can be,
    decides call by call (``executor.weight_gradient_first``)."""
    from benchmarks.step_phases import simulations
    from keras_memscope import devices, executor, schedule, timing

    monkeypatch.setattr(executor, "weight_gradient_first", lambda *a, **k: None)
    monkeypatch.setattr(timing, "backward_seconds",
                        lambda c, *rest: seconds.get(c.backward_weight_flops, (0.0, 0.0))
                        if c.kernel == "matmul" else (0.0, 0.0))
    monkeypatch.setattr(schedule, "TIMED_COPIES", timed)
    if first:
        monkeypatch.setattr(schedule, "WEIGHT_GRADIENT_FIRST", frozenset({"matmul"}))
    cpu = dataclasses.replace(devices.get_device("cpu"), order_histories=0, simulated_steps=1)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512, name="a"),
                              keras.layers.Dense(1024, name="b"),
                              keras.layers.Dense(8, name="c")])
    with simulations() as results:
        memscope.estimate(model, 64, optimizer="sgd", device=cpu, method="graph")
    return model, results[0]


def _copied_kernels(monkeypatch, seconds: dict[int, tuple[float, float]],
                    first: bool = True, timed: bool = True) -> set[str]:
    """The Dense kernels of :func:`_nominal_step`'s MLP whose SGD update
    writes into a copy."""
    model, step = _nominal_step(monkeypatch, seconds, first, timed)
    kernels = {id(model.get_layer(name).kernel): name for name in "abc"}
    return {kernels.get(key, "another weight") for key in step.copied_weights}


def test_an_update_copies_its_weight_while_an_input_gradient_reads_it(monkeypatch):
    """TensorFlow writes a variable's update into a copy when an input
    gradient (``dx = g @ W^T``) still holds a read of it, a race between
    the executor's threads (ResNet-50 b16 Adam: 25-28 of the 107 weights its
    input gradients read, in each profiled step). The simulated times decide
    it: ``b``'s kernel is copied when its weight gradient and update end
    long before its input gradient, and not the other way round; ``a``'s
    is read by no input gradient. By default every update whose weight an
    input gradient reads copies it, the larger peak."""
    flops = {name: 2 * 64 * n * m for name, n, m in (("a", 256, 512), ("b", 512, 1024),
                                                      ("c", 1024, 8))}
    slow_input = {flops["b"]: (0.05, 1e-6), flops["c"]: (1e-6, 1e-6)}
    assert _copied_kernels(monkeypatch, slow_input) == {"b"}
    monkeypatch.undo()
    slow_weight = {flops["b"]: (1e-6, 0.05), flops["c"]: (1e-6, 1e-6)}
    assert _copied_kernels(monkeypatch, slow_weight) == set()
    monkeypatch.undo()
    assert {"b", "c"} <= _copied_kernels(monkeypatch, slow_weight, timed=False)


def test_a_weight_gradient_starts_first_when_the_second_thread_is_busy(monkeypatch):
    """``c``'s weight gradient still runs on the second thread when ``b``'s
    gradients become ready: TensorFlow's executor runs ``b``'s weight
    gradient at once on the thread that made it ready and queues the input
    gradient, so ``b``'s quick update writes before its input gradient has
    read the kernel, and copies it. Were the input gradient first, ``b``'s
    weight gradient would wait for ``c``'s and end after it."""
    flops = {name: 2 * 64 * n * m for name, n, m in (("a", 256, 512), ("b", 512, 1024),
                                                      ("c", 1024, 8))}
    busy = {flops["c"]: (1e-6, 0.05), flops["b"]: (0.01, 1e-6)}
    assert _copied_kernels(monkeypatch, busy) == {"b"}
    monkeypatch.undo()
    assert _copied_kernels(monkeypatch, busy, first=False) == set()


def test_the_job_that_ends_while_an_input_gradient_waits_lets_go_first(monkeypatch):
    """``b``'s weight gradient starts first beside ``c``'s, and ``b``'s
    input gradient waits for a thread. When ``c``'s ends first it lets go of
    what it held (``b``'s output, ``c``'s output gradient) before the input
    gradient's 128 KiB is made: a three-convolution trunk at b64
    (``benchmarks.zoo.multihead``) runs so in every profiled step, the second
    convolution's input gradient starting after the third's filter gradient
    ends (``python -m benchmarks.op_timeline``). When ``b``'s ends first,
    what only it read goes (``a``'s 128 KiB output), and ``b``'s output
    gradient stays for the input gradient, which reads it."""
    flops = {name: 2 * 64 * n * m for name, n, m in (("a", 256, 512), ("b", 512, 1024),
                                                      ("c", 1024, 8))}
    c_first = {flops["c"]: (1e-6, 0.01), flops["b"]: (1e-6, 0.05)}
    _, step = _nominal_step(monkeypatch, c_first)
    points = [p for p in step.timeline if p.phase == "backward"]
    at = {(p.layer, p.event): k for k, p in enumerate(points)}
    c_done, b_input = at["c", "MatMul (weight gradients)"], at["b", "MatMul"]
    assert c_done < b_input < at["b", "MatMul (weight gradients)"], at
    monkeypatch.undo()
    b_first = {flops["c"]: (1e-6, 0.05), flops["b"]: (1e-6, 0.01)}
    _, step = _nominal_step(monkeypatch, b_first)
    points = [p for p in step.timeline if p.phase == "backward"]
    at = {(p.layer, p.event): k for k, p in enumerate(points)}
    b_done, b_input = at["b", "MatMul (weight gradients)"], at["b", "MatMul"]
    assert b_done + 1 == b_input < at["c", "MatMul (weight gradients)"], at
    kernel, x = 512 * 1024 * 4, 64 * 512 * 4
    assert points[b_done].live_bytes - points[b_done - 1].live_bytes == kernel - x
    assert points[b_input].live_bytes - points[b_done].live_bytes == x  # b's input gradient


def test_an_update_that_takes_time_holds_its_gradient_beside_the_next(monkeypatch):
    """With ``schedule.UPDATES_TAKE_TIME`` the gated MLP's (b8 Adam) second
    kernel's update still runs when the first kernel's gradient is made, and
    the two updates run side by side: at the peak each 2048 x 2048 kernel
    holds its gradient and one Adam temporary, as in the allocator trace of
    its 160.5 MiB steps (``python -m benchmarks.allocation_trace --model
    tests.models:gated_mlp --batch 8 --optimizer adam``: ``Square_3`` of the
    one beside ``Square`` of the other, then the two ``Sqrt``s and
    ``Mul``s). Without it the updates come and go one at a time."""
    from keras_memscope import devices, schedule

    cpu = dataclasses.replace(devices.get_device("cpu"), order_histories=0)
    model = gated_mlp()
    kernels = [layer.name for layer in model.layers
               if isinstance(layer, keras.layers.Dense) and layer.units == 2048]
    kernel = 2048 * 2048 * 4

    def held() -> dict[tuple[str, str], int]:
        est = memscope.estimate(model, 8, optimizer="adam", device=cpu, method="graph")
        assert est.peak_phase == "update"
        return {(h.layer, h.kind): h.bytes for h in est.peak_holders
                if h.layer in kernels and h.kind in ("gradient", "optimizer update")}

    one_at_a_time = held()  # one kernel's update: its gradient and temporaries
    assert len({layer for layer, _ in one_at_a_time}) == 1, one_at_a_time
    monkeypatch.setattr(schedule, "UPDATES_TAKE_TIME", True)
    side_by_side = held()
    assert set(side_by_side) == {(name, kind) for name in kernels
                                 for kind in ("gradient", "optimizer update")}
    for name in kernels:
        assert side_by_side[name, "optimizer update"] == kernel
        # (and the layer's 8 KiB bias gradient where its update still waits)
        assert kernel <= side_by_side[name, "gradient"] <= kernel + 2048 * 4


def test_a_view_of_the_batch_is_the_batch():
    """Conv1D's first op is an ExpandDims of its input, a view: on the batch
    it allocates nothing, and what the filter gradient keeps of it is the
    batch, already counted (an allocator trace of a SeparableConv1D network
    at b64: its first kernels' outputs, 2 and 4 MiB, and no copy of the 2 MiB
    batch)."""
    model = keras.Sequential([keras.Input((256, 32)), keras.layers.Conv1D(8, 3, padding="same"),
                              keras.layers.GlobalMaxPooling1D(), keras.layers.Dense(4)])
    est = memscope.estimate(model, 64, optimizer="sgd", device="cpu", method="graph")
    conv = next(r for r in est.layers if r.class_name == "Conv1D")
    assert conv.rule == "graph"
    assert conv.activation_bytes < 64 * 256 * 32 * 4, conv.activation_bytes


def test_a_products_two_gradients_run_side_by_side(monkeypatch):
    """A product's gradient ops ``dy * b`` and ``dy * a`` become ready
    together; with the CPU's second thread free TensorFlow runs them side by
    side, and neither writes into ``dy``. UnitNormalization's ``x * inv`` at
    batch 512 (1 MiB tensors): both products have buffers of their own in an
    allocator trace of the SELU network (`benchmarks.allocation_trace
    --model selunet --batch 512 --optimizer adamw`), where the estimate had
    written ``x``'s gradient into ``dy``. Read off the graph; the schedule
    acts on it only under ``schedule.SIDE_BY_SIDE_GRADIENTS`` (tried, not
    adopted: the 72 configurations' median 3.47% -> 3.26%, the remedies
    within 15% 8 -> 5 of 8)."""
    from keras_memscope import schedule, tfgraph
    from keras_memscope.graph import trace_model

    def model() -> keras.Model:
        return keras.Sequential([keras.Input((256,)), keras.layers.Dense(512),
                                 keras.layers.UnitNormalization(), keras.layers.Dense(8)])

    call = next(c for c in trace_model(model(), 512).calls if "unit_normalization" in c.name)
    prims = tfgraph.traced_prims(call)
    together = {p.name for p in prims if p.grad_read_together}
    assert together == {"Mul"}, [(p.name, p.grad_read_together) for p in prims]
    assert any(p.name == "Square" and p.grad_inplace for p in prims)  # one gradient op

    def step_at_the_product(m: keras.Model) -> int:
        est = memscope.estimate(m, 512, optimizer="sgd", device="cpu", method="graph")
        points = list(est.timeline)
        k = next(i for i, p in enumerate(points) if p.phase == "backward"
                 and p.layer.startswith("unit_normalization") and p.event == "Mul")
        return points[k].live_bytes - points[k - 1].live_bytes

    # tried, not adopted (schedule.SIDE_BY_SIDE_GRADIENTS): x's gradient in
    # a buffer of its own while the second thread is free
    monkeypatch.setattr(schedule, "SIDE_BY_SIDE_GRADIENTS", True)
    assert step_at_the_product(model()) >= 2**20
    # (also tried: an update made during the backward pass holds the second
    # thread, here the last Dense's SGD update, made just before)
    monkeypatch.setattr(schedule, "UPDATES_HOLD_THE_THREAD", True)
    assert step_at_the_product(model()) < 2**20
    monkeypatch.setattr(schedule, "UPDATES_HOLD_THE_THREAD", False)
    # by default written into the incoming gradient, as where the ops are
    # not known to be ready together
    monkeypatch.setattr(schedule, "SIDE_BY_SIDE_GRADIENTS", False)
    assert step_at_the_product(model()) < 2**20
    monkeypatch.setattr(schedule, "SIDE_BY_SIDE_GRADIENTS", True)
    monkeypatch.setattr(tfgraph, "_incoming_read_together", lambda *args: set())
    monkeypatch.setattr(tfgraph, "_CACHE", {})
    assert step_at_the_product(model()) < 2**20


def assert_loop_within_its_bound(model: keras.Model, batch: int, optimizer: str,
                                 tolerance: float = 0.10) -> None:
    """The highest of two measuring processes' peaks (four steps each) lies
    between the graph estimate and the estimate plus what the recurrent
    loop may hold if it runs ahead of its weight-gradient sums
    (``possible_extra_bytes``), within ``tolerance``: a step where it ran
    ahead is as real as one where it kept up. (The possible extra is 0
    where the step peaks elsewhere: on a CPU without oneDNN's kernels the
    column buffer of the Conv1D before ``grudrop``'s GRU, 40 MiB, is the
    peak; estimated 72.5 MiB, measured 72.9-73.3 on an AVX2 EPYC.)"""
    est = memscope.estimate(model, batch, optimizer=optimizer, device="cpu", method="graph")
    assert est.possible_extra_bytes >= 0
    measured = [memscope.measure(model, batch, optimizer=optimizer, steps=4, device="cpu")
                for _ in range(2)]
    highest = max(m.peak_bytes for m in measured)
    low, high = est.peak_bytes, est.peak_bytes + est.possible_extra_bytes
    assert (1 - tolerance) * low <= highest <= (1 + tolerance) * high, (
        low, high, [m.step_peak_bytes for m in measured])


def test_logits_from_a_layer_without_activation_share_the_losss_gradient():
    """A cross-entropy told its values are logits reads the model's output
    itself, whatever layer makes it: TensorFlow writes the softmax's
    gradient into the logits' buffer. An output layer without an
    ``activation`` (a custom projection) used to be taken for a softmax,
    whose loss reads the logits underneath, and kept both tensors."""
    from keras_memscope.estimator import _from_logits, _loss_specs

    class Project(layers.Layer):
        def build(self, shape):
            self.kernel = self.add_weight(shape=(shape[-1], 500))

        def call(self, x):
            return keras.ops.matmul(x, self.kernel)

    inputs = keras.Input((16, 32))
    model = keras.Model(inputs, Project()(layers.Dense(32)(inputs)))
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    (spec,) = _loss_specs(model, [keras.KerasTensor((8, 16, 500))], traced=True)
    assert spec.output_reused and spec.gradient_bytes == 8 * 16 * 500 * 4
    assert _from_logits({"class_name": "X", "config": {"from_logits": True}})
    assert not _from_logits("sparse_categorical_crossentropy")
    assert not _from_logits(keras.losses.SparseCategoricalCrossentropy())


def test_logits_of_a_custom_projection_against_measurement():
    """A language model whose logits come from a custom projection layer
    (8000 words, 64 tokens, batch 32, Adam): the logits (62.5 MiB) hold the
    loss's gradient. Measured 105.6-106.6 MiB in two processes, estimated
    104.4; 158.6 with the two held apart. (The accuracy set's model with
    tied embeddings: 89.4-92.5 measured, 95.2 estimated, 151.4 before.)"""
    from .models import projected_lm

    assert_near_highest_process(projected_lm(), 32, "adam")


def _kept_by_loop(layer: keras.layers.Layer, shape: tuple[int, ...],
                  both: bool = False) -> object:
    """What one iteration of the layer's loop keeps, read off its graph (with
    ``both``, every loop's, in order)."""
    from keras_memscope.graph import trace_model
    from keras_memscope.tfgraph import LoopLayer, traced_prims

    model = keras.Sequential([keras.Input(shape[1:]), layer])
    calls = trace_model(model, shape[0], is_leaf=lambda op: op is layer).calls
    (call,) = [c for c in calls if c.layer is layer]
    with pytest.raises(LoopLayer) as info:
        traced_prims(call)
    if both:
        return info.value.loops
    (kept,) = info.value.loops
    return kept


def test_loop_keeps_what_its_gradient_loop_reads():
    """A recurrent layer's loop keeps, per step, what TensorFlow's gradient
    loop pops (``tfgraph.loop_iteration_bytes``): an LSTM its gates, states
    and ``tanh(c)`` (7 state-sized tensors); a GRU with ``reset_after=False``
    and recurrent dropout 9 state-sized tensors and three slices of its
    recurrent kernel, copied at every step. Its three input-kernel slices
    are read only by the input's gradient, so they are kept only where that
    gradient is wanted (the allocator trace of such a GRU after the model's
    input holds 240 slices of 36 KiB at its peak, none of 9 KiB)."""
    batch, steps, features, units = 4, 6, 24, 96
    state = batch * units * 4

    def big(sizes):
        return sorted(n for n in sizes if n >= 1024)

    lstm = _kept_by_loop(layers.LSTM(units, return_sequences=True), (batch, steps, features))
    assert big(lstm.always) == [state] * 7 and not big(lstm.for_input)
    gru = _kept_by_loop(layers.GRU(units, return_sequences=True, reset_after=False,
                                   recurrent_dropout=0.1), (batch, steps, features))
    assert big(gru.always) == sorted([state] * 9 + [units * units * 4] * 3)
    assert big(gru.for_input) == [features * units * 4] * 3


def test_gru_with_recurrent_dropout_against_measurement():
    """The GRU above in the accuracy set's model (80 steps, batch 32,
    RMSprop): measured 20.9-22.1 MiB in the accuracy set's 18 steps,
    estimated 21.3 (up to 24.8 if the loop runs ahead of its sums; one
    step of eight measured in the tests reached 26.0); 9.9 with the cell's
    count of six state-sized tensors per step."""
    from benchmarks.zoo import grudrop

    assert_loop_within_its_bound(grudrop(), 32, "rmsprop")


def test_bidirectional_loops_each_keep_what_their_gradient_loop_reads():
    """A Bidirectional layer runs two loops, the forward layer's first; each
    direction's rule gets its own loop's count. With ``reset_after=False``
    (and no dropout) each GRU copies two slices of its recurrent kernel at
    every step, the update and reset gates' columns together and the
    candidate's, which the cell's count of six state-sized tensors has no
    room for."""
    steps, features, units, batch = 20, 8, 32, 4
    gru = layers.GRU(units, reset_after=False, return_sequences=True)
    layer = layers.Bidirectional(gru)
    model = keras.Sequential([keras.Input((steps, features)), layer, layers.Dense(1)])
    loops = _kept_by_loop(layer, (batch, steps, features), both=True)
    assert len(loops) == 2
    slices = [units * units * 4, units * 2 * units * 4]
    for kept in loops:
        assert sorted(n for n in kept.always if n >= units * units * 4) == slices
    est = memscope.estimate(model, batch, optimizer="sgd", device="cpu", method="graph")
    (record,) = [r for r in est.layers if r.class_name == "Bidirectional"]
    # two directions, every step: six state-sized tensors and the three slices
    assert record.activation_bytes >= 2 * steps * (6 * batch * units * 4 + sum(slices))


def test_lstm_with_dropout_against_measurement():
    """An LSTM with ``dropout`` and ``recurrent_dropout`` after an Embedding
    (the accuracy set ``--unforeseen``: 100 steps, 128 units, batch 32,
    Adam): its cell copies four slices of each kernel at every step and
    multiplies input and state by four masks each, and the input's gradient
    is wanted (the Embedding's), so all of them are kept. Measured
    66.7-68.3 MiB in three processes, estimated 66.1; 20.6 with the cell's
    count of seven state-sized tensors (up to 77.7 if the loop runs ahead
    of its sums)."""
    from benchmarks.zoo import lstmdrop

    assert_loop_within_its_bound(lstmdrop(), 32, "adam")


def test_saved_inputs_donate_writes_a_gelu_gradient_into_its_forward_tensors(monkeypatch):
    """``schedule.SAVED_INPUTS_DONATE`` (tried, not adopted): the GELU's
    gradient products go into the forward tensors only they read, so no
    simulated order makes a new activation-sized buffer there; off, the
    orders in which the next layer's kernel gradient still holds the GELU's
    output make one more (benchmarks/RESULTS.md, "A GELU gradient written
    into its forward tensors")."""
    from keras_memscope import schedule

    def model():
        inputs = keras.Input((128, 64))
        h = layers.Dense(256, activation="gelu")(inputs)
        return keras.Model(inputs, layers.Dense(8)(layers.Dense(64)(h)))

    size = 64 * 128 * 256 * 4
    off = memscope.estimate(model(), 64, optimizer="sgd", device="cpu")
    monkeypatch.setattr(schedule, "SAVED_INPUTS_DONATE", True)
    on = memscope.estimate(model(), 64, optimizer="sgd", device="cpu")
    assert max(off.history_peaks) - min(off.history_peaks) >= size
    assert max(on.history_peaks) - min(on.history_peaks) < size / 2
    assert on.peak_bytes <= off.peak_bytes - size


def test_a_transpose_only_matrix_products_read_is_folded_into_them():
    """Grappler's arithmetic optimizer has a matrix product read the input of
    a transpose of the last two axes with its own transpose flag: where only
    products read the transpose, it is never made (the allocator trace of a
    bidirectional GRU under Keras' ``Attention`` layer has no forward
    transpose of its keys, and the gradient's ``transpose``). A transpose
    that something else reads, or of other axes, is made."""
    import tensorflow as tf

    from keras_memscope.tfgraph import _folded_transpose

    def transposes(fn):
        graph = tf.function(fn, autograph=False).get_concrete_function(
            tf.TensorSpec((4, 8, 16)), tf.TensorSpec((4, 8, 16))).graph
        return [_folded_transpose(op) for op in graph.get_operations()
                if op.type == "Transpose"]

    assert transposes(lambda q, k: q @ tf.transpose(k, [0, 2, 1])) == [True]
    def also_summed(q, k):
        kt = tf.transpose(k, [0, 2, 1])
        return q @ kt + tf.reduce_sum(kt)

    assert transposes(also_summed) == [False]
    assert transposes(lambda q, k: tf.transpose(q, [1, 0, 2]) @ tf.transpose(
        k, [1, 2, 0])) == [False, False]
    # in a model: the transposed keys are a view of the keys, not a buffer
    # the layer keeps for its gradient
    from keras_memscope import tfgraph

    def kept() -> int:
        inputs = keras.Input((32, 16))
        x = keras.layers.Dense(16)(inputs)
        model = keras.Model(inputs, keras.layers.Dense(4)(keras.layers.Attention()([x, x])))
        est = memscope.estimate(model, 8, optimizer="sgd", device="cpu", method="graph")
        return next(r for r in est.layers if r.class_name == "Attention").activation_bytes

    folded = kept()
    tfgraph._CACHE.clear()
    with mock.patch.object(tfgraph, "_folded_transpose", lambda op: False):
        made = kept()
    tfgraph._CACHE.clear()
    assert made - folded == 8 * 32 * 16 * 4, (made, folded)


@keras.saving.register_keras_serializable(package="memscope_tests")
class Attend(keras.layers.Layer):
    """``exp(s - max(s)) v`` with ``s = q q^T``: a product of two
    activations (``probs v``) whose gradient for ``probs`` the exponential's
    gradient reads next, then the subtraction's (a new ``-dz`` of the
    scores' size, as a softmax written with ``logsumexp`` makes)."""

    def call(self, q, v):
        from keras import ops

        s = ops.matmul(q, ops.transpose(q, (0, 2, 1)))
        return ops.matmul(ops.exp(s - ops.max(s, axis=-1, keepdims=True)), v)


def test_a_product_of_two_activations_holds_its_inputs_till_its_second_gradient_ends(
        monkeypatch):
    """Both gradient products of ``probs v`` become ready together; the
    second (for ``v``, made first in the forward pass) runs on the CPU's
    second thread and holds what it reads until it ends: ``probs`` (64 x
    256 x 256 float32, 16 MiB) and 0.5 MiB tensors (the output gradient,
    its own result). When it outlasts the first product and the exponential's
    gradient, all three are alive where the subtraction's gradient runs;
    when it ends first, none. (An allocator trace of a 256-position
    attention, ``axialattn`` b32, 32 MiB probabilities: 137.2-137.3 MiB
    at the softmax's subtraction gradient in three steps where the product
    for ``v`` ended last, 108.1 at most in one where it ended first.)
    With ``schedule.PRODUCT_GRADIENTS_SIDE_BY_SIDE`` True (by default
    where the ordering speeds time each gradient: TensorFlow's own
    kernels)."""
    from keras_memscope import devices, schedule, timing

    inputs = keras.Input((256, 8))
    q, v = layers.Dense(8)(inputs), layers.Dense(8)(inputs)
    model = keras.Model(inputs, layers.Dense(2)(Attend()(q, v)))
    probs, small = 64 * 256 * 256 * 4, 64 * 256 * 8 * 4
    product = 2 * 64 * 256 * 256 * 8  # FLOPs of one gradient product of probs v
    cpu = dataclasses.replace(devices.get_device("cpu"), order_histories=0, simulated_steps=1)

    def at_the_subtraction(second_seconds: float) -> int:
        def seconds(c, *rest):
            if c.kernel == "matmul" and c.backward_weight_flops == product:
                return 1e-3, second_seconds  # (the product for probs, the one for v)
            return (1e-4, 1e-6) if c.backward_input_flops else (0.0, 0.0)
        monkeypatch.setattr(timing, "backward_seconds", seconds)
        est = memscope.estimate(model, 64, optimizer="sgd", device=cpu, method="graph")
        return next(p.live_bytes for p in est.timeline if p.phase == "backward"
                    and p.layer.startswith("attend") and p.event == "Sub")

    monkeypatch.setattr(schedule, "PRODUCT_GRADIENTS_SIDE_BY_SIDE", True)
    held = at_the_subtraction(1.0) - at_the_subtraction(1e-4)
    assert probs + small <= held < probs + 3 * small, held
    # False: both on the first thread, one after the other: the times do
    # not matter
    monkeypatch.setattr(schedule, "PRODUCT_GRADIENTS_SIDE_BY_SIDE", False)
    assert at_the_subtraction(1.0) == at_the_subtraction(1e-4)


@pytest.mark.parametrize("equation,shapes,transposed", [
    # attention's scores, key first (Keras' MultiHeadAttention): the key's
    # gradient reads the scores' gradient ordered batch, contracted, free
    # (adj_x), and the query copied into batch, free, contracted (adj_y)
    ("acbe,abcd->aecd", [(2, 4, 64, 64), (2, 64, 4, 8)],
     2 * 4 * 64 * 64 * 4 + 2 * 64 * 4 * 8 * 4),
    # the query's: the scores' gradient as stored, the key copied (adj_y)
    ("acbe,aecd->abcd", [(2, 4, 64, 64), (2, 64, 4, 8)], 2 * 64 * 4 * 8 * 4),
    # probs v's gradient for v: probs is the second operand, ordered batch,
    # contracted, free, as a product's right-hand side is read; the output
    # gradient is copied into batch, free, contracted: nothing
    ("abcd,acbe->aecd", [(2, 64, 4, 8), (2, 4, 64, 64)], 0),
    # an outer product (no contracted dimension): nothing read across
    ("bi,bj->bij", [(8, 64), (8, 64)], 0),
])
def test_the_operands_an_einsum_reads_transposed(equation, shapes, transposed):
    """``EinsumOp`` multiplies ``x @ y`` with ``adj_x`` where the first
    operand is ordered batch, contracted, free and with ``adj_y`` where the
    second is not (``ContractOperands``: ``trans_y =
    !swap_free_and_contract[1]``); TensorFlow's own CPU kernels read such an
    operand at about half the speed (``benchmarks/matmul_forms.py``)."""
    from keras_memscope.tfgraph import einsum_transposed_reads

    assert einsum_transposed_reads(equation, shapes, 4) == transposed


def test_a_gradient_reading_its_operand_transposed_takes_longer_on_tensorflows_kernels(
        monkeypatch):
    """The traced gradient ops of a product of two activations say what each
    reads transposed (``Prim.transposed_reads``): the scores ``s =
    einsum("bsd,btd->bts", k, q)`` (key first, as Keras' attention has it)
    have the gradient ``einsum("bts,btd->bsd", ds, q)`` for ``k``, which
    reads the 4 MiB ``ds`` ordered batch, contracted, free (``adj_x``), and
    for ``q`` one that reads nothing transposed. On the speeds that order
    the CPU's two gradient threads, where TensorFlow runs its own kernels,
    the gradients take ``4 MiB / NOMINAL_TRANSPOSED_READ_BYTES_S`` longer;
    with oneDNN's kernels (no such penalty), not."""
    from keras import ops

    from keras_memscope import devices, schedule, timing

    class Scores(keras.layers.Layer):
        def call(self, q, k):
            return ops.einsum("bsd,btd->bts", k, q)

    inputs = keras.Input((256, 8))
    q, k = layers.Dense(8)(inputs), layers.Dense(8)(inputs)
    s = Scores()(q, k)
    model = keras.Model(inputs, layers.Dense(2)(layers.GlobalAveragePooling1D()(s)))
    seen = []
    real = schedule._costs

    def costs(flats, *args, **kwargs):
        out = real(flats, *args, **kwargs)
        seen.extend(c for c in out if c.kernel == "matmul" and c.macs == 16 * 256 * 256 * 8)
        return out

    monkeypatch.setattr(schedule, "_costs", costs)
    cpu = dataclasses.replace(devices.get_device("cpu"), order_histories=0)
    memscope.estimate(model, 16, optimizer="sgd", device=cpu, method="graph")
    scores = next(c for c in seen if c.backward_input_flops)
    assert scores.backward_input_transposed == 16 * 256 * 256 * 4  # ds
    plain = dataclasses.replace(scores, backward_input_transposed=0)
    for onednn in (False, True):
        monkeypatch.setattr(devices, "cpu_uses_onednn", lambda onednn=onednn: onednn)
        profile = timing.ordering_profile(cpu)
        extra = (timing.backward_seconds(scores, profile)[0]
                 - timing.backward_seconds(plain, profile)[0])
        expected = 0.0 if onednn else scores.backward_input_transposed / \
            timing.NOMINAL_TRANSPOSED_READ_BYTES_S
        assert extra == pytest.approx(expected)


def test_a_dense_layers_input_gradient_reads_its_kernel_transposed(monkeypatch):
    """With ``tfgraph.DENSE_TRANSPOSED_READS`` (tried, not adopted):
    ``_MatMulGrad`` computes a Dense layer's input gradient as ``dy @
    W^T`` (``transpose_b``) and its kernel's as ``x^T @ dy``
    (``transpose_a``), as the traced gradient ops say. The first reads the
    kernel transposed (``benchmarks/dense_gradient_speeds.py``: on
    TensorFlow's own kernels ``dy @ W^T`` takes the kernel's bytes at about
    2.3 GB/s longer than ``x @ W``); the second reads the batch's ``x``
    transposed and takes no longer than ``x @ W``: nothing counted."""
    from keras_memscope import devices, schedule, tfgraph

    assert tfgraph.DENSE_TRANSPOSED_READS is False  # (tried, not adopted)
    monkeypatch.setattr(tfgraph, "DENSE_TRANSPOSED_READS", True)
    monkeypatch.setattr(tfgraph, "_CACHE", {})  # (traced with the switch on)
    inputs = keras.Input((256,))
    model = keras.Model(inputs, layers.Dense(10)(layers.Dense(1024)(layers.Dense(256)(inputs))))
    seen = []
    real = schedule._costs

    def costs(flats, *args, **kwargs):
        out = real(flats, *args, **kwargs)
        seen.extend(c for c in out if c.kernel == "matmul" and c.macs == 8 * 256 * 1024)
        return out

    monkeypatch.setattr(schedule, "_costs", costs)
    cpu = dataclasses.replace(devices.get_device("cpu"), order_histories=0)
    memscope.estimate(model, 8, optimizer="sgd", device=cpu, method="graph")
    middle = next(c for c in seen if c.backward_input_flops)
    assert middle.backward_input_transposed == 256 * 1024 * 4  # the kernel
    # (x^T @ dy reads x transposed, and takes no longer than as stored)
    assert middle.backward_weight_transposed == 0


def test_a_convolutions_gradients_are_timed_as_the_products_they_are(monkeypatch):
    """On TensorFlow's own CPU kernels a Conv2D's filter gradient is one
    product ``col^T @ dy`` (filter_total x out, contracting over every
    image's positions) and its input gradient one ``dy @ W^T`` per image
    (the image's positions x filter_total, contracting over the output
    channels), or the images shared out among the threads where one image's
    product is small; with ``timing.CONV_GEMM_SHAPES`` (tried, not adopted)
    each is timed at ``CONV_GRADIENT_CONTRACTIONS``' speed for its own
    shape. Timed alone on a 2-core AMD EPYC (``python -m
    benchmarks.conv_gradient_speeds --fit``, three runs), a 7 x 7 512 ->
    512 convolution's filter gradient took 0.37-0.40 times as long as its
    input gradient (49-row products per image) and a 112 x 112 32 -> 32
    one's 1.72-2.38 times (32 output channels); the nominal speeds make it
    1.55 times as long in both (58.9 GFLOP/s against 104.1, capped at the
    91.1 peak)."""
    from keras_memscope import devices, schedule, timing

    assert timing.CONV_GEMM_SHAPES is False  # (tried, not adopted)
    monkeypatch.setattr(devices, "cpu_uses_onednn", lambda: False)
    monkeypatch.setattr(devices, "cpu_cache_facts", lambda: (512 * 1024, 2))
    # the traced Conv2D's products (3 x 3, 16 -> 8, 'same', 12 x 12 images)
    filt, inp = timing.conv_gradient_products(4, 144, 144, 8)
    assert filt == (144, 8, 4 * 144)
    assert inp == (4 * 144, 144, 8)  # each thread's share of an image is small
    assert timing.conv_gradient_products(1, 144, 144, 8)[1] == (144, 144, 8)
    big = timing.conv_gradient_products(16, 49, 4608, 512)[1]
    assert big == (49, 4608, 512)  # one image at a time on both threads

    inputs = keras.Input((12, 12, 16))
    model = keras.Model(inputs, layers.Dense(2)(layers.Flatten()(
        layers.Conv2D(8, 3, padding="same")(inputs))))
    seen = []
    real = schedule._costs

    def costs(flats, *args, **kwargs):
        out = real(flats, *args, **kwargs)
        seen.extend(c for c in out if c.kernel == "conv")
        return out

    monkeypatch.setattr(schedule, "_costs", costs)
    cpu = dataclasses.replace(devices.get_device("cpu"), order_histories=0)
    memscope.estimate(model, 4, optimizer="sgd", device=cpu, method="graph")
    assert seen and all(c.conv_gemm == (4, 144, 144, 8) for c in seen)

    def ratio(batch: int, side: int, cin: int, cout: int) -> float:
        macs = batch * side * side * 9 * cin * cout
        cost = schedule.PrimCost(0, 2 * macs, 0, 2 * macs, 2 * macs, 0, macs, "conv",
                                 out_channels=cout, conv_gemm=(batch, side * side, 9 * cin, cout))
        ordering = timing.ordering_profile(devices.get_device("cpu"))
        t_in, t_w = timing.backward_seconds(cost, ordering)
        return t_w / t_in

    monkeypatch.setattr(timing, "CONV_GEMM_SHAPES", False)
    nominal = ratio(16, 7, 512, 512)
    assert nominal == pytest.approx(ratio(8, 112, 32, 32), rel=1e-3) and nominal > 1.5
    monkeypatch.setattr(timing, "CONV_GEMM_SHAPES", True)
    assert ratio(16, 7, 512, 512) < 0.6 and ratio(8, 112, 32, 32) > 1.2


def test_a_products_second_gradient_runs_beside_the_first_on_tensorflows_kernels(monkeypatch):
    """By default (``schedule.PRODUCT_GRADIENTS_SIDE_BY_SIDE`` None) the two
    gradients of ``probs v`` run side by side where the speeds that order the
    CPU's threads give each its own time (TensorFlow's own kernels: the one
    for ``v`` reads the 16 MiB ``probs``, transposed here, at
    ``NOMINAL_GEMM_READ_BYTES_S``, and outlasts the one for ``probs`` and
    the exponential's gradient, so ``probs`` is alive at the subtraction's
    gradient); with oneDNN's kernels one after the other, ``probs`` freed."""
    from keras_memscope import devices, schedule

    assert schedule.PRODUCT_GRADIENTS_SIDE_BY_SIDE is None
    inputs = keras.Input((256, 8))
    q, v = layers.Dense(8)(inputs), layers.Dense(8)(inputs)
    model = keras.Model(inputs, layers.Dense(2)(Attend()(q, v)))
    probs = 64 * 256 * 256 * 4
    cpu = dataclasses.replace(devices.get_device("cpu"), order_histories=0, simulated_steps=1)

    def at_the_subtraction(onednn: bool) -> int:
        monkeypatch.setattr(devices, "cpu_uses_onednn", lambda: onednn)
        est = memscope.estimate(model, 64, optimizer="sgd", device=cpu, method="graph")
        return next(p.live_bytes for p in est.timeline if p.phase == "backward"
                    and p.layer.startswith("attend") and p.event == "Sub")

    assert at_the_subtraction(False) - at_the_subtraction(True) >= probs


def _attention_block(tokens: int, heads: int, key_dim: int, dropout: float = 0.0,
                     blocks: int = 1) -> keras.Model:
    inp = keras.Input((tokens, heads * key_dim))
    x = inp
    for _ in range(blocks):
        x = layers.Add()([x, layers.MultiHeadAttention(heads, key_dim, dropout=dropout)(x, x)])
    return keras.Model(inp, layers.Dense(4)(layers.GlobalAveragePooling1D()(x)))


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_constant_pushed_down_into_softmaxs_gradient_runs_in_the_forward_pass(
        monkeypatch, dropout):
    """Keras' attention without dropout scales its logits after the product
    (``ops.dot_product_attention``), so the softmax's gradient is multiplied
    by the scale: ``((g - sum(g * p)) * p) * scale``. Grappler's constant
    folding rewrites it as ``(scale * p) * (g - ...)`` (``ConstantPushDown``),
    and ``scale * p`` reads only the forward pass's probabilities: it runs
    there and is held until the gradient, one more logits-sized tensor per
    layer (an allocator trace of a Conformer's step: ``gradient_tape/.../
    mul_1``, 16 MiB, from each attention layer's forward pass to its
    gradient). With dropout Keras scales the query before the product and
    nothing is pushed down."""
    from keras_memscope import tfgraph

    batch, tokens, heads, key_dim = 4, 64, 2, 16
    logits = batch * heads * tokens * tokens * 4

    def kept(push: bool) -> int:
        monkeypatch.setattr(tfgraph, "PUSH_CONSTANTS_DOWN", push)
        monkeypatch.setattr(tfgraph, "_CACHE", {})  # (traced calls are cached)
        keras.utils.clear_session()
        est = memscope.estimate(_attention_block(tokens, heads, key_dim, dropout), batch,
                                optimizer="sgd", device="cpu", method="graph")
        return next(r.activation_bytes for r in est.layers
                    if r.class_name == "MultiHeadAttention")

    assert kept(True) - kept(False) == (0 if dropout else logits)
    # grappler's own rewrite of the layer's graph pairs the scale with the
    # probabilities too (tfgraph.PUSH_DOWN_AS_GRAPPLER_DOES)
    monkeypatch.setattr(tfgraph, "PUSH_DOWN_AS_GRAPPLER_DOES", True)
    assert kept(True) - kept(False) == (0 if dropout else logits)
