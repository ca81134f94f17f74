"""Small edge-case models for the tests (the zoo)."""

from __future__ import annotations

from typing import Any

import keras
from keras import layers


def seed_mlp() -> keras.Model:
    """The classic question's MLP: 1000 -> 4 x Dense(100) -> Dense(10)."""
    return keras.Sequential(
        [keras.Input((1000,))]
        + [layers.Dense(100, activation="relu") for _ in range(4)]
        + [layers.Dense(10, activation="softmax")],
        name="seed_mlp",
    )


def wide_mlp() -> keras.Model:
    """1024 -> Dense(1024) -> Dense(1000) -> Dense(10): 4 MiB kernels."""
    return keras.Sequential([keras.Input((1024,)), layers.Dense(1024, activation="relu"),
                             layers.Dense(1000, activation="relu"), layers.Dense(10)],
                            name="wide_mlp")


def shared_layer() -> keras.Model:
    """One Dense layer applied to two inputs (shared weights)."""
    a, b = keras.Input((16,)), keras.Input((16,))
    shared = layers.Dense(8, activation="relu")
    out = layers.Dense(1)(layers.Concatenate()([shared(a), shared(b)]))
    return keras.Model([a, b], out, name="shared_layer")


def nested() -> keras.Model:
    """A Functional model used as a layer inside another."""
    inner_in = keras.Input((12,))
    inner = keras.Model(inner_in, layers.Dense(6, activation="tanh")(inner_in), name="tower")
    x = keras.Input((12,))
    y = layers.Dense(3)(inner(x))
    return keras.Model(x, y, name="nested")


@keras.saving.register_keras_serializable(package="memscope_tests")
class Subclassed(keras.Model):
    """A subclassed model with a raw residual add in its call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.d1 = layers.Dense(32, activation="relu")
        self.d2 = layers.Dense(32)
        self.out = layers.Dense(4)

    def call(self, x):
        h = self.d1(x)
        return self.out(h + self.d2(h))


def subclassed() -> keras.Model:
    import numpy as np

    m = Subclassed(name="subclassed")
    m(np.zeros((1, 32), dtype="float32"))  # builds every sub-layer
    return m


class Unregistered(keras.Model):
    """A subclassed model not registered with Keras and without
    ``compute_output_shape``: found by its module and name."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.d1 = layers.Dense(64, activation="relu")
        self.out = layers.Dense(3)

    def call(self, x):
        return self.out(self.d1(x))


def unregistered() -> keras.Model:
    m = Unregistered(name="unregistered")
    m(keras.ops.zeros((1, 16)))
    return m


def multi_io() -> keras.Model:
    """Two inputs, two outputs, a raw keras.ops node."""
    img = keras.Input((8, 8, 3), name="img")
    meta = keras.Input((5,), name="meta")
    x = layers.Conv2D(4, 3, activation="relu")(img)
    x = layers.GlobalAveragePooling2D()(x)
    m = layers.Dense(4)(meta)
    joined = keras.ops.multiply(x, m)
    return keras.Model([img, meta], [layers.Dense(3, name="cls")(joined),
                                     layers.Dense(1, name="reg")(joined)], name="multi_io")


def small_cnn() -> keras.Model:
    return keras.Sequential([
        keras.Input((16, 16, 3)),
        layers.Conv2D(8, 3, activation="relu"),
        layers.BatchNormalization(),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dropout(0.3),
        layers.Dense(10),
    ], name="small_cnn")


def pooled_cnn() -> keras.Model:
    """Two convolutions, each followed by max pooling (32 x 32 x 3 inputs)."""
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
        layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(),
        layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dense(10),
    ], name="pooled_cnn")


def frozen_backbone() -> keras.Model:
    backbone = keras.Sequential([keras.Input((16, 16, 3)), layers.Conv2D(8, 3, activation="relu"),
                                 layers.BatchNormalization(), layers.Conv2D(8, 3)],
                                name="backbone")
    backbone.trainable = False
    x = keras.Input((16, 16, 3))
    y = layers.Dense(2)(layers.GlobalAveragePooling2D()(backbone(x)))
    return keras.Model(x, y, name="frozen")


