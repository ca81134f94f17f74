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


def test_bad_rules_argument():
    with pytest.raises(TypeError, match="rules= keys must be layer classes"):
        memscope.estimate(seed_mlp(), batch_size=2, rules={"Dense": lambda c: []})
