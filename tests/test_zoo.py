"""Edge-case models: invariants that must hold for every estimate."""

import warnings

import keras
import pytest

import keras_memscope as memscope

from . import models


def check_invariants(model, est):
    assert est.params == model.count_params()
    assert sum(r.params for r in est.layers) == est.params
    assert sum(r.trainable_params for r in est.layers) == est.trainable_params
    assert sum(r.activation_bytes for r in est.layers) <= est.saved_activations_bytes
    parts = (est.weights_bytes + est.optimizer_bytes + est.input_bytes + est.constants_bytes
             + est.activations_bytes + est.gradients_bytes + est.workspace_bytes
             + est.allocator_bytes)
    assert parts == est.peak_bytes
    assert est.peak_bytes >= est.persistent_bytes
    assert max(p.high_bytes for p in est.timeline) == est.peak_bytes
    assert est.total_bytes == est.peak_bytes + est.overhead_bytes


@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_invariants(name):
    model = models.ZOO[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = memscope.estimate(model, batch_size=4, optimizer="adam", device="cpu")
    check_invariants(model, est)


def test_text_models():
    for model in models.text_models():
        est = memscope.estimate(model, batch_size=4, optimizer="adam", device="cpu")
        check_invariants(model, est)
        assert not est.unsupported, est.unsupported


@pytest.mark.parametrize("name", ["seed_mlp", "small_cnn", "subclassed"])
def test_grows_with_batch(name):
    model = models.ZOO[name]()
    saved, requested, peaks = [], [], []
    for batch in (1, 8, 64, 512):
        est = memscope.estimate(model, batch_size=batch, optimizer="sgd", device="cpu")
        saved.append(est.saved_activations_bytes)
        requested.append(est.peak_bytes - est.allocator_bytes)
        peaks.append(est.peak_bytes)
    assert saved == sorted(saved) and saved[0] < saved[-1]
    # What the step requests grows with the batch; the chunks the allocator
    # hands out need not, for a model this small: the seed MLP measured
    # 1.09-1.12 MB at batch 1, 1.11-1.19 MB at batch 8 and 1.02-1.31 MB at
    # batch 64 (three processes each).
    assert requested == sorted(requested) and requested[0] < requested[-1]
    assert peaks[0] < peaks[-1]


def test_shared_layer_counts_weights_once():
    model = models.shared_layer()
    est = memscope.estimate(model, batch_size=4, optimizer="sgd", device="cpu")
    dense_calls = [r for r in est.layers if r.class_name == "Dense" and r.output_shapes[0][-1] == 8]
    assert len(dense_calls) == 2
    assert [r.shared for r in dense_calls] == [False, True]
    assert dense_calls[1].params == 0


def test_nested_model_paths():
    est = memscope.estimate(models.nested(), batch_size=4, optimizer="sgd", device="cpu")
    assert any(r.name.startswith("tower/") for r in est.layers)


def test_subclassed_raw_add_is_recorded():
    est = memscope.estimate(models.subclassed(), batch_size=4, optimizer="sgd", device="cpu")
    classes = [r.class_name for r in est.layers]
    assert classes.count("Dense") == 3
    assert "TensorFlowOps" in classes  # the raw h + d2(h)


def test_multi_io_has_both_outputs_and_the_ops_node():
    est = memscope.estimate(models.multi_io(), batch_size=4, optimizer="sgd", device="cpu")
    assert {"cls", "reg"} <= {r.name for r in est.layers}
    assert "Multiply" in {r.class_name for r in est.layers}
    assert not est.unsupported


def test_unknown_layer_falls_back_and_warns_once():
    from keras_memscope import estimator as est_module

    est_module._WARNED.discard("Scale")
    with pytest.warns(UserWarning, match="no cost rule for Scale"):
        est = memscope.estimate(models.custom_layer(), batch_size=4, optimizer="sgd",
                                device="cpu", method="rules")
    assert dict(est.unsupported) == {"Scale": 1}
    assert est.params == models.custom_layer().count_params()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memscope.estimate(models.custom_layer(), batch_size=4, optimizer="sgd", device="cpu",
                          method="rules")
        # the graph method (the default) reads the layer off TensorFlow's graph
        graph = memscope.estimate(models.custom_layer(), batch_size=4, optimizer="sgd",
                                  device="cpu")
    assert graph.method == "graph" and not graph.unsupported


def test_frozen_backbone_keeps_less():
    frozen = models.frozen_backbone()
    est_frozen = memscope.estimate(frozen, batch_size=32, optimizer="adam", device="cpu")
    thawed = models.frozen_backbone()
    thawed.get_layer("backbone").trainable = True
    est_thawed = memscope.estimate(thawed, batch_size=32, optimizer="adam", device="cpu")
    assert est_frozen.trainable_params < est_thawed.trainable_params
    assert est_frozen.optimizer_bytes < est_thawed.optimizer_bytes
    # nothing upstream of the head needs a gradient: the backbone keeps nothing
    backbone_saved = sum(r.activation_bytes for r in est_frozen.layers
                         if r.name.startswith("backbone/"))
    assert backbone_saved == 0
    assert est_frozen.saved_activations_bytes < est_thawed.saved_activations_bytes


def test_mixed_precision_policy():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = models.small_cnn()
    finally:
        keras.config.set_dtype_policy("float32")
    est = memscope.estimate(model, batch_size=8, optimizer="adam", device="gpu")
    assert est.dtype_policy == "mixed_float16"
    assert "LossScaleOptimizer" in est.optimizer
    conv = next(r for r in est.layers if r.class_name == "Conv2D")
    assert conv.output_dtypes == ("float16",)
    check_invariants(model, est)


def test_custom_rule_override():
    from keras_memscope.rules import Builder

    calls = []

    def scale_rule(call):
        calls.append(call.name)
        b = Builder(call)
        z = b.add1("mul", ["in0", "w:" + call.weights[0].name], call.outputs[0].nbytes,
                   save_for={"w:" + call.weights[0].name: ("in0",)})
        return b.finish([z])

    est = memscope.estimate(models.custom_layer(), batch_size=4, optimizer="sgd",
                            device="cpu", rules={models.Scale: scale_rule})
    assert calls and not est.unsupported