@keras.saving.register_keras_serializable(package="memscope_tests")
class Scale(keras.layers.Layer):
    """A custom layer no rule knows, with one weight."""

    def build(self, input_shape):
        self.s = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.s


def custom_layer() -> keras.Model:
    x = keras.Input((10,))
    return keras.Model(x, layers.Dense(2)(Scale()(layers.Dense(10)(x))), name="custom")


def text_models() -> list[keras.Model]:
    seq = keras.Input((20,), dtype="int32")
    e = layers.Embedding(100, 8)(seq)
    lstm = keras.Model(seq, layers.Dense(2)(layers.LSTM(6)(e)), name="lstm_small")
    seq2 = keras.Input((20,), dtype="int32")
    e2 = layers.Embedding(100, 16)(seq2)
    a = layers.MultiHeadAttention(2, 8)(e2, e2)
    h = layers.LayerNormalization()(layers.Add()([e2, a]))
    h = layers.Dense(32, activation="gelu")(h)
    out = layers.Dense(2)(layers.GlobalAveragePooling1D()(h))
    tr = keras.Model(seq2, out, name="transformer_small")
    bi = keras.Sequential([keras.Input((10, 4)), layers.Bidirectional(layers.GRU(3)),
                           layers.Dense(1)], name="bigru")
    td = keras.Sequential([keras.Input((5, 6)), layers.TimeDistributed(layers.Dense(3)),
                           layers.SimpleRNN(4), layers.Dense(1)], name="timedist")
    return [lstm, tr, bi, td]


ZOO = {
    "seed_mlp": seed_mlp,
    "shared_layer": shared_layer,
    "nested": nested,
    "subclassed": subclassed,
    "multi_io": multi_io,
    "small_cnn": small_cnn,
    "frozen_backbone": frozen_backbone,
    "custom_layer": custom_layer,
}


@keras.saving.register_keras_serializable(package="memscope_tests")
class Gated(keras.layers.Layer):
    """A custom layer with internal temporaries no rule knows:
    ``sigmoid(x^2 * w) * x``; its gradient keeps x^2, the sigmoid and x."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        import tensorflow as tf

        h = tf.square(x)
        return tf.sigmoid(h * self.w) * x


def gated_mlp() -> keras.Model:
    x = keras.Input((2048,))
    h = layers.Dense(2048)(x)
    h = Gated()(h)
    h = layers.Dense(2048)(h)
    h = Gated()(h)
    return keras.Model(x, layers.Dense(10)(h), name="gated_mlp")


def unbuilt_mlp() -> keras.Model:
    """A Sequential model without an input: its shape must be given."""
    return keras.Sequential([keras.layers.Dense(8), keras.layers.Dense(2)])


def named_outputs() -> keras.Model:
    """Outputs as a dict, as a multi-task model names them."""
    inp = keras.Input((32,), name="x")
    h = layers.Dense(64, activation="relu")(inp)
    return keras.Model(inp, {"reg": layers.Dense(1, name="reg")(h),
                             "cls": layers.Dense(3, name="cls")(h)}, name="named_outputs")


ZOO["named_outputs"] = named_outputs


@keras.saving.register_keras_serializable(package="memscope_tests")
class Project(keras.layers.Layer):
    """A custom output projection with no ``activation`` attribute."""

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units))

    def call(self, x):
        return keras.ops.matmul(x, self.kernel)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def projected_lm() -> keras.Model:
    """Embedding (8000 x 128) over 64 tokens, a causal Conv1D, a GELU Dense,
    logits over 8000 words from :class:`Project`, cross-entropy on logits."""
    tokens = keras.Input((64,), dtype="int32")
    x = layers.Embedding(8000, 128)(tokens)
    x = layers.Conv1D(128, 3, padding="causal", activation="relu")(x)
    x = layers.Dense(128, activation="gelu")(x)
    model = keras.Model(tokens, Project(8000)(x), name="projected_lm")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@keras.saving.register_keras_serializable(package="memscope_tests")
class MinimalCell(keras.layers.Layer):
    """A custom recurrent cell, ``h = x @ W + h_prev @ U`` (Keras' RNN guide)."""

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.state_size = units

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), name="kernel")
        self.recurrent_kernel = self.add_weight(shape=(self.units, self.units),
                                                name="recurrent_kernel")

    def call(self, inputs, states):
        h = keras.ops.matmul(inputs, self.kernel) + keras.ops.matmul(states[0],
                                                                     self.recurrent_kernel)
        return h, [h]

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def custom_cell_rnn() -> keras.Model:
    """``keras.layers.RNN`` around a custom cell: 200 steps of 64 features."""
    x = keras.Input((200, 64))
    return keras.Model(x, layers.Dense(4)(layers.RNN(MinimalCell(256))(x)),
                       name="custom_cell_rnn")


