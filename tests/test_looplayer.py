"""A custom layer that runs a loop of its own, costed from its own graph
(``keras_memscope.looplayer``)."""

import warnings

import keras
import pytest
import tensorflow as tf

import keras_memscope as memscope
from benchmarks.zoo import _LinearScan, _Refine, _TwinScan
from keras_memscope.looplayer import WHILE_OPS, loop_trips


def _loop_of(fn, *shapes):
    graph = tf.function(fn, autograph=False).get_concrete_function(
        *[tf.TensorSpec(s) for s in shapes]).graph
    (loop,) = [op for op in graph.get_operations() if op.type in WHILE_OPS]
    return loop


def test_loop_trips_reads_the_loops_condition():
    """The iterations of ``fori_loop(0, 4, ...)``, of a scan over 16 steps and
    of ``while_loop`` counting from 0 while ``i < 6``, from each loop's
    condition; none where the condition reads data."""
    assert loop_trips(_loop_of(
        lambda x: keras.ops.fori_loop(0, 4, lambda i, h: h * 2.0, x), (2, 3))) == 4
    assert loop_trips(_loop_of(
        lambda x: keras.ops.scan(lambda c, u: (c + u, c), x[0], x)[1], (16, 2, 3))) == 16
    assert loop_trips(_loop_of(
        lambda x: keras.ops.while_loop(lambda i, y: i < 6, lambda i, y: (i + 1, y * 0.5),
                                       (0, x))[1], (2, 3))) == 6
    assert loop_trips(_loop_of(
        lambda x: keras.ops.while_loop(lambda y: keras.ops.sum(y) > 1.0, lambda y: (y * 0.5,),
                                       (x,))[0], (2, 3))) is None


def _loop_prim(layer, shape, upcast=()):
    from keras_memscope.graph import trace_model
    from keras_memscope.tfgraph import traced_prims

    model = keras.Sequential([keras.Input(shape[1:]), layer])
    calls = trace_model(model, shape[0], is_leaf=lambda op: op is layer).calls
    (call,) = [c for c in calls if c.layer is layer]
    (p,) = traced_prims(call, loop_layer=True, upcast=upcast)
    return p


def test_a_fixed_point_loop_keeps_each_iterations_state():
    """Four iterations of ``h = tanh(h W + x)`` push, per iteration, the
    ``tanh`` the next iteration's product reads (for ``W``'s gradient) and
    its own gradient reads: the first three iterations' states are kept (the
    fourth is the layer's output; the zeros it starts from are a constant
    grappler folds), three allocations of 64 x 128 floats, and the loop's
    final count, which the gradient loop reads as its own (a 256-byte
    chunk); the input is not read by the gradient."""
    p = _loop_prim(_Refine(), (64, 128))
    state = 64 * 128 * 4
    assert dict(p.outputs) == {"out0": state, "t0": 3 * state + 256}
    assert p.save == ("t0",)
    assert dict(p.output_pieces) == {"t0": 4}
    # the gradient loop: the kernel's zero sum, each iteration's partial and
    # new sum (a 128 x 128 kernel), the state's and the input's gradients
    assert p.backward_workspace_bytes > 0


def test_a_bfloat16_loops_products_hold_float32_copies_where_upcast():
    """Where a device computes bfloat16 matrix products in float32
    (TensorFlow's own kernels: an AVX2 CPU), each product in the loop holds
    float32 copies of its two operands and its result while it runs: the
    refinement's forward product of 64 x 128 states by its 128 x 128 kernel
    adds 4 x (64 x 128 + 128 x 128 + 64 x 128) bytes to the forward
    workspace (within a few bytes: the peak may fall beside another
    iteration's counter); its gradient products hold as much each, which
    makes the gradient's highest point an iteration's (the backward
    workspace at least the copies, higher than without them); what is
    kept is the same."""
    plain = _loop_prim(_Refine(dtype="mixed_bfloat16"), (64, 128))
    upcast = _loop_prim(_Refine(dtype="mixed_bfloat16"), (64, 128), upcast=("bfloat16",))
    copies = 4 * (64 * 128 + 128 * 128 + 64 * 128)
    assert upcast.outputs == plain.outputs
    assert abs(upcast.forward_workspace_bytes - plain.forward_workspace_bytes - copies) <= 256
    assert upcast.backward_workspace_bytes > max(plain.backward_workspace_bytes, copies)
    # float32 products are not copied
    full, told = _loop_prim(_Refine(), (64, 128)), _loop_prim(_Refine(), (64, 128),
                                                                upcast=("bfloat16",))
    assert (told.forward_workspace_bytes, told.backward_workspace_bytes, told.outputs) == (
        full.forward_workspace_bytes, full.backward_workspace_bytes, full.outputs)


def test_grappler_merges_the_same_list_made_twice():
    """A reversed scan's two stacked outputs added together: the gradient
    makes a list of the same upstream gradient for each stack, two ops of
    one type, attributes and (equal) inputs, which grappler merges into one
    (an allocator trace at batch 256 over 96 steps of 64 features: one list
    of 96 allocations of 64 KiB, where two were counted; the estimate went
    from +15.2% to +1.0% of the highest measured step). The gradient holds
    one list beside the upstream gradient it copies, not two."""
    p = _loop_prim(_TwinScan(), (8, 16, 32))
    one_list = 16 * 8 * 32 * 4
    assert one_list <= p.backward_workspace_bytes < 2 * one_list


