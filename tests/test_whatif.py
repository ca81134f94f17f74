"""What-ifs equal the estimate of the changed model; suggestions; timelines."""

import dataclasses

import keras
import numpy as np
import pytest
from keras import layers

import keras_memscope as memscope
from keras_memscope import devices
from keras_memscope.planning import fits

from .models import seed_mlp, small_cnn, wide_mlp


def gelu_mlp():
    x = keras.Input((64,))
    h = x
    for _ in range(3):
        h = layers.Dense(256, activation="gelu")(h)
        h = layers.Dense(32)(h)
    return keras.Model(x, layers.Dense(4)(h), name="gelu_mlp")


def test_dtype_policy_whatif_equals_the_rebuilt_model():
    model = small_cnn()
    changed = memscope.whatif(model, 16, dtype_policy="mixed_bfloat16", optimizer="adam",
                              device="cpu")
    keras.utils.clear_session()  # (it also resets the global dtype policy)
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        rebuilt = small_cnn()
    finally:
        keras.config.set_dtype_policy("float32")
    direct = memscope.estimate(rebuilt, 16, optimizer="adam", device="cpu")
    assert changed.peak_bytes == direct.peak_bytes
    assert changed.dtype_policy == "mixed_bfloat16"


def test_optimizer_and_accumulation_whatifs():
    model = seed_mlp()
    sgd = memscope.whatif(model, 64, optimizer="sgd", device="cpu")
    assert sgd.peak_bytes == memscope.estimate(model, 64, optimizer="sgd", device="cpu").peak_bytes
    acc = memscope.whatif(model, 64, optimizer="adam", accumulation_steps=4, device="cpu")
    opt = keras.optimizers.Adam(gradient_accumulation_steps=4)
    direct = memscope.estimate(model, 16, optimizer=opt, device="cpu")
    assert acc.peak_bytes == direct.peak_bytes and acc.device_batch_size == 16
    # one more gradient-sized accumulator per weight
    base = memscope.estimate(model, 16, optimizer="adam", device="cpu")
    assert acc.optimizer_bytes > base.optimizer_bytes


def test_accumulation_peak_adds_up_and_is_explained():
    """With accumulation the peak is the highest of the accumulating and the
    updating steps; its parts still add up (the accumulators an update has
    already reset count as released), the timeline reaches it, and the
    summary says so."""
    from keras_memscope.report import render_summary

    est = memscope.whatif(wide_mlp(), 32, optimizer="adam", accumulation_steps=2,
                          device="cpu")
    parts = (est.weights_bytes + est.optimizer_bytes + est.input_bytes + est.constants_bytes
             - est.released_bytes
             + est.activations_bytes + est.gradients_bytes + est.workspace_bytes
             + est.allocator_bytes)
    assert parts == est.peak_bytes
    assert max(p.high_bytes for p in est.timeline) == est.peak_bytes
    # the updating step's peak: the 1024 x 1000 kernel's accumulator is reset
    assert est.peak_phase == "update" and est.released_bytes >= 1024 * 1000 * 4
    text = render_summary(est)
    assert "accumulators already reset at the peak" in text
    assert "gradient accumulation over 2 steps" in text


def test_accumulation_on_an_accumulating_optimizer_is_refused():
    """Accumulating on top of an optimizer that already accumulates would
    silently replace its steps: refused, and not suggested by ``fits``, whose
    other optimizer keeps the accumulation."""
    opt = keras.optimizers.Adam(gradient_accumulation_steps=4)
    with pytest.raises(ValueError, match="already accumulates 4 steps"):
        memscope.whatif(seed_mlp(), 64, optimizer=opt, accumulation_steps=2, device="cpu")
    with pytest.raises(ValueError, match="already accumulates 4 steps"):
        memscope.apply(seed_mlp(), optimizer=opt, accumulation_steps=2)
    report = memscope.fits(wide_mlp(), 4096, device="cpu", memory_bytes=72 << 20,
                           optimizer=keras.optimizers.Adam(gradient_accumulation_steps=2))
    assert not report.fits and report.suggestions
    assert not any("accumulation" in s.title for s in report.suggestions)
    # another optimizer keeps accumulating
    sgd = next(s for s in report.suggestions if s.title.startswith("SGD"))
    assert sgd.change["optimizer"].gradient_accumulation_steps == 2


