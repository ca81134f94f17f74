"""Bad input: one clear error that names the problem and the fix."""

import keras
import pytest

import keras_memscope as memscope

from .models import seed_mlp


@pytest.mark.parametrize("bad", [0, -3])
def test_batch_size_must_be_positive(bad):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        memscope.estimate(seed_mlp(), batch_size=bad)


@pytest.mark.parametrize("bad", [2.5, "32", None, True])
def test_batch_size_must_be_an_integer(bad):
    with pytest.raises(TypeError, match="batch_size must be a positive integer"):
        memscope.estimate(seed_mlp(), batch_size=bad)


def test_not_a_model():
    with pytest.raises(TypeError, match="expected a Keras model"):
        memscope.estimate(42, batch_size=2)
    with pytest.raises(TypeError, match="cannot tell what model 'resnet' is"):
        memscope.estimate("resnet", batch_size=2)


def test_model_without_layers():
    with pytest.raises(ValueError, match="has no layers .*no training step to estimate"):
        memscope.estimate(keras.Sequential([keras.Input((4,))]), batch_size=2)


def test_measure_loss_must_travel_to_its_process():
    """A loss the measuring process cannot rebuild is refused up front with
    the ways to give it; a Keras loss object travels with its config."""
    with pytest.raises(ValueError, match="cannot travel to the measuring process: give its "
                                         "name"):
        memscope.measure(seed_mlp(), 8, steps=1, device="cpu", in_process=False,
                         loss=lambda y, p: keras.ops.mean(p))
    m = memscope.measure(seed_mlp(), 8, steps=1, device="cpu", in_process=False,
                         loss=keras.losses.Huber(delta=2.0))
    assert m.peak_bytes > 0


def test_unbuilt_model_needs_input_shape():
    model = keras.Sequential([keras.layers.Dense(4)])
    with pytest.raises(ValueError, match="pass input_shape"):
        memscope.estimate(model, batch_size=2)
    est = memscope.estimate(model, batch_size=2, input_shape=(7,), optimizer="sgd")
    assert est.params == 7 * 4 + 4


def test_unknown_dimension_needs_input_shape():
    x = keras.Input((None, 8))
    model = keras.Model(x, keras.layers.Dense(2)(x))
    with pytest.raises(ValueError, match=r"unknown dimension\(s\) at position\(s\) \[1\]"):
        memscope.estimate(model, batch_size=2)
    est = memscope.estimate(model, batch_size=2, input_shape=(50, 8), optimizer="sgd")
    assert est.layers[-1].output_shapes == ((2, 50, 2),)


def test_input_shape_must_agree():
    with pytest.raises(ValueError, match="disagrees"):
        memscope.estimate(seed_mlp(), batch_size=2, input_shape=(999,))


def test_unknown_device():
    with pytest.raises(ValueError, match="unknown device 'tpu-v9'"):
        memscope.estimate(seed_mlp(), batch_size=2, device="tpu-v9")


def test_unknown_optimizer():
    with pytest.raises(ValueError, match="unknown optimizer 'adamm'"):
        memscope.estimate(seed_mlp(), batch_size=2, optimizer="adamm")


def test_every_optimizer_class_by_name():
    # keras.optimizers.get does not know "lamb" (Keras 3.15); a name of any
    # optimizer class that builds without arguments is taken, in any case
    from keras_memscope.optimizers import by_name

    assert type(by_name("lamb")).__name__ == "Lamb"
    assert type(by_name("Lamb")).__name__ == "Lamb"
    assert type(by_name("adam")).__name__ == "Adam"
    est = memscope.estimate(seed_mlp(), batch_size=2, optimizer="lamb", device="cpu")
    assert est.optimizer == "Lamb"


def test_unknown_optimizer_lists_only_names_that_work():
    from keras_memscope.optimizers import by_name

    with pytest.raises(ValueError, match="unknown optimizer") as info:
        by_name("adamm")
    message = str(info.value)
    named = message.split("one of ")[1].split(", ")
    assert "lamb" in named and "multioptimizer" not in named  # (needs its optimizers)
    for name in named:
        by_name(name)


def test_bad_rules_argument():
    with pytest.raises(TypeError, match="rules= keys must be layer classes"):
        memscope.estimate(seed_mlp(), batch_size=2, rules={"Dense": lambda c: []})


