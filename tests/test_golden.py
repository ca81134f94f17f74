"""Golden values from the questions users asked (SEEDS), derived by hand."""

import keras
import pytest

import keras_memscope as memscope
from keras_memscope.units import round_up

from .models import seed_mlp


def test_seed_mlp_parameters_and_bytes():
    model = seed_mlp()
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    est = memscope.estimate(model, batch_size=256, device="cpu")
    # fc1 1000x100 + 100, fc2..fc4 100x100 + 100, output 100x10 + 10
    gt_params = (1000 * 100 + 100) + 3 * (100 * 100 + 100) + (100 * 10 + 10)
    assert gt_params == 131_410
    assert est.params == gt_params and est.trainable_params == gt_params
    variables = [1000 * 100, 100] + [100 * 100, 100] * 3 + [100 * 10, 10]
    assert sum(variables) == gt_params
    # float32 weights, each variable rounded to the allocator's 256-byte granule
    gt_weights = sum(round_up(4 * n) for n in variables)
    assert est.weights_bytes == gt_weights
    # Adam: two float32 slots per variable, plus iterations (int64) and the
    # learning rate (float32)
    gt_adam = 2 * gt_weights + round_up(8) + round_up(4)
    assert est.optimizer_bytes == gt_adam
    # the batch: 256 x 1000 float32 inputs and 256 x 10 float32 labels
    assert est.input_bytes == round_up(256 * 1000 * 4) + round_up(256 * 10 * 4)
    # not compiled: trained as ``measure`` trains it, on class ids (int64)
    uncompiled = memscope.estimate(seed_mlp(), batch_size=256, optimizer="adam",
                                   device="cpu")
    assert uncompiled.input_bytes == round_up(256 * 1000 * 4) + round_up(256 * 8)
    assert any("not compiled" in n for n in uncompiled.notes)
    # every Dense keeps its input for the kernel gradient; ReLU its output;
    # the input batch is held by the caller and the softmax output by the loss
    assert est.saved_activations_bytes >= 4 * round_up(256 * 100 * 4)


def test_seed_mlp_sgd_has_no_slots():
    est = memscope.estimate(seed_mlp(), batch_size=256, optimizer="sgd", device="cpu")
    assert est.optimizer_bytes == round_up(8) + round_up(4)


def test_vgg16_conv_macs():
    model = keras.applications.VGG16(weights=None)
    est = memscope.estimate(model, batch_size=1, optimizer="sgd", device="gpu")
    by_name = {r.name: r for r in est.layers}
    # out_channels x out_h x out_w x (k_h x k_w x in_channels)
    assert by_name["block1_conv1"].forward_macs == 64 * 224 * 224 * (3 * 3 * 3) == 86_704_128
    assert by_name["block3_conv2"].forward_macs == 256 * 56 * 56 * (3 * 3 * 256) \
        == 1_849_688_064
    # fc6: 25088 x 4096 multiply-accumulates per sample
    assert by_name["fc1"].forward_macs == 25088 * 4096
    assert est.params == 138_357_544


@pytest.mark.parametrize("batch", [1, 2])
def test_resnet50_parameters(batch):
    est = memscope.estimate(keras.applications.ResNet50(weights=None), batch_size=batch,
                            optimizer="sgd")
    assert est.params == 25_636_712
    assert sum(r.params for r in est.layers) == est.params


def test_gpu_estimate_says_keras_compiles_the_step_with_xla(monkeypatch):
    """Keras' default compile(jit_compile="auto") turns XLA on where a GPU is
    present (checked here with a GPU faked into TensorFlow's device list); a
    GPU estimate, which follows the executor without XLA, says so."""
    import tensorflow as tf

    model = seed_mlp()
    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: real(kind) + (
        [tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")] if kind in (None, "GPU")
        else []))
    model.compile(optimizer="sgd", loss="mse")
    assert model.jit_compile is True
    monkeypatch.undo()
    gpu = memscope.estimate(model, 32, device="a100-40gb")
    (note,) = [n for n in gpu.notes if "XLA" in n]
    assert "jit_compile=False" in note and "compiled with jit_compile=True" in note
    # trained on a CPU it is compiled with XLA there too (it was compiled so)
    (note,) = [n for n in memscope.estimate(model, 32, device="cpu").notes if "XLA" in n]
    assert "compiled with jit_compile=True" in note and "jit_compile=False" in note
    plain = seed_mlp()
    plain.compile(optimizer="sgd", loss="mse")  # no GPU: "auto" is False
    assert not any("XLA" in n for n in memscope.estimate(plain, 32, device="cpu").notes)