def test_accumulation_must_keep_the_effective_batch():
    """Micro-batches of ceil(10 / 3) = 4 would train on 12 samples per update,
    not 10: refused with the steps that divide the batch."""
    with pytest.raises(ValueError, match=r"does not split into 3 .*\[1, 2, 5, 10\]"):
        memscope.whatif(seed_mlp(), 10, accumulation_steps=3, device="cpu")
    with pytest.raises(ValueError, match="does not split into 16"):
        memscope.whatif(seed_mlp(), 8, accumulation_steps=16, device="cpu")
    est = memscope.whatif(seed_mlp(), 10, accumulation_steps=5, device="cpu")
    assert est.device_batch_size == 2
    assert "batch 2 x 5 accumulation steps (effective batch 10)" in est.notes[-1]


def test_suggested_accumulation_divides_the_batch():
    """Where the largest micro-batch that fits does not divide the batch, the
    suggestion takes the fewest steps that do (batch 12 with micro-batches of
    up to 5: 3 steps of 4)."""
    from keras_memscope.devices import get_device
    from keras_memscope.planning import _remedy_candidates

    model = seed_mlp()
    est = memscope.estimate(model, 12, optimizer="adam", device="cpu")
    profile = get_device("cpu")
    for micro, steps in ((5, 3), (7, 2), (3, 4), (1, 12)):
        (acc,) = [c for c in _remedy_candidates(model, est, profile, {}, micro)
                  if "accumulation_steps" in c[1]]
        assert acc[1] == {"accumulation_steps": steps}
        assert f"batch {12 // steps} x {steps} accumulation steps" in acc[0]


def test_freeze_whatif_equals_a_frozen_model_and_restores():
    model = small_cnn()
    names = [model.layers[0].name]
    changed = memscope.whatif(model, 16, freeze=names, optimizer="adam", device="cpu")
    assert all(layer.trainable for layer in model.layers)  # restored
    model.layers[0].trainable = False
    direct = memscope.estimate(model, 16, optimizer="adam", device="cpu")
    assert changed.peak_bytes == direct.peak_bytes
    with pytest.raises(ValueError, match="no layer named 'nope'"):
        memscope.whatif(model, 16, freeze=["nope"])


def test_subclassed_model_freezes_but_is_not_rebuilt_under_a_policy():
    from .models import subclassed

    model = subclassed()
    frozen = memscope.whatif(model, 16, freeze=[model.d1.name], device="cpu")
    assert all(layer.trainable for layer in model._flatten_layers())  # restored
    model.d1.trainable = False
    assert frozen.peak_bytes == memscope.estimate(model, 16, device="cpu").peak_bytes
    model.d1.trainable = True
    with pytest.raises(ValueError, match=r"^dtype_policy= needs a model that can be rebuilt"):
        memscope.whatif(model, 16, dtype_policy="mixed_bfloat16", freeze=[model.d1.name])


def test_freezing_by_a_name_that_nested_layers_share():
    """The projections of two attention layers share their names ("query",
    ...): freezing by that name freezes every one of them, and the freeze
    suggestion names outer layers (the attention, the recurrent layer, not
    its cell)."""
    inputs = keras.Input((8, 16))
    x = layers.MultiHeadAttention(2, 8)(inputs, inputs)
    x = layers.MultiHeadAttention(2, 8)(x, x)
    x = layers.Bidirectional(layers.LSTM(4))(x)
    model = keras.Model(inputs, layers.Dense(2)(x))
    queries = [layer for layer in model._flatten_layers() if layer.name == "query"]
    assert len(queries) == 2
    changed = memscope.whatif(model, 4, freeze=["query"], device="cpu")
    for layer in queries:
        layer.trainable = False
    assert changed.peak_bytes == memscope.estimate(model, 4, device="cpu").peak_bytes
    assert changed.trainable_params == sum(
        int(np.prod(w.shape)) for w in model.trainable_weights)
    for layer in queries:
        layer.trainable = True
    report = fits(model, 4, device="cpu", memory_bytes=1000)
    (freeze,) = [s for s in report.suggestions if set(s.change) == {"freeze"}]
    assert freeze.change["freeze"] == [model.layers[1].name, model.layers[2].name]
    assert freeze.title.startswith("freeze the first 2 of 4 layers with weights")


