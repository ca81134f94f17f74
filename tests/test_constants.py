"""Grappler's folded constants: computed once, held between steps."""

import keras
import pytest
import tensorflow as tf
from keras import layers

import keras_memscope as memscope
from keras_memscope.tfgraph import FOLD_LIMIT_BYTES, folded_constants

MiB = 1024 * 1024


def _constants(fn, *shapes):
    graph = tf.function(fn, autograph=False).get_concrete_function(
        *(tf.TensorSpec(s, tf.float32) for s in shapes)).graph
    return dict(folded_constants(graph.get_operations(), graph.outputs))


def test_zeros_of_a_static_shape_are_one_constant():
    n = 256
    found = _constants(lambda x, y: tf.reduce_sum(tf.maximum(x, tf.zeros_like(x))
                                                  * tf.minimum(y, tf.zeros_like(y))),
                       (n, n), (n, n))
    # two zeros_like of the same shape and type: grappler merges them
    assert list(found.values()) == [n * n * 4]


def test_a_constant_too_large_to_fold_leaves_its_inputs_folded():
    # a lower triangle of ones is not one repeated value: folded below 10
    # MiB, computed at every step above, from the ones (one value: folded)
    small = 1024  # 4 MiB
    large = 2048  # 16 MiB
    assert small * small * 4 < FOLD_LIMIT_BYTES < large * large * 4

    def masked(n):
        return lambda x: tf.reduce_sum(x * tf.linalg.band_part(tf.ones((n, n)), -1, 0))

    for n in (small, large):
        found = _constants(masked(n), (n, n))
        assert list(found.values()) == [n * n * 4], n
    # the two different masks of one size are two constants
    both = _constants(lambda x: tf.reduce_sum(
        x * tf.linalg.band_part(tf.ones((small, small)), -1, 0)
        + x * tf.linalg.band_part(tf.ones((small, small)), 0, -1)), (small, small))
    assert sorted(both.values()) == [small * small * 4] * 2


def test_no_constant_from_data_or_shapes_alone():
    n = 1800  # a range of 12.4 MiB: not folded, and its inputs are scalars
    found = _constants(lambda x: tf.reduce_sum(
        x * tf.cast(tf.reshape(tf.range(n * n), (n, n)), tf.float32)
        + tf.reshape(x, tf.shape(x)) * 2.0), (n, n))
    assert found == {}


def test_zeros_added_to_data_of_the_results_shape_are_not_held():
    """Grappler's constant folding replaces ``x + zeros`` by ``x`` where ``x``
    has the result's shape: the zeros are then read by nothing and not held,
    while what they alone make (a softmax of them) is. Broadcast into a
    larger result, or subtracted from, they stay."""
    n = 256
    found = _constants(lambda x: tf.reduce_sum(
        tf.nn.softmax(tf.zeros_like(x)) * (tf.zeros_like(x) + x * 2.0)), (n, n))
    assert list(found.values()) == [n * n * 4]  # the softmax alone
    broadcast = _constants(lambda x: tf.reduce_sum(tf.zeros((n, n)) + x[:1] * 2.0), (n, n))
    assert list(broadcast.values()) == [n * n * 4]
    subtracted = _constants(lambda x: tf.reduce_sum(tf.zeros_like(x) - x * 2.0), (n, n))
    assert list(subtracted.values()) == [n * n * 4]


class _StartsFromZeros(layers.Layer):
    """Logits that start as zeros and are added to at once, as a capsule
    network's routing does, weighted by the softmax of the zeros."""

    def call(self, x):
        logits = keras.ops.zeros_like(x)
        return (logits + keras.ops.tanh(x)) * keras.ops.softmax(logits, axis=-1)


def test_a_softmax_of_zeros_is_held_and_the_zeros_added_to_are_not():
    """Measured in fresh processes (BFC allocator): before a step the
    allocator holds the weights, the batch and the softmax of the zeros (1
    MiB), not the zeros themselves (another 1 MiB: an allocator trace shows
    them made and freed while the step's function is optimized)."""
    inputs = keras.Input((64, 256))
    x = _StartsFromZeros()(layers.Dense(256)(inputs))
    model = keras.Model(inputs, layers.Dense(3)(x), name="starts_from_zeros")
    est = memscope.estimate(model, 16, optimizer="sgd", device="cpu")
    one = 16 * 64 * 256 * 4
    # (and the loss gradient's small constants)
    assert one <= est.constants_bytes < one + 64 * 1024
    # the allocator's count between steps, in its chunks (held_bytes)
    measured = [memscope.measure(model, 16, optimizer="sgd", steps=2, device="cpu")
                for _ in range(2)]
    for m in measured:
        assert abs(m.persistent_bytes / est.held_bytes - 1) <= 0.05, (
            m.persistent_bytes, est.held_bytes)


def _token_logits() -> keras.Model:
    inputs = keras.Input((32,), dtype="int32")
    x = layers.Embedding(100, 16)(inputs)
    return keras.Model(inputs, layers.Dense(1000)(x), name="token_logits")


@pytest.mark.parametrize("method", ["graph", "rules"])
def test_loss_gradient_zeros_held_between_steps(method):
    """Logits trained with a cross-entropy that takes them as probabilities
    (``measure``'s default): the clip's gradient selects from zeros of the
    output's shape, which grappler folds into a constant of 16 x 32 x 1000
    floats held between steps. Measured in fresh processes (BFC allocator):
    what is held before a step, against the estimate's persistent part."""
    model = _token_logits()
    est = memscope.estimate(model, 16, optimizer="sgd", device="cpu", method=method)
    if method == "rules":
        assert est.constants_bytes == 0  # nothing traced
        return
    assert est.constants_bytes >= 16 * 32 * 1000 * 4
    # (2 MiB: the note says where the largest is)
    assert any("folded constants" in n and "the loss's gradient" in n for n in est.notes)
    assert est.persistent_bytes == (est.weights_bytes + est.optimizer_bytes
                                    + est.input_bytes + est.constants_bytes)
    measured = [memscope.measure(model, 16, optimizer="sgd", steps=2, device="cpu")
                for _ in range(2)]
    for m in measured:
        assert abs(m.persistent_bytes / est.persistent_bytes - 1) <= 0.05, (
            m.persistent_bytes, est.persistent_bytes)
    printed = []
    memscope.summary(model, 16, optimizer="sgd", device="cpu", print_fn=printed.append)
    assert "folded constants" in printed[0]


def test_a_causal_mask_between_sublayer_calls_is_one_constant():
    """GroupQueryAttention calls its projections as layers; its causal mask
    is TensorFlow code between them (a glue call), made of the static shapes
    alone: one boolean constant of batch x heads x queries x keys (the token
    model's processes hold it between steps, 16 x 8 x 128 x 128 bytes)."""
    inputs = keras.Input((16, 32))
    h = layers.GroupQueryAttention(8, 4, 2)(inputs, inputs, use_causal_mask=True)
    model = keras.Model(inputs, layers.Dense(3)(layers.GlobalAveragePooling1D()(h)))
    est = memscope.estimate(model, 4, optimizer="sgd", device="cpu")
    rules = memscope.estimate(model, 4, optimizer="sgd", device="cpu", method="rules")
    assert est.constants_bytes == 4 * 4 * 16 * 16  # bool: a byte each
    assert rules.constants_bytes == 0