def pooled(x, h, name: str) -> keras.Model:
    """A model from input ``x`` to a sequence ``h``, averaged over its steps
    into 4 outputs."""
    return keras.Model(x, layers.Dense(4)(layers.GlobalAveragePooling1D()(h)), name=name)


def causal_gqa() -> keras.Model:
    """Causal grouped-query attention (8 query heads, 2 key/value heads of
    32) over 128 steps of 128 features, pooled to 4 outputs."""
    x = keras.Input((128, 128))
    h = layers.GroupQueryAttention(32, 8, 2)(x, x, use_causal_mask=True)
    return pooled(x, h, "causal_gqa")


@keras.saving.register_keras_serializable(package="memscope_tests")
class GatedFeedForward(keras.layers.Layer):
    """A GELU-gated feed-forward block: two Dense projections multiplied
    in the layer's own ``call``, then a third."""

    def __init__(self, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden

    def build(self, input_shape):
        self.gate = layers.Dense(self.hidden)
        self.up = layers.Dense(self.hidden)
        self.down = layers.Dense(input_shape[-1])

    def call(self, x):
        return self.down(keras.ops.gelu(self.gate(x)) * self.up(x))

    def get_config(self):
        return {**super().get_config(), "hidden": self.hidden}


def gated_feed_forward() -> keras.Model:
    """Two GatedFeedForward blocks of 512 over 64 steps of 128 features."""
    x = keras.Input((64, 128))
    h = GatedFeedForward(512)(GatedFeedForward(512)(x))
    return pooled(x, h, "gated_feed_forward")


@keras.saving.register_keras_serializable(package="memscope_tests")
class ScaledAttention(layers.Layer):
    """Self-attention as users write it: one Dense for queries, keys and
    values, the scores divided by the square root of the head size, a
    softmax, a Dense out."""

    def __init__(self, dim: int = 128, heads: int = 4, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.heads = dim, heads
        self.qkv = layers.Dense(3 * dim)
        self.out = layers.Dense(dim)

    def call(self, x):
        ops = keras.ops
        b, t = ops.shape(x)[0], ops.shape(x)[1]
        size = self.dim // self.heads
        qkv = ops.reshape(self.qkv(x), (b, t, 3, self.heads, size))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        p = ops.softmax(ops.einsum("bthd,bshd->bhts", q, k) / size ** 0.5, axis=-1)
        return self.out(ops.reshape(ops.einsum("bhts,bshd->bthd", p, v), (b, t, self.dim)))

    def get_config(self):
        return {**super().get_config(), "dim": self.dim, "heads": self.heads}


@keras.saving.register_keras_serializable(package="memscope_tests")
class TwoViews(keras.Model):
    """A model whose own ``train_step`` runs two forward passes (the batch and
    its half) under one tape and adds their squared difference to the loss."""

    def train_step(self, data):
        import tensorflow as tf

        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            a = self(x, training=True)
            b = self(x * 0.5, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=a) + keras.ops.mean(keras.ops.square(a - b))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def two_views(own_step: bool = True) -> keras.Model:
    """Two 3 x 3 convolutions of 32 over 32 x 32 x 3, pooled to 10 classes;
    with ``own_step`` a :class:`TwoViews`, else a plain Functional model."""
    x = keras.Input((32, 32, 3))
    h = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    h = layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    y = layers.Dense(10)(layers.GlobalAveragePooling2D()(h))
    return (TwoViews if own_step else keras.Model)(x, y, name="two_views")


@keras.saving.register_keras_serializable(package="memscope_tests")
class DropoutFeedForward(keras.layers.Layer):
    """Dense, GELU, Dropout, Dense, in a ``call`` that takes no training
    argument (Keras hands the model's on to the Dropout)."""

    def __init__(self, hidden: int, rate: float, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.rate = hidden, rate

    def build(self, input_shape):
        self.up = layers.Dense(self.hidden)
        self.drop = layers.Dropout(self.rate)
        self.down = layers.Dense(input_shape[-1])

    def call(self, x):
        return self.down(self.drop(keras.ops.gelu(self.up(x))))

    def get_config(self):
        return {**super().get_config(), "hidden": self.hidden, "rate": self.rate}


def dropout_feed_forward(rate: float = 0.3) -> keras.Model:
    """A DropoutFeedForward block of 512 over 64 steps of 128 features."""
    x = keras.Input((64, 128))
    h = DropoutFeedForward(512, rate)(x)
    return pooled(x, h, "dropout_feed_forward")


@keras.saving.register_keras_serializable(package="memscope_tests")
class WindowAttention(layers.Layer):
    """Self-attention over one window of ``window`` x ``window`` tokens with a
    learned relative-position bias (as Swin Transformer writes it): the bias
    table gathered per pair of positions and added to the scores."""

    def __init__(self, dim: int = 96, heads: int = 3, window: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.heads, self.window = dim, heads, window
        self.qkv = layers.Dense(3 * dim)
        self.proj = layers.Dense(dim)
        self.drop = layers.Dropout(0.1)
        import numpy as np

        grid = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij"))
        flat = grid.reshape(2, -1)
        rel = (flat[:, :, None] - flat[:, None, :]).transpose(1, 2, 0) + (window - 1)
        self.index = (rel[..., 0] * (2 * window - 1) + rel[..., 1]).reshape(-1).astype("int32")

    def build(self, input_shape):
        self.table = self.add_weight(shape=((2 * self.window - 1) ** 2, self.heads),
                                     initializer="zeros", name="table")

    def call(self, x):
        ops = keras.ops
        b, n, size = ops.shape(x)[0], ops.shape(x)[1], self.dim // self.heads
        qkv = ops.transpose(ops.reshape(self.qkv(x), (b, n, 3, self.heads, size)),
                            (2, 0, 3, 1, 4))
        scores = ops.matmul(qkv[0] * size ** -0.5, ops.transpose(qkv[1], (0, 1, 3, 2)))
        bias = ops.reshape(ops.take(self.table, self.index, axis=0), (n, n, self.heads))
        scores = scores + ops.expand_dims(ops.transpose(bias, (2, 0, 1)), 0)
        p = self.drop(ops.softmax(scores, axis=-1))
        y = ops.reshape(ops.transpose(ops.matmul(p, qkv[2]), (0, 2, 1, 3)), (b, n, self.dim))
        return self.proj(y)

    def get_config(self):
        return {**super().get_config(), "dim": self.dim, "heads": self.heads,
                "window": self.window}


def text_body(tokens: Any) -> Any:
    """Embedding, Conv1D, max pooling and a two-way head over int tokens."""
    x = layers.Embedding(2000, 32)(tokens)
    x = layers.Conv1D(32, 5, activation="relu")(x)
    return layers.Dense(2)(layers.GlobalMaxPooling1D()(x))


def raw_text(vectorize: bool = True) -> keras.Model:
    """:func:`text_body` behind a TextVectorization of raw strings (its
    vocabulary adapted, its tokens padded to 64), or over the int tokens
    themselves (``vectorize=False``)."""
    import numpy as np

    if not vectorize:
        tokens = keras.Input((64,), dtype="int64")
        return keras.Model(tokens, text_body(tokens), name="tokens")
    text = keras.Input((), dtype="string")
    vectorizer = layers.TextVectorization(max_tokens=2000, output_sequence_length=64)
    vectorizer.adapt(np.array([f"w{i} w{i + 1} w{i + 2}" for i in range(500)]))
    return keras.Model(text, text_body(vectorizer(text)), name="raw_text")


def stacked_simple_rnn() -> keras.Model:
    """Two stacked SimpleRNN (128 units returning the sequence, then 64) over
    100 steps of 32 features, Dense 10."""
    return keras.Sequential([keras.Input((100, 32)),
                             layers.SimpleRNN(128, return_sequences=True),
                             layers.SimpleRNN(64), layers.Dense(10)], name="stacked_rnn")