def test_remat_whatif_equals_a_model_built_under_rematscope():
    model = gelu_mlp()
    changed = memscope.whatif(model, 128, remat="activations", optimizer="adam", device="cpu")
    keras.utils.clear_session()
    with keras.RematScope(mode="activations"):
        scoped = gelu_mlp()
    direct = memscope.estimate(scoped, 128, optimizer="adam", device="cpu")
    assert changed.peak_bytes == direct.peak_bytes
    plain = memscope.estimate(model, 128, optimizer="adam", device="cpu")
    # gelu keeps three tensors of its input's size; recomputed, it keeps its input
    assert changed.saved_activations_bytes < plain.saved_activations_bytes
    assert changed.recompute_flops > 0


def _recurrent(kind: str) -> keras.Model:
    inputs = keras.Input((6, 4))
    if kind == "Bidirectional":
        x = layers.Bidirectional(layers.LSTM(8))(inputs)
    else:
        x = getattr(layers, kind)(8)(inputs)
    return keras.Model(inputs, layers.Dense(2)(x))


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "Bidirectional"])
def test_activation_remat_refused_where_keras_fails(kind):
    """Keras recomputes an activation by assigning ``layer.activation``; on a
    recurrent layer that is a read-only property and training fails. The
    estimate, the what-if and apply() say so; suggestions leave it out."""
    with keras.RematScope(mode="activations"):
        scoped = _recurrent(kind)
    scoped.compile(optimizer="sgd", loss="mse")
    with pytest.raises(AttributeError, match="has no setter"):
        scoped.train_on_batch(np.zeros((2, 6, 4), "float32"), np.zeros((2, 2), "float32"))
    refused = r"^RematScope mode 'activations' fails in training on \d layer"
    with pytest.raises(ValueError, match=refused):
        memscope.estimate(scoped, 4, device="cpu")
    plain = _recurrent(kind)
    with pytest.raises(ValueError, match=refused):
        memscope.whatif(plain, 4, device="cpu", remat="activations")
    with pytest.raises(ValueError, match="would fail in its first training step"):
        memscope.apply(plain, remat="activations")
    report = fits(plain, 4, device="cpu", memory_bytes=1000)
    assert report.suggestions and not any(
        s.change.get("remat") == "activations" for s in report.suggestions)
    memscope.estimate(plain, 4, device="cpu")  # the model itself is fine


def test_checkpoints_and_modes_that_fail_in_fit():
    model = gelu_mlp()
    seg = memscope.whatif(model, 128, remat="checkpoints", optimizer="adam", device="cpu")
    plain = memscope.estimate(model, 128, optimizer="adam", device="cpu")
    assert seg.saved_activations_bytes < plain.saved_activations_bytes
    full = memscope.whatif(model, 128, remat="full", optimizer="adam", device="cpu")
    assert any("keras#21207" in note for note in full.notes)
    with pytest.raises(ValueError, match="unknown remat mode"):
        memscope.whatif(model, 128, remat="everything")


def test_suggestions_ranked_and_combined_until_one_fits():
    model = seed_mlp()
    est = memscope.estimate(model, 8192, optimizer="adam", device="cpu")
    report = fits(model, 8192, device="cpu", memory_bytes=int(est.peak_bytes * 0.5),
                  optimizer="adam")
    assert not report.fits and report.suggestions
    singles = [s for s in report.suggestions if s.cost != "combined"]
    combos = [s for s in report.suggestions if s.cost == "combined"]
    assert list(report.suggestions[:len(singles)]) == singles  # singles first, ranked
    if any(s.fits for s in singles):
        assert not combos
    elif combos:
        assert combos[-1].fits or len(combos) == len(singles) - 1
        assert all(not c.fits for c in combos[:-1])