@pytest.mark.parametrize("changes, words", [
    ({"optimizer": "sgdx"}, "unknown optimizer 'sgdx'"),
    ({"dtype_policy": "float8"}, "unknown dtype policy 'float8'"),
    ({"accumulation_steps": -1}, "accumulation_steps must be a positive integer"),
    ({"freeze": ["nope"]}, "no layer named 'nope'"),
])
def test_apply_checks_its_changes_before_rebuilding(changes, words):
    with pytest.raises(ValueError, match=words):
        memscope.apply(seed_mlp(), **changes)


def test_one_accumulation_step_is_no_accumulation():
    model = seed_mlp()
    est = memscope.whatif(model, 8, accumulation_steps=1, device="cpu")
    assert est.peak_bytes == memscope.estimate(model, 8, device="cpu").peak_bytes
    assert not memscope.apply(model, accumulation_steps=1).optimizer.gradient_accumulation_steps


def test_freeze_takes_one_layer_name():
    model = seed_mlp()
    name = model.layers[0].name
    assert (memscope.whatif(model, 8, freeze=name, device="cpu").trainable_params
            == memscope.whatif(model, 8, freeze=[name], device="cpu").trainable_params
            < model.count_params())


class _BuildReadsValues(keras.optimizers.SGD):
    """An optimizer whose build needs its variables' values."""

    def build(self, var_list):
        super().build(var_list)
        self.scale = float(keras.ops.max(keras.ops.abs(var_list[0])))


def test_an_optimizer_whose_build_needs_values_is_named():
    """The estimate builds a weightless copy of the optimizer on stand-ins
    that have shapes but no values; a build that needs values is refused
    with the optimizer's name and what to do, not TensorFlow's error."""
    with pytest.raises(ValueError, match="_BuildReadsValues could not be built on the model's "
                                         "variables without allocating them .*name a "
                                         "similar one"):
        memscope.estimate(seed_mlp(), batch_size=2, optimizer=_BuildReadsValues(),
                          device="cpu")


@pytest.mark.skipif(not hasattr(keras.optimizers, "MultiOptimizer"),
                    reason="Keras without MultiOptimizer")
def test_accumulation_needs_an_optimizer_that_accumulates():
    multi = keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(
        keras.optimizers.SGD(), {".*/kernel": keras.optimizers.Adam()}))
    with pytest.raises(ValueError, match="MultiOptimizer takes no gradient_accumulation_steps"):
        memscope.whatif(seed_mlp(), 8, optimizer=multi, accumulation_steps=2, device="cpu")


def _channels_first_cnn(first_trainable: bool = True) -> keras.Model:
    x = keras.Input((3, 16, 16))
    conv = keras.layers.Conv2D(4, 3, data_format="channels_first", trainable=first_trainable)
    h = keras.layers.GlobalAveragePooling2D(data_format="channels_first")(conv(x))
    return keras.Model(x, keras.layers.Dense(2)(h))


def test_channels_first_convolutions_that_cannot_train_on_this_cpu_are_named(monkeypatch):
    """Where TensorFlow runs its own kernels for a type (an AVX2 CPU without
    oneDNN: its Conv2D gradients fail with "only supports NHWC"), a trainable
    channels_first convolution is named, in a note and a warning, with the
    fix; where oneDNN's kernels run it, nothing is said; a frozen first
    convolution (no gradient flows through it) trains on either."""
    from keras_memscope import devices

    monkeypatch.setattr(devices, "cpu_onednn_runs", lambda dtype="float32": False)
    with pytest.warns(UserWarning, match='data_format="channels_last"'):
        est = memscope.estimate(_channels_first_cnn(), 4, optimizer="sgd", device="cpu")
    assert any("only supports NHWC" in n for n in est.notes)
    frozen = memscope.estimate(_channels_first_cnn(False), 4, optimizer="sgd", device="cpu")
    assert not any("NHWC" in n for n in frozen.notes)
    monkeypatch.setattr(devices, "cpu_onednn_runs", lambda dtype="float32": True)
    assert not any("NHWC" in n for n in memscope.estimate(
        _channels_first_cnn(), 4, optimizer="sgd", device="cpu").notes)