def test_a_scan_keeps_its_states_and_its_input_lists_zeros():
    """A scan over 16 steps keeps its 16 states (its output list's elements,
    which its gradient loop pops again) and the zeros TensorFlow makes for
    every element of the list the scan reads its inputs from (the gradient
    loop adds the input's gradients into them), each element its own
    allocation, beside the small integers it pushes per step; its input is
    kept for its projection's kernel gradient."""
    p = _loop_prim(_LinearScan(), (8, 16, 32))
    state = 8 * 32 * 4
    kept = dict(p.outputs)["t0"]
    assert 2 * 16 * state <= kept <= 2 * 16 * state + 6 * 16 * 256
    assert set(p.save) == {"in0", "t0"}
    assert dict(p.output_pieces)["t0"] >= 32


def test_a_custom_loop_layer_is_estimated_from_its_graph():
    """No rule knows a custom layer, but with the graph method it needs none,
    loop or not: no warning, and its record says the layer's graph costed
    it; the rules still use their fallback for it."""
    x = keras.Input((256,))
    out = keras.layers.Dense(10)(_Refine()(keras.layers.Dense(512, activation="relu")(x)))
    model = keras.Model(x, out)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = memscope.estimate(model, 64, optimizer="adam", device="cpu", method="graph")
    assert [r.rule for r in est.layers][1] == "graph (loop layer)"
    with pytest.warns(UserWarning, match="no cost rule for _Refine"):
        rules = memscope.estimate(model, 64, optimizer="adam", device="cpu", method="rules")
    assert [r.rule for r in rules.layers][1] == "fallback"


def test_a_custom_loop_layer_against_measurement():
    """Dense 512 ReLU, four fixed-point iterations by ``fori_loop``, Dense
    10, batch 128 with Adam. The step's peak varies with the order the two
    gradient threads run in: the estimate simulates several orders
    (``history_peaks``, 9.3-11.9 MiB, the estimate the highest) and the
    measured steps vary as much (10.2-12.0 MiB on an AVX2 EPYC in four
    processes, the highest when the gradient loop holds three of its 1 MiB
    kernel partials at once; 10.2-10.8 MiB in two processes on another
    machine, where no step reached the highest order). Every measured step
    lies within the simulated range widened by 10% on either side (two
    processes, four steps each), and the highest measured step is no more
    than 10% above the estimate."""
    x = keras.Input((256,))
    out = keras.layers.Dense(10)(_Refine()(keras.layers.Dense(512, activation="relu")(x)))
    model = keras.Model(x, out)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    est = memscope.estimate(model, 128, optimizer="adam", device="cpu", method="graph")
    simulated = est.history_peaks or (est.peak_bytes,)
    assert est.peak_bytes == max(simulated)
    steps = [s for _ in range(2)
             for s in memscope.measure(model, 128, optimizer="adam", steps=4,
                                       device="cpu").step_peak_bytes]
    assert all(0.9 * min(simulated) <= s <= 1.1 * est.peak_bytes for s in steps), (
        simulated, steps)


def test_a_gradient_loop_may_run_ahead_of_its_sums():
    """A ``fori_loop``'s gradient loop (10 iterations at once unless told)
    may run ahead of the sums it carries, each iteration ahead holding its
    partials: for eight chunk products, the kernel's partial gradient and
    the input's slice gradient (padded to the input's shape) for up to
    seven iterations ahead, the estimate's ``possible_extra_bytes`` and a
    note; a scan (one iteration at a time: Keras' ``scan`` unrolls nothing)
    holds none."""
    from benchmarks.zoo import _ChunkSum

    p = _loop_prim(_ChunkSum(), (64, 256))
    kernel, padded = 32 * 512 * 4, 64 * 256 * 4
    assert sorted(p.backlog_parts) == sorted([kernel, padded] * 7)
    assert _loop_prim(_LinearScan(), (8, 16, 32)).backlog_parts == ()
    x = keras.Input((256,))
    model = keras.Model(x, keras.layers.Dense(10)(_ChunkSum()(x)))
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    est = memscope.estimate(model, 64, optimizer="sgd", device="cpu", method="graph")
    assert est.possible_extra_bytes > 0
    assert any("run iterations ahead" in n for n in est.notes)


def test_a_conditional_in_a_loop_layer_keeps_the_fallback():
    """What a branch (``keras.ops.cond``: an ``If`` op) holds is not followed:
    a layer no rule knows that runs one keeps the rules' fallback and its
    warning under the graph method too."""

    class Gate(keras.layers.Layer):
        def call(self, x):
            y = keras.ops.fori_loop(0, 3, lambda i, h: keras.ops.tanh(h + x), x)
            return keras.ops.cond(keras.ops.sum(y) > 0, lambda: y * 2.0, lambda: y)

    x = keras.Input((64,))
    model = keras.Model(x, keras.layers.Dense(10)(Gate()(x)))
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.warns(UserWarning, match="no cost rule for Gate"):
        est = memscope.estimate(model, 32, optimizer="sgd", device="cpu", method="graph")
    assert [r.rule for r in est.layers][0] == "fallback"


def test_a_nested_loop_keeps_its_lists_per_outer_iteration():
    """Three outer iterations of two inner ones: the outer loop pushes the
    inner loop's lists, so every inner iteration's ``tanh`` (for its own
    gradient) is kept, six states at least, and the sums between them (at
    its first try the inner lists counted for nothing: 20.6 MiB estimated
    against 27.1-28.6 measured for ``benchmarks.zoo.nestedloops``, now
    29.6). A count of the distinct buffers gives 11 states; the prim keeps
    15 (benchmarks/RESULTS.md says so), which this bounds."""
    from benchmarks.zoo import _NestedLoops

    p = _loop_prim(_NestedLoops(), (64, 128))
    state = 64 * 128 * 4
    kept = dict(p.outputs)["t0"]
    assert 6 * state <= kept <= 15 * state + 64 * 256