def test_timeline_picture_and_reuse(tmp_path):
    pytest.importorskip("matplotlib")
    model = gelu_mlp()
    a = memscope.estimate(model, 64, optimizer="adam", device="cpu")
    b = memscope.whatif(model, 64, remat="activations", optimizer="adam", device="cpu")
    assert max(p.high_bytes for p in b.timeline) == b.peak_bytes
    assert any(p.phase == "recompute" for p in b.timeline)
    assert a.no_reuse_bytes > a.peak_bytes  # liveness and in-place reuse pay off
    out = tmp_path / "t.png"
    memscope.plot_timeline([a, b], str(out), labels=["as is", "recompute"])
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_apply_builds_a_trainable_changed_model():
    model = gelu_mlp()
    model.compile("adam", "mse")
    new = memscope.apply(model, remat="activations", dtype_policy="mixed_bfloat16",
                         optimizer="sgd", freeze=[model.layers[1].name])
    assert new.layers[1]._remat_mode is not None
    assert new.dtype_policy.name == "mixed_bfloat16"
    assert not new.layers[1].trainable
    np.testing.assert_allclose(new.layers[1].get_weights()[0], model.layers[1].get_weights()[0])
    history = new.fit(np.zeros((8, 64)), np.zeros((8, 4)), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    with pytest.raises(ValueError, match="no segment checkpointing"):
        memscope.apply(model, remat="checkpoints")


@pytest.mark.parametrize("method", ["graph", "rules"])
def test_half_precision_matmuls_hold_float32_buffers_on_the_cpu(method):
    """TensorFlow's own CPU MatMul for bfloat16 converts both operands and the
    result to float32 temporaries (seen in the allocator trace); oneDNN's, on
    a CPU with AVX512_BF16, multiplies natively into a float32 buffer of the
    result where the matmul is fused with its bias add and for the weight
    gradient; a GPU holds neither."""
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = keras.Sequential([keras.Input((512,)), layers.Dense(1024, name="fc"),
                                  layers.Dense(8, name="head")])
    finally:
        keras.config.set_dtype_policy("float32")
    batch = 256
    copies = 4 * (batch * 512 + 512 * 1024 + batch * 1024)
    cpu = memscope.get_device("cpu")
    profiles = {
        "upcast": dataclasses.replace(cpu, upcast_dtypes=("bfloat16",), accumulate_dtypes=()),
        "accumulate": dataclasses.replace(cpu, upcast_dtypes=(), accumulate_dtypes=("bfloat16",),
                                          gradient_buffer_dtypes=("bfloat16",)),
        # (AMX: the fused forward's buffer alone)
        "amx": dataclasses.replace(cpu, upcast_dtypes=(), accumulate_dtypes=("bfloat16",),
                                   gradient_buffer_dtypes=()),
        "native": dataclasses.replace(cpu, upcast_dtypes=(), accumulate_dtypes=()),
    }
    ests = {k: memscope.estimate(model, batch, optimizer="sgd", device=p, method=method)
            for k, p in profiles.items()}
    fc = {k: next(r for r in e.layers if r.name == "fc") for k, e in ests.items()}
    # the largest workspace of the layer: the forward kernel's copies; with
    # oneDNN's kernels the weight gradient's float32 buffer (the fused
    # forward's, 4 x 256 x 1024, is smaller)
    assert fc["upcast"].workspace_bytes == copies
    assert fc["accumulate"].workspace_bytes == 4 * 512 * 1024 > fc["native"].workspace_bytes
    assert fc["amx"].workspace_bytes == 4 * batch * 1024
    assert (ests["upcast"].peak_bytes > ests["accumulate"].peak_bytes >= ests["amx"].peak_bytes
            >= ests["native"].peak_bytes)
    # and the estimate says which
    assert any("float32 copies" in n for n in ests["upcast"].notes)
    assert any("float32 buffer of the result" in n for n in ests["accumulate"].notes)
    assert not any("bfloat16 matrix products" in n for n in ests["native"].notes)
    # this machine's profile is one of the three
    expected = ("upcast" if not devices.cpu_native_bfloat16()
                else "amx" if devices.cpu_amx_bfloat16() else "accumulate")
    here = memscope.estimate(model, batch, optimizer="sgd", device="cpu", method=method)
    assert here.peak_bytes == ests[expected].peak_bytes
    # float32 matmuls make no copies
    plain = keras.Sequential([keras.Input((512,)), layers.Dense(1024, name="fc")])
    est = memscope.estimate(plain, batch, optimizer="sgd", device="cpu", method=method)
    assert est.layers[0].workspace_bytes == 0


def test_recomputation_runs_only_what_the_gradient_reads():
    """tf.recompute_grad's function drops the ops whose results nothing
    reads: GELU's last multiply (its output) is not computed again. The rest
    run depth first, as TensorFlow's executor runs them on one thread: the
    ``-x`` chain before ``0.5 * x``. The region's forward pass runs without
    the gradient tape: none of the gradient ops a taped forward pass runs
    early (GELU's ``Square`` and the ``exp(-z**2)`` of erfc's gradient), and
    the same depth-first order (an allocator trace: one buffer per GELU, its
    ``-x``); the recomputation runs them for the gradient."""
    model = gelu_mlp()
    est = memscope.whatif(model, 128, remat="activations", optimizer="adam", device="cpu",
                          method="graph")
    first = model.layers[1].name
    forward = [p.event for p in est.timeline if p.phase == "forward" and p.layer == first]
    again = [p.event for p in est.timeline if p.phase == "recompute" and p.layer == first]
    activation = forward[2:]  # after MatMul and BiasAdd
    assert "Square" not in activation and "Exp" not in activation, activation
    assert {"Square", "Exp"} <= set(again), again
    assert activation[0] == "Neg" and activation[-1] == "Mul", activation
    # what the forward pass made, but for its output, is made again
    untaped = list(activation[:-1])
    for event in again:
        if event in untaped:
            untaped.remove(event)
    assert not untaped, (activation, again)
    assert again[0] == "Neg" and again[-1] == "Mul", again
    plain = gelu_mlp()
    taped = [p.event for p in memscope.estimate(plain, 128, optimizer="adam", device="cpu",
                                                method="graph").timeline
             if p.phase == "forward" and p.layer == plain.layers[1].name][2:]
    assert "Square" in taped, taped


def _kernel_gradients_ended_during_recomputation(model, est) -> list[str]:
    """The recomputed layers during whose recomputation the next layer's
    kernel gradient ends."""
    names = [layer.name for layer in model.layers]
    tl = list(est.timeline)
    ended = []
    for layer in sorted({p.layer for p in tl if p.phase == "recompute"}):
        at = [p.index for p in tl if p.phase == "recompute" and p.layer == layer]
        after = names[names.index(layer) + 1]
        if any(p.layer == after and p.event == "MatMul (weight gradients)"
               for p in tl[at[0]:at[-1]]):
            ended.append(layer)
    return ended


@pytest.mark.parametrize("first", [frozenset(), frozenset({"matmul"})])
def test_a_recomputation_takes_time_on_the_first_thread(monkeypatch, first):
    """The recomputed ops run on the input-gradient thread for their forward
    time, so the weight gradients running beside them on the other thread
    may end meanwhile: the next Dense's kernel gradient, which reads the
    GELU's output, ends while the GELU is recomputed (as in the profiled
    step of ``mlp_gelu``, where it ends before the recomputed square is
    made). A recomputation taking no time ends none: a job that ended
    before it (one the input gradient before the region waited for, with
    the weight gradient first: ``schedule.WEIGHT_GRADIENT_FIRST``) is done
    before it starts."""
    from keras_memscope import schedule, timing

    monkeypatch.setattr(schedule, "WEIGHT_GRADIENT_FIRST", first)
    model = gelu_mlp()
    est = memscope.whatif(model, 1024, remat="activations", optimizer="adam", device="cpu",
                          method="graph")
    assert _kernel_gradients_ended_during_recomputation(model, est)
    monkeypatch.setattr(timing, "forward_seconds", lambda c, profile, dtype="float32": 0.0)
    instant = memscope.whatif(model, 1024, remat="activations", optimizer="adam",
                              device="cpu", method="graph")
    assert _kernel_gradients_ended_during_recomputation(model, instant) == []


def test_precision_whatif_and_apply_rebuild_a_lambda_layer():
    """Rebuilding the user's own model (its Lambda's Python function already
    in this process) is not refused by Keras' safe mode for files."""
    x = keras.Input((16,))
    h = layers.Dense(32)(x)
    h = layers.Lambda(lambda t: t * 2.0)(h)
    model = keras.Model(x, layers.Dense(2)(h))
    est = memscope.whatif(model, 8, dtype_policy="mixed_bfloat16", optimizer="sgd",
                          device="cpu")
    assert est.dtype_policy == "mixed_bfloat16"
    new = memscope.apply(model, dtype_policy="mixed_bfloat16", optimizer="sgd", loss="mse")
    assert new.layers[2].compute_dtype == "bfloat16"
    out = new(np.ones((1, 16), "float32"))
    assert out.shape == (1, 2)


class _Scaled(layers.Layer):
    """A custom layer nobody registered with Keras, with an __init__ argument
    its get_config() returns."""

    def __init__(self, factor: float = 2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.w * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


class _Unconfigured(_Scaled):
    """The same without the argument in its config: Keras cannot rebuild it."""

    def __init__(self, factor: float, **kwargs):
        super().__init__(factor, **kwargs)

    def get_config(self):
        return layers.Layer.get_config(self)


def _with(layer_class) -> keras.Model:
    x = keras.Input((16,))
    h = layer_class(3.0)(layers.Dense(32)(x))
    return keras.Model(x, layers.Dense(2)(h))


def test_rebuilding_finds_the_models_own_unregistered_layers():
    """Keras rebuilds a layer from its config by its registered name; the
    user's own classes, already in the model, are named for it."""
    model = _with(_Scaled)
    est = memscope.whatif(model, 8, dtype_policy="mixed_bfloat16", freeze=["dense"],
                          optimizer="sgd", device="cpu")
    assert est.dtype_policy == "mixed_bfloat16" and est.trainable_params < est.params
    new = memscope.apply(model, dtype_policy="mixed_bfloat16", optimizer="sgd", loss="mse")
    scaled = [layer for layer in new.layers if isinstance(layer, _Scaled)]
    assert len(scaled) == 1 and scaled[0].factor == 3.0
    assert scaled[0].compute_dtype == "bfloat16"
    np.testing.assert_allclose(keras.ops.convert_to_numpy(scaled[0].w), np.ones(32))
    new.train_on_batch(np.ones((4, 16), "float32"), np.zeros((4, 2), "float32"))


@pytest.mark.parametrize("call, what", [
    (lambda m: memscope.whatif(m, 8, dtype_policy="mixed_bfloat16", device="cpu"),
     "dtype_policy="),
    (lambda m: memscope.apply(m, optimizer="sgd"), "apply()"),
])
def test_a_layer_keras_cannot_rebuild_is_named_with_the_fix(call, what):
    with pytest.raises(ValueError, match="get_config") as info:
        call(_with(_Unconfigured))
    assert str(info.value).startswith(what)
    assert "factor" in str(info.value)


@pytest.mark.parametrize("call, name", [
    (lambda m: memscope.whatif(m, 8, optimzer="sgd", device="cpu"), "whatif"),
    (lambda m: memscope.fits(m, 8, device="cpu", memory_bytes=2**30, bogus=1), "fits"),
    (lambda m: memscope.max_batch_size(m, device="cpu", memory_bytes=2**30, bogus=1),
     "max_batch_size"),
    (lambda m: memscope.summary(m, 8, bogus=1), "summary"),
])
def test_misspelt_option_is_named_by_the_function_called(call, name):
    """Options are handed on to estimate(); a misspelt one is reported by the
    function the user called, with the options it takes."""
    with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument "
                                        r"'(optimzer|bogus)'; it takes .*optimizer"):
        call(seed_mlp())
