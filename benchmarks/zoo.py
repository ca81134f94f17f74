"""The benchmark zoo: builders for the models of the accuracy benchmark.

Each builder takes no required argument and builds with random weights
(nothing is downloaded). ``HELD_OUT`` models were written after the rules and
never used to tune them.
"""

from __future__ import annotations

import keras
from keras import layers


def mlp() -> keras.Model:
    """The 131,410-parameter MLP of the classic question (SEEDS section 1)."""
    return keras.Sequential(
        [keras.Input((1000,))]
        + [layers.Dense(100, activation="relu") for _ in range(4)]
        + [layers.Dense(10, activation="softmax")],
        name="mlp",
    )


def cnn() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(10),
        ],
        name="cnn",
    )


def resnet50() -> keras.Model:
    return keras.applications.ResNet50(weights=None)


def mobilenetv2() -> keras.Model:
    return keras.applications.MobileNetV2(weights=None)


def vgg16() -> keras.Model:
    return keras.applications.VGG16(weights=None)


def densenet121() -> keras.Model:
    return keras.applications.DenseNet121(weights=None)


def lstm() -> keras.Model:
    """An LSTM text classifier: 10,000-word vocabulary, sequences of 200."""
    inputs = keras.Input((200,), dtype="int32")
    x = layers.Embedding(10000, 128)(inputs)
    x = layers.LSTM(256)(x)
    outputs = layers.Dense(2)(x)
    return keras.Model(inputs, outputs, name="lstm")


def transformer() -> keras.Model:
    """A Transformer encoder: 4 blocks, width 256, 4 heads, sequence 128."""
    seq, width, heads, vocab = 128, 256, 4, 20000
    inputs = keras.Input((seq,), dtype="int32")
    x = layers.Embedding(vocab, width)(inputs)
    for _ in range(4):
        a = layers.MultiHeadAttention(heads, width // heads)(x, x)
        x = layers.LayerNormalization()(layers.Add()([x, a]))
        f = layers.Dense(4 * width, activation="gelu")(x)
        f = layers.Dense(width)(f)
        x = layers.LayerNormalization()(layers.Add()([x, f]))
    x = layers.GlobalAveragePooling1D()(x)
    outputs = layers.Dense(2)(x)
    return keras.Model(inputs, outputs, name="transformer")


def alexnet(input_size: int = 227, classes: int = 1000) -> keras.Model:
    """AlexNet (Krizhevsky et al. 2012) as one tower, without local response
    normalization: five convolutions, three fully connected layers."""
    inputs = keras.Input((input_size, input_size, 3))
    x = layers.Conv2D(96, 11, strides=4, activation="relu", name="conv1")(inputs)
    x = layers.MaxPooling2D(3, 2, name="pool1")(x)
    x = layers.Conv2D(256, 5, padding="same", activation="relu", name="conv2")(x)
    x = layers.MaxPooling2D(3, 2, name="pool2")(x)
    x = layers.Conv2D(384, 3, padding="same", activation="relu", name="conv3")(x)
    x = layers.Conv2D(384, 3, padding="same", activation="relu", name="conv4")(x)
    x = layers.Conv2D(256, 3, padding="same", activation="relu", name="conv5")(x)
    x = layers.MaxPooling2D(3, 2, name="pool5")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(4096, activation="relu", name="fc6")(x)
    x = layers.Dropout(0.5)(x)
    x = layers.Dense(4096, activation="relu", name="fc7")(x)
    x = layers.Dropout(0.5)(x)
    outputs = layers.Dense(classes, name="fc8")(x)
    return keras.Model(inputs, outputs, name="alexnet")


def alexnet_small() -> keras.Model:
    """AlexNet on 131 x 131 images (a 3 x 3 x 256 map into fc6)."""
    return alexnet(131)


# --- held out: never used to tune the rules ----------------------------------


def unet() -> keras.Model:
    """A small U-Net with skip connections (128 x 128 x 3, 2 classes per pixel)."""
    inputs = keras.Input((128, 128, 3))
    skips = []
    x = inputs
    for filters in (16, 32, 64):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        skips.append(x)
        x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(128, 3, padding="same", activation="relu")(x)
    for filters, skip in zip((64, 32, 16), reversed(skips)):
        x = layers.Conv2DTranspose(filters, 2, strides=2, padding="same")(x)
        x = layers.Concatenate()([x, skip])
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    outputs = layers.Conv2D(2, 1)(x)
    return keras.Model(inputs, outputs, name="unet")


def gru() -> keras.Model:
    """A two-layer GRU regressor on 64 features x 100 steps."""
    return keras.Sequential(
        [keras.Input((100, 64)), layers.GRU(128, return_sequences=True), layers.GRU(64),
         layers.Dense(1)],
        name="gru",
    )


def vit() -> keras.Model:
    """A ViT-style model: 8x8 patches of 64 x 64 images, 3 blocks, width 192."""
    width, heads = 192, 3
    inputs = keras.Input((64, 64, 3))
    x = layers.Conv2D(width, 8, strides=8)(inputs)
    x = layers.Reshape((64, width))(x)
    for _ in range(3):
        h = layers.LayerNormalization(epsilon=1e-6)(x)
        h = layers.MultiHeadAttention(heads, width // heads)(h, h)
        x = layers.Add()([x, h])
        h = layers.LayerNormalization(epsilon=1e-6)(x)
        h = layers.Dense(2 * width, activation="gelu")(h)
        h = layers.Dense(width)(h)
        x = layers.Add()([x, h])
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    x = layers.GlobalAveragePooling1D()(x)
    outputs = layers.Dense(10)(x)
    return keras.Model(inputs, outputs, name="vit")


def separable() -> keras.Model:
    """A depthwise-separable convnet with batch norm (96 x 96 x 3)."""
    inputs = keras.Input((96, 96, 3))
    x = layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    for filters, stride in ((64, 1), (128, 2), (128, 1), (256, 2)):
        x = layers.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(x)
        x = layers.SeparableConv2D(filters, 3, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.2)(x)
    outputs = layers.Dense(10)(x)
    return keras.Model(inputs, outputs, name="separable")


# --- models first estimated after the graph method was built: keras.applications
# architectures the zoo lacks, and small models of other kinds -------------------


def convnext() -> keras.Model:
    """ConvNeXt-Tiny on 64 x 64 inputs (its 7 x 7 depthwise convolutions are
    grouped Conv2D layers, which Keras runs with XLA on the CPU)."""
    return keras.applications.ConvNeXtTiny(weights=None, input_shape=(64, 64, 3), classes=10)


def efficientnetb0() -> keras.Model:
    return keras.applications.EfficientNetB0(weights=None, input_shape=(128, 128, 3),
                                             classes=10)


def mobilenetv3small() -> keras.Model:
    return keras.applications.MobileNetV3Small(weights=None, input_shape=(128, 128, 3),
                                               classes=10)


def xception() -> keras.Model:
    return keras.applications.Xception(weights=None, input_shape=(96, 96, 3), classes=10)


def nasnetmobile() -> keras.Model:
    return keras.applications.NASNetMobile(weights=None, input_shape=(96, 96, 3), classes=10)


def textcnn() -> keras.Model:
    """Embedding, Conv1D, global max pooling, dropout: a text classifier."""
    return keras.Sequential([
        keras.Input((300,), dtype="int32"), layers.Embedding(30000, 128),
        layers.Conv1D(128, 5, activation="relu"), layers.GlobalMaxPooling1D(),
        layers.Dropout(0.5), layers.Dense(64, activation="relu"), layers.Dense(5)],
        name="textcnn")


def autoencoder() -> keras.Model:
    """A dense autoencoder with dropout and gelu, compiled with its loss (mse)."""
    inputs = keras.Input((784,))
    x = layers.Dense(512, activation="relu")(inputs)
    x = layers.Dropout(0.2)(x)
    x = layers.Dense(64)(x)
    x = layers.Dense(512, activation="gelu")(x)
    model = keras.Model(inputs, layers.Dense(784, activation="sigmoid")(x), name="autoencoder")
    model.compile(loss="mse")
    return model


def groupnorm() -> keras.Model:
    """Convolutions with GroupNormalization and swish (64 x 64 x 8 inputs)."""
    return keras.Sequential([
        keras.Input((64, 64, 8)), layers.Conv2D(64, 3, padding="same"),
        layers.GroupNormalization(8), layers.Activation("swish"),
        layers.Conv2D(64, 3, strides=2, padding="same"), layers.GroupNormalization(8),
        layers.Activation("swish"), layers.GlobalAveragePooling2D(), layers.Dense(10)],
        name="groupnorm")


# --- models first estimated in the round after the unseen set -----------------


def twotower() -> keras.Model:
    """Two inputs (a vector and a small image), dropout, two outputs with two
    losses (compiled with them)."""
    a = keras.Input((32,), name="features")
    b = keras.Input((16, 16, 3), name="image")
    x = layers.Dense(256, activation="relu")(a)
    y = layers.Conv2D(32, 3, padding="same", activation="relu")(b)
    y = layers.GlobalAveragePooling2D()(y)
    h = layers.Dropout(0.3)(layers.Concatenate()([x, y]))
    model = keras.Model([a, b], [layers.Dense(10, name="cls")(h), layers.Dense(1, name="reg")(h)],
                        name="twotower")
    model.compile(loss=["sparse_categorical_crossentropy", "mse"])
    return model


def bilstm() -> keras.Model:
    """A masked embedding into a bidirectional LSTM of 64 units, max pooled."""
    inputs = keras.Input((40,), dtype="int32")
    x = layers.Embedding(5000, 64, mask_zero=True)(inputs)
    x = layers.Bidirectional(layers.LSTM(64, return_sequences=True))(x)
    x = layers.GlobalMaxPooling1D()(x)
    return keras.Model(inputs, layers.Dense(3)(x), name="bilstm")


def timedistributed() -> keras.Model:
    """A convolution applied to each of 8 frames (TimeDistributed), then a GRU."""
    inputs = keras.Input((8, 28, 28, 1))
    x = layers.TimeDistributed(layers.Conv2D(16, 3, activation="relu"))(inputs)
    x = layers.TimeDistributed(layers.Flatten())(x)
    x = layers.GRU(32)(x)
    return keras.Model(inputs, layers.Dense(5)(x), name="timedistributed")


def skipnet() -> keras.Model:
    """One down and one up level with a skip connection: max pooling,
    LayerNormalization, UpSampling2D, Concatenate, SpatialDropout2D, a sigmoid
    output compiled with binary cross-entropy."""
    inputs = keras.Input((64, 64, 3))
    c1 = layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    c2 = layers.Conv2D(32, 3, padding="same")(layers.MaxPooling2D()(c1))
    c2 = layers.LayerNormalization()(c2)
    u = layers.Concatenate()([layers.UpSampling2D()(c2), c1])
    u = layers.SpatialDropout2D(0.1)(u)
    model = keras.Model(inputs, layers.Conv2D(1, 1, activation="sigmoid")(u), name="skipnet")
    model.compile(loss="binary_crossentropy")
    return model


class ResidualMLP(keras.Model):
    """A subclassed model: gelu, a residual BatchNormalization branch, relu."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.d1 = layers.Dense(512, activation="gelu")
        self.d2 = layers.Dense(512)
        self.bn = layers.BatchNormalization()
        self.out = layers.Dense(10)

    def call(self, x, training=False):
        h = self.d1(x)
        h = self.bn(self.d2(h), training=training) + h
        return self.out(keras.ops.relu(h))


def subclassed() -> keras.Model:
    """:class:`ResidualMLP` on 128 features, built by calling it once."""
    model = ResidualMLP(name="subclassed")
    model(keras.ops.zeros((1, 128)))
    return model


def causal() -> keras.Model:
    """A causal self-attention block (4 heads) with a residual and a ReLU MLP."""
    inputs = keras.Input((64, 128))
    x = layers.MultiHeadAttention(4, 32)(inputs, inputs, use_causal_mask=True)
    x = layers.LayerNormalization()(layers.Add()([inputs, x]))
    x = layers.Dense(128)(layers.Dense(512, activation="relu")(x))
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, layers.Dense(4)(x), name="causal")


def strided() -> keras.Model:
    """Strided and dilated convolutions, ELU, PReLU, average pooling, softmax."""
    return keras.Sequential([
        keras.Input((96, 96, 3)),
        layers.Conv2D(32, 5, strides=2, activation="elu"), layers.BatchNormalization(),
        layers.Conv2D(64, 3, dilation_rate=2), layers.PReLU(),
        layers.AveragePooling2D(2), layers.Flatten(), layers.Dense(10, activation="softmax")],
        name="strided")



# --- models first estimated in the round after the fresh set -----------------


def wavenet() -> keras.Model:
    """Causal dilated Conv1D (dilations 1-8) with gated tanh x sigmoid units,
    residual and skip sums (a WaveNet stack) on 1024-step signals."""
    inputs = keras.Input((1024, 1))
    x = layers.Conv1D(32, 1)(inputs)
    skips = []
    for rate in (1, 2, 4, 8):
        t = layers.Conv1D(32, 2, dilation_rate=rate, padding="causal", activation="tanh")(x)
        s = layers.Conv1D(32, 2, dilation_rate=rate, padding="causal",
                          activation="sigmoid")(x)
        g = layers.Conv1D(32, 1)(layers.Multiply()([t, s]))
        skips.append(g)
        x = layers.Add()([x, g])
    h = layers.Activation("relu")(layers.Add()(skips))
    h = layers.GlobalAveragePooling1D()(layers.Conv1D(32, 1, activation="relu")(h))
    return keras.Model(inputs, layers.Dense(10)(h), name="wavenet")


def resnet50v2() -> keras.Model:
    """ResNet50V2 (pre-activation blocks) on 128 x 128 inputs."""
    return keras.applications.ResNet50V2(weights=None, input_shape=(128, 128, 3), classes=10)


def inceptionv3() -> keras.Model:
    """InceptionV3 (factorized 1 x 7 / 7 x 1 branches) on 139 x 139 inputs."""
    return keras.applications.InceptionV3(weights=None, input_shape=(139, 139, 3), classes=10)


@keras.saving.register_keras_serializable(package="benchmarks")
class Sampling(layers.Layer):
    """The reparameterization of a VAE: z = mean + exp(log_var / 2) * noise,
    adding the KL divergence as a loss."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed = keras.random.SeedGenerator(1)

    def call(self, inputs):
        mean, log_var = inputs
        kl = -0.5 * keras.ops.mean(1 + log_var - keras.ops.square(mean) - keras.ops.exp(log_var))
        self.add_loss(kl)
        noise = keras.random.normal(keras.ops.shape(mean), seed=self.seed)
        return mean + keras.ops.exp(0.5 * log_var) * noise


def vae() -> keras.Model:
    """A dense variational autoencoder: a custom sampling layer with random
    noise and an added KL loss, compiled with binary cross-entropy."""
    inputs = keras.Input((784,))
    h = layers.Dense(512, activation="relu")(inputs)
    z = Sampling()([layers.Dense(32)(h), layers.Dense(32)(h)])
    h = layers.Dense(512, activation="relu")(z)
    model = keras.Model(inputs, layers.Dense(784, activation="sigmoid")(h), name="vae")
    model.compile(loss="binary_crossentropy")
    return model


def gqa() -> keras.Model:
    """A token model: embedding, causal grouped-query attention (8 query and
    2 key/value heads), RMS normalization, a SiLU-gated MLP, per-token logits
    over 8000 tokens."""
    inputs = keras.Input((128,), dtype="int32")
    x = layers.Embedding(8000, 256)(inputs)
    h = layers.RMSNormalization()(x)
    h = layers.GroupQueryAttention(32, 8, 2)(h, h, use_causal_mask=True)
    x = layers.Add()([x, h])
    h = layers.RMSNormalization()(x)
    gate = layers.Dense(512, activation="silu")(h)
    h = layers.Dense(256)(layers.Multiply()([gate, layers.Dense(512)(h)]))
    x = layers.Add()([x, h])
    return keras.Model(inputs, layers.Dense(8000)(x), name="gqa")


def regularized() -> keras.Model:
    """Convolutions with L2 weight penalties, BatchNormalization, dropout and
    global max pooling (64 x 64 x 3 inputs)."""
    l2 = keras.regularizers.L2(1e-4)
    return keras.Sequential([
        keras.Input((64, 64, 3)),
        layers.Conv2D(32, 3, padding="same", kernel_regularizer=l2), layers.BatchNormalization(),
        layers.Activation("relu"),
        layers.Conv2D(64, 3, strides=2, padding="same", kernel_regularizer=l2),
        layers.BatchNormalization(), layers.Activation("relu"), layers.Dropout(0.25),
        layers.Conv2D(128, 3, strides=2, padding="same", kernel_regularizer=l2),
        layers.GlobalMaxPooling2D(), layers.Dense(10, kernel_regularizer=l2)],
        name="regularized")


def convlstm() -> keras.Model:
    """A ConvLSTM2D over 8 frames of 32 x 32 x 4, average pooled."""
    inputs = keras.Input((8, 32, 32, 4))
    x = layers.ConvLSTM2D(16, 3, padding="same")(inputs)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(5)(x), name="convlstm")



# --- models first estimated in the round after the novel set -----------------


def mixer() -> keras.Model:
    """An MLP-Mixer: 8 x 8 patches of a 64 x 64 image, token mixing through
    a transpose (Permute), channel mixing, LayerNormalization, GELU."""
    inputs = keras.Input((64, 64, 3))
    x = layers.Conv2D(128, 8, strides=8)(inputs)
    x = layers.Reshape((64, 128))(x)
    for _ in range(2):
        h = layers.Permute((2, 1))(layers.LayerNormalization()(x))
        h = layers.Dense(64)(layers.Dense(256, activation="gelu")(h))
        x = layers.Add()([x, layers.Permute((2, 1))(h)])
        h = layers.LayerNormalization()(x)
        h = layers.Dense(128)(layers.Dense(512, activation="gelu")(h))
        x = layers.Add()([x, h])
    x = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(x))
    return keras.Model(inputs, layers.Dense(10)(x), name="mixer")


def generator() -> keras.Model:
    """A DCGAN-style generator: a 128-d code through Dense and Reshape, three
    stride-2 Conv2DTranspose with BatchNormalization and LeakyReLU, a tanh
    64 x 64 x 3 image, compiled with mean absolute error."""
    inputs = keras.Input((128,))
    x = layers.Reshape((8, 8, 256))(layers.Dense(8 * 8 * 256, use_bias=False)(inputs))
    for filters in (128, 64, 32):
        x = layers.Conv2DTranspose(filters, 4, strides=2, padding="same", use_bias=False)(x)
        x = layers.LeakyReLU(0.2)(layers.BatchNormalization()(x))
    x = layers.Conv2D(3, 3, padding="same", activation="tanh")(x)
    model = keras.Model(inputs, x, name="generator")
    model.compile(loss="mae")
    return model


def video() -> keras.Model:
    """Conv3D over 8 frames of 32 x 32 x 3: two 3 x 3 x 3 convolutions with
    MaxPooling3D, global average pooling."""
    return keras.Sequential([
        keras.Input((8, 32, 32, 3)),
        layers.Conv3D(16, 3, padding="same", activation="relu"), layers.MaxPooling3D(2),
        layers.Conv3D(32, 3, padding="same", activation="relu"),
        layers.GlobalAveragePooling3D(), layers.Dense(6)], name="video")


def c3d() -> keras.Model:
    """A C3D-like clip classifier on 16 frames of 56 x 56 x 3: three 3 x 3 x
    3 Conv3D (32, 64, 64) with MaxPooling3D, global average pooling."""
    return keras.Sequential([
        keras.Input((16, 56, 56, 3)),
        layers.Conv3D(32, 3, padding="same", activation="relu"), layers.MaxPooling3D((1, 2, 2)),
        layers.Conv3D(64, 3, padding="same", activation="relu"), layers.MaxPooling3D(2),
        layers.Conv3D(64, 3, padding="same", activation="relu"),
        layers.GlobalAveragePooling3D(), layers.Dense(10)], name="c3d")


def ae3d() -> keras.Model:
    """A volume autoencoder on 16 x 32 x 32 x 2: two stride-2 Conv3D down,
    two stride-2 Conv3DTranspose back up, mean squared error."""
    inputs = keras.Input((16, 32, 32, 2))
    x = layers.Conv3D(16, 3, strides=2, padding="same", activation="relu")(inputs)
    x = layers.Conv3D(32, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.Conv3DTranspose(16, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.Conv3DTranspose(2, 3, strides=2, padding="same")(x)
    model = keras.Model(inputs, x, name="ae3d")
    model.compile(loss="mse")
    return model


def r3d() -> keras.Model:
    """A small 3-D ResNet on 8 frames of 64 x 64 x 3: a strided Conv3D stem,
    two residual blocks of two 3 x 3 x 3 Conv3D with BatchNormalization (the
    second block strided, with a 1 x 1 x 1 projection), global average
    pooling."""
    inputs = keras.Input((8, 64, 64, 3))
    x = layers.Conv3D(24, (3, 7, 7), strides=(1, 2, 2), padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    for filters, stride in ((24, 1), (48, 2)):
        y = layers.Conv3D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        y = layers.ReLU()(layers.BatchNormalization()(y))
        y = layers.BatchNormalization()(layers.Conv3D(filters, 3, padding="same",
                                                      use_bias=False)(y))
        if stride != 1:
            x = layers.BatchNormalization()(layers.Conv3D(filters, 1, strides=stride,
                                                          use_bias=False)(x))
        x = layers.ReLU()(layers.Add()([x, y]))
    x = layers.GlobalAveragePooling3D()(x)
    return keras.Model(inputs, layers.Dense(5)(x), name="r3d")


def siamese() -> keras.Model:
    """One convolutional encoder shared by two 48 x 48 images, the absolute
    difference of their codes, a sigmoid, binary cross-entropy."""
    encoder = keras.Sequential([
        keras.Input((48, 48, 1)),
        layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
        layers.Conv2D(64, 3, activation="relu"), layers.GlobalAveragePooling2D(),
        layers.Dense(64)], name="encoder")
    a = keras.Input((48, 48, 1), name="left")
    b = keras.Input((48, 48, 1), name="right")
    d = layers.Lambda(lambda t: keras.ops.abs(t[0] - t[1]))([encoder(a), encoder(b)])
    model = keras.Model([a, b], layers.Dense(1, activation="sigmoid")(d), name="siamese")
    model.compile(loss="binary_crossentropy")
    return model


def efficientnetv2b0() -> keras.Model:
    """EfficientNetV2-B0 (fused MBConv blocks, its own rescaling) on 96 x 96."""
    return keras.applications.EfficientNetV2B0(weights=None, input_shape=(96, 96, 3),
                                               classes=10)


def resnext() -> keras.Model:
    """Two ResNeXt blocks (1 x 1, a 3 x 3 convolution in 8 groups, 1 x 1,
    BatchNormalization, a residual sum) on 64 x 64 inputs."""
    inputs = keras.Input((64, 64, 3))
    x = layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(inputs)
    for _ in range(2):
        h = layers.Conv2D(64, 1, activation="relu")(x)
        h = layers.Conv2D(64, 3, padding="same", groups=8, activation="relu")(h)
        h = layers.BatchNormalization()(layers.Conv2D(64, 1)(h))
        x = layers.Activation("relu")(layers.Add()([x, h]))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="resnext")


def crossattn() -> keras.Model:
    """Cross-attention: 32 query tokens attend to 96 context tokens (two
    inputs, 4 heads), LayerNormalization, a per-token softmax over 50
    classes."""
    q = keras.Input((32, 64), name="queries")
    c = keras.Input((96, 64), name="context")
    x = layers.Add()([q, layers.MultiHeadAttention(4, 16)(q, c)])
    x = layers.LayerNormalization()(x)
    x = layers.Dense(256, activation="relu")(x)
    return keras.Model([q, c], layers.Dense(50, activation="softmax")(x), name="crossattn")


def highway() -> keras.Model:
    """Highway layers written with Lambda and keras.ops: a sigmoid gate
    mixing a tanh transform with its input, t * h + (1 - t) * x, with
    dropout."""
    inputs = keras.Input((256,))
    x = layers.Dense(512)(inputs)
    for _ in range(3):
        h = layers.Dense(512, activation="tanh")(x)
        t = layers.Dense(512, activation="sigmoid")(x)
        x = layers.Lambda(lambda v: v[0] * v[1] + (1.0 - v[0]) * v[2])([t, h, x])
        x = layers.Dropout(0.2)(x)
    return keras.Model(inputs, layers.Dense(20)(x), name="highway")


# --- models first estimated in the round after the untried set --------------


def deeplab() -> keras.Model:
    """An atrous spatial pyramid (DeepLab-style): a stride-2 stem, parallel
    1 x 1 and dilated 3 x 3 convolutions (rates 2 and 4) and an image-pooling
    branch broadcast back by UpSampling2D, concatenated, bilinear upsampling
    to the input's size, per-pixel logits over 5 classes (sparse
    cross-entropy from logits)."""
    inputs = keras.Input((64, 64, 3))
    x = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(inputs)
    branches = [layers.Conv2D(32, 1, activation="relu")(x)]
    for rate in (2, 4):
        branches.append(layers.Conv2D(32, 3, padding="same", dilation_rate=rate,
                                      activation="relu")(x))
    pooled = layers.GlobalAveragePooling2D(keepdims=True)(x)
    pooled = layers.Conv2D(32, 1, activation="relu")(pooled)
    branches.append(layers.UpSampling2D(32)(pooled))
    x = layers.Conv2D(64, 1, activation="relu")(layers.Concatenate()(branches))
    x = layers.UpSampling2D(2, interpolation="bilinear")(x)
    model = keras.Model(inputs, layers.Conv2D(5, 1)(x), name="deeplab")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def crnn() -> keras.Model:
    """A convolutional-recurrent tagger on 64 x 64 spectrograms: two
    convolutions with pooling along frequency only, the frequency axis
    folded into features, a SimpleRNN over the 64 frames, a softmax over 20
    labels per frame."""
    inputs = keras.Input((64, 64, 1))
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = layers.MaxPooling2D((1, 4))(x)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D((1, 4))(x)
    x = layers.Reshape((64, 4 * 32))(x)
    x = layers.SimpleRNN(128, return_sequences=True)(x)
    model = keras.Model(inputs, layers.Dense(20, activation="softmax")(x), name="crnn")
    model.compile(loss="sparse_categorical_crossentropy")
    return model


class Experts(layers.Layer):
    """``n`` expert MLPs applied to every token, mixed by a softmax gate:
    one ``(n, d, h)`` kernel and one ``(n, h, d)`` kernel, ``keras.ops.einsum``."""

    def __init__(self, experts: int = 4, hidden: int = 128, **kwargs):
        super().__init__(**kwargs)
        self.experts, self.hidden = experts, hidden

    def build(self, input_shape):
        d = input_shape[0][-1]
        self.w_in = self.add_weight(shape=(self.experts, d, self.hidden),
                                    initializer="glorot_uniform", name="w_in")
        self.w_out = self.add_weight(shape=(self.experts, self.hidden, d),
                                     initializer="glorot_uniform", name="w_out")

    def call(self, inputs):
        x, gate = inputs
        h = keras.ops.gelu(keras.ops.einsum("btd,edh->bteh", x, self.w_in))
        y = keras.ops.einsum("bteh,ehd->bted", h, self.w_out)
        return keras.ops.einsum("bted,bte->btd", y, gate)

    def get_config(self):
        return {**super().get_config(), "experts": self.experts, "hidden": self.hidden}


def moe() -> keras.Model:
    """A mixture-of-experts block on 32 tokens of 64 features: a softmax gate
    over four experts (a custom layer of einsums), a residual sum,
    LayerNormalization, mean pooling, 10 classes."""
    inputs = keras.Input((32, 64))
    gate = layers.Dense(4, activation="softmax")(inputs)
    x = layers.Add()([inputs, Experts(4, 128)([inputs, gate])])
    x = layers.LayerNormalization()(x)
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="moe")


def selunet() -> keras.Model:
    """A self-normalizing regression MLP: SELU layers with lecun_normal
    weights, GaussianNoise, AlphaDropout, UnitNormalization, 32 outputs,
    Huber loss."""
    inputs = keras.Input((256,))
    x = layers.GaussianNoise(0.1)(inputs)
    for _ in range(2):
        x = layers.Dense(512, activation="selu", kernel_initializer="lecun_normal")(x)
        x = layers.AlphaDropout(0.1)(x)
    x = layers.UnitNormalization()(x)
    model = keras.Model(inputs, layers.Dense(32)(x), name="selunet")
    model.compile(loss="huber")
    return model


def additive() -> keras.Model:
    """Additive (Bahdanau) self-attention over a convolutional encoding of 64
    tokens: Embedding, Conv1D, AdditiveAttention (a tanh over every
    query-key pair), GlobalMaxPooling1D, 3 classes."""
    inputs = keras.Input((64,), dtype="int32")
    x = layers.Embedding(5000, 64)(inputs)
    x = layers.Conv1D(64, 3, padding="same", activation="relu")(x)
    x = layers.AdditiveAttention()([x, x])
    x = layers.GlobalMaxPooling1D()(x)
    return keras.Model(inputs, layers.Dense(3)(x), name="additive")


def upconv1d() -> keras.Model:
    """A 1-D convolutional autoencoder for 250-step, 8-channel signals:
    ZeroPadding1D to 256, two stride-2 Conv1D with ELU, two stride-2
    Conv1DTranspose, Cropping1D back to 250, mean squared error."""
    inputs = keras.Input((250, 8))
    x = layers.ZeroPadding1D(3)(inputs)
    x = layers.Conv1D(32, 5, strides=2, padding="same", activation="elu")(x)
    x = layers.Conv1D(64, 5, strides=2, padding="same", activation="elu")(x)
    x = layers.Conv1DTranspose(32, 5, strides=2, padding="same", activation="elu")(x)
    x = layers.Conv1DTranspose(8, 5, strides=2, padding="same")(x)
    model = keras.Model(inputs, layers.Cropping1D(3)(x), name="upconv1d")
    model.compile(loss="mse")
    return model


def mobilenet() -> keras.Model:
    """MobileNet (v1) at width 0.5 on 128 x 128 inputs, 10 classes."""
    return keras.applications.MobileNet(weights=None, alpha=0.5, input_shape=(128, 128, 3),
                                        classes=10)


def augmented() -> keras.Model:
    """Augmentation inside the model (Rescaling, RandomFlip,
    RandomTranslation), a convolution with BatchNormalization and ELU,
    AveragePooling2D, GlobalMaxPooling2D, 10 classes."""
    inputs = keras.Input((64, 64, 3))
    x = layers.Rescaling(1 / 255)(inputs)
    x = layers.RandomFlip("horizontal")(x)
    x = layers.RandomTranslation(0.1, 0.1)(x)
    x = layers.ELU()(layers.BatchNormalization()(layers.Conv2D(32, 3, padding="same")(x)))
    x = layers.AveragePooling2D(2)(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.GlobalMaxPooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="augmented")


class FiLM(layers.Layer):
    """Feature-wise modulation: ``x * (1 + gamma) + beta``, the scale and shift
    computed from a condition vector and broadcast over the positions."""

    def call(self, inputs):
        x, gamma, beta = inputs
        return x * (1.0 + gamma[:, None, None, :]) + beta[:, None, None, :]


def film() -> keras.Model:
    """A convolutional net conditioned on a second input by FiLM: two
    Conv2D blocks on 32 x 32 x 3 images, each modulated by Dense layers of a
    16-feature condition, global pooling, 10 classes."""
    image, cond = keras.Input((32, 32, 3)), keras.Input((16,))
    x = image
    for channels in (32, 64):
        x = layers.Conv2D(channels, 3, padding="same")(x)
        x = FiLM()([x, layers.Dense(channels)(cond), layers.Dense(channels)(cond)])
        x = layers.ReLU()(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model([image, cond], layers.Dense(10)(x), name="film")


class LinearAttention(layers.Layer):
    """Kernelized attention without the token-by-token matrix: ``elu + 1``
    features of the queries and keys, ``keras.ops.matmul`` of the 3-D inputs
    with 2-D kernels, ``phi(q) (phi(k)^T v)`` normalized by ``phi(q)
    sum(phi(k))``."""

    def build(self, input_shape):
        d = input_shape[-1]
        self.wq, self.wk, self.wv = (self.add_weight(shape=(d, d), name=n)
                                     for n in ("wq", "wk", "wv"))

    def call(self, x):
        ops = keras.ops
        q = ops.elu(ops.matmul(x, self.wq)) + 1.0
        k = ops.elu(ops.matmul(x, self.wk)) + 1.0
        v = ops.matmul(x, self.wv)
        kv = ops.einsum("bnd,bne->bde", k, v)
        norm = ops.einsum("bnd,bd->bn", q, ops.sum(k, axis=1))
        return ops.einsum("bnd,bde->bne", q, kv) / (norm[..., None] + 1e-6)


def linattn() -> keras.Model:
    """Linear attention over 256 tokens of 64 features (a custom layer),
    a residual sum, LayerNormalization, mean pooling, 5 classes."""
    inputs = keras.Input((256, 64))
    x = layers.LayerNormalization()(layers.Add()([inputs, LinearAttention()(inputs)]))
    return keras.Model(inputs, layers.Dense(5)(layers.GlobalAveragePooling1D()(x)),
                       name="linattn")


def bow() -> keras.Model:
    """A bag of words: a 50000 x 32 Embedding over 128 ids, mean pooling,
    Dropout, a 64-unit ReLU layer, 4 classes."""
    inputs = keras.Input((128,), dtype="int32")
    x = layers.GlobalAveragePooling1D()(layers.Embedding(50000, 32)(inputs))
    x = layers.Dense(64, activation="relu")(layers.Dropout(0.3)(x))
    return keras.Model(inputs, layers.Dense(4)(x), name="bow")


def convmixer() -> keras.Model:
    """ConvMixer on 64 x 64 images: a stride-4 patch embedding of 128
    channels, three blocks of a residual 5 x 5 depthwise convolution and a
    pointwise one, each with GELU and BatchNormalization, 10 classes."""
    inputs = keras.Input((64, 64, 3))
    x = layers.BatchNormalization()(layers.Activation("gelu")(
        layers.Conv2D(128, 4, strides=4)(inputs)))
    for _ in range(3):
        y = layers.DepthwiseConv2D(5, padding="same")(x)
        x = layers.Add()([x, layers.BatchNormalization()(layers.Activation("gelu")(y))])
        x = layers.BatchNormalization()(layers.Activation("gelu")(layers.Conv2D(128, 1)(x)))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="convmixer")


def axialattn() -> keras.Model:
    """Self-attention over both spatial axes of a 16 x 16 x 32 feature map
    (``attention_axes=(1, 2)``: every position attends to all 256), a
    residual add and LayerNormalization, 10 classes."""
    inputs = keras.Input((32, 32, 3))
    x = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(inputs)
    h = layers.MultiHeadAttention(4, 8, attention_axes=(1, 2))(x, x)
    x = layers.LayerNormalization()(layers.Add()([x, h]))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="axialattn")


def emacnn() -> keras.Model:
    """ZeroPadding2D, a 5 x 5 convolution with LeakyReLU, AveragePooling2D, a
    ReLU capped at 6, Cropping2D, Dropout, 10 classes."""
    inputs = keras.Input((32, 32, 3))
    x = layers.ZeroPadding2D(2)(inputs)
    x = layers.LeakyReLU(0.1)(layers.Conv2D(32, 5)(x))
    x = layers.AveragePooling2D(2)(x)
    x = layers.ReLU(max_value=6.0)(layers.Conv2D(64, 3, padding="same")(x))
    x = layers.Dropout(0.2)(layers.Cropping2D(1)(x))
    return keras.Model(inputs, layers.Dense(10)(layers.Flatten()(x)), name="emacnn")


def sepconv1d() -> keras.Model:
    """Over 256 steps of 32 features: SeparableConv1D with ELU,
    DepthwiseConv1D, LayerNormalization, a stride-2 Conv1DTranspose,
    MaxPooling1D, global max pooling, 5 classes."""
    inputs = keras.Input((256, 32))
    x = layers.SeparableConv1D(64, 5, padding="same", activation="elu")(inputs)
    x = layers.LayerNormalization()(layers.DepthwiseConv1D(3, padding="same")(x))
    x = layers.Conv1DTranspose(32, 4, strides=2, padding="same")(x)
    x = layers.GlobalMaxPooling1D()(layers.MaxPooling1D(2)(x))
    return keras.Model(inputs, layers.Dense(5)(x), name="sepconv1d")


def permutemlp() -> keras.Model:
    """Dense layers mixing each axis in turn of a 16 x 64 input (Permute,
    GELU, SELU), then Reshape, GaussianNoise, an ELU layer, 10 classes."""
    inputs = keras.Input((16, 64))
    x = layers.Dense(32, activation="gelu")(layers.Permute((2, 1))(inputs))
    x = layers.Dense(64, activation="selu")(layers.Permute((2, 1))(x))
    x = layers.GaussianNoise(0.1)(layers.Reshape((2048,))(x))
    x = layers.Dense(256, activation="elu")(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="permutemlp")


def denoiser() -> keras.Model:
    """A convolutional denoiser on 64 x 64 x 1 images: two stride-2
    convolutions with BatchNormalization, two stride-2 Conv2DTranspose back
    up with an additive skip, a sigmoid output compiled with mse."""
    inputs = keras.Input((64, 64, 1))
    e1 = layers.ReLU()(layers.BatchNormalization()(
        layers.Conv2D(16, 3, strides=2, padding="same")(inputs)))
    e2 = layers.ReLU()(layers.BatchNormalization()(
        layers.Conv2D(32, 3, strides=2, padding="same")(e1)))
    d1 = layers.Conv2DTranspose(16, 3, strides=2, padding="same", activation="relu")(e2)
    out = layers.Conv2DTranspose(1, 3, strides=2, padding="same", activation="sigmoid")(
        layers.Add()([d1, e1]))
    model = keras.Model(inputs, out, name="denoiser")
    model.compile(loss="mse")
    return model


def unet3d() -> keras.Model:
    """A two-level 3-D U-Net on 32 x 32 x 32 single-channel volumes: Conv3D
    with BatchNormalization, MaxPooling3D, a stride-2 Conv3DTranspose back up
    and a concatenated skip, a sigmoid voxel map compiled with binary focal
    cross-entropy."""
    inputs = keras.Input((32, 32, 32, 1))

    def block(x, filters):
        for _ in range(2):
            x = layers.Conv3D(filters, 3, padding="same", use_bias=False)(x)
            x = layers.ReLU()(layers.BatchNormalization()(x))
        return x

    e1 = block(inputs, 8)
    e2 = block(layers.MaxPooling3D(2)(e1), 16)
    up = layers.Conv3DTranspose(8, 2, strides=2, padding="same")(e2)
    d1 = block(layers.Concatenate()([up, e1]), 8)
    out = layers.Conv3D(1, 1, activation="sigmoid")(d1)
    model = keras.Model(inputs, out, name="unet3d")
    model.compile(loss="binary_focal_crossentropy")
    return model


def ncf() -> keras.Model:
    """Neural collaborative filtering: user (50,000) and item (20,000)
    Embeddings of 64, a cosine Dot beside an MLP over their concatenation, a
    sigmoid score compiled with binary cross-entropy."""
    user = keras.Input((1,), dtype="int32")
    item = keras.Input((1,), dtype="int32")
    u = layers.Flatten()(layers.Embedding(50_000, 64)(user))
    v = layers.Flatten()(layers.Embedding(20_000, 64)(item))
    cosine = layers.Dot(axes=1, normalize=True)([u, v])
    h = layers.Dense(128, activation="relu")(layers.Concatenate()([u, v]))
    h = layers.Dense(64, activation="relu")(h)
    out = layers.Dense(1, activation="sigmoid")(layers.Concatenate()([h, cosine]))
    model = keras.Model([user, item], out, name="ncf")
    model.compile(loss="binary_crossentropy")
    return model


def spectral() -> keras.Model:
    """A GAN-style discriminator on 64 x 64 x 3 images: four stride-2 Conv2D
    wrapped in SpectralNormalization with LeakyReLU, global average pooling,
    one score compiled with the hinge loss."""
    inputs = keras.Input((64, 64, 3))
    x = inputs
    for filters in (32, 64, 128, 256):
        x = layers.SpectralNormalization(layers.Conv2D(filters, 4, strides=2, padding="same"))(x)
        x = layers.LeakyReLU(0.2)(x)
    x = layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, layers.Dense(1)(x), name="spectral")
    model.compile(loss="hinge")
    return model


def tokenattn() -> keras.Model:
    """A token model of 128 positions with dot-product Attention (Luong,
    learned scale) over EinsumDense projections, LayerNormalization, an
    EinsumDense feed-forward with GELU; the mean over positions to a softmax
    over 50 topics compiled with KL divergence."""
    tokens = keras.Input((128,), dtype="int32")
    x = layers.Embedding(8000, 128)(tokens)
    for _ in range(2):
        h = layers.LayerNormalization()(x)
        q = layers.EinsumDense("bsd,de->bse", output_shape=(None, 128))(h)
        k = layers.EinsumDense("bsd,de->bse", output_shape=(None, 128))(h)
        x = layers.Add()([x, layers.Attention(use_scale=True)([q, h, k])])
        h = layers.LayerNormalization()(x)
        h = layers.EinsumDense("bsd,de->bse", output_shape=(None, 256), bias_axes="e",
                               activation="gelu")(h)
        x = layers.Add()([x, layers.EinsumDense("bse,ed->bsd", output_shape=(None, 128))(h)])
    x = layers.GlobalAveragePooling1D()(x)
    model = keras.Model(tokens, layers.Dense(50, activation="softmax")(x), name="tokenattn")
    model.compile(loss="kl_divergence")
    return model


def poissonnet() -> keras.Model:
    """A count regressor on 512-step, 16-channel sequences: grouped Conv1D
    (4 groups), MaxPooling1D, a second grouped Conv1D, global average
    pooling, a softplus rate for 8 counts compiled with the Poisson loss."""
    inputs = keras.Input((512, 16))
    x = layers.Conv1D(64, 7, padding="same", groups=4, activation="relu")(inputs)
    x = layers.MaxPooling1D(2)(x)
    x = layers.Conv1D(128, 5, padding="same", groups=4, activation="relu")(x)
    x = layers.GlobalAveragePooling1D()(x)
    model = keras.Model(inputs, layers.Dense(8, activation="softplus")(x), name="poissonnet")
    model.compile(loss="poisson")
    return model


def fp16cnn() -> keras.Model:
    """A CNN on 64 x 64 x 3 images whose layers compute in float16
    (``mixed_float16``: float32 weights, float16 activations; compiled, the
    optimizer scales the loss): three Conv2D with BatchNormalization and
    ReLU, max pooling, global average pooling, a float32 softmax over 10."""
    policy = "mixed_float16"
    inputs = keras.Input((64, 64, 3))
    x = inputs
    for filters in (32, 64, 128):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False, dtype=policy)(x)
        x = layers.ReLU(dtype=policy)(layers.BatchNormalization(dtype=policy)(x))
        x = layers.MaxPooling2D(2, dtype=policy)(x)
    x = layers.GlobalAveragePooling2D(dtype=policy)(x)
    return keras.Model(inputs, layers.Dense(10, activation="softmax", dtype="float32")(x),
                       name="fp16cnn")


def unrolled() -> keras.Model:
    """Two LSTMs unrolled over 32 tokens (``unroll=True``: one op per step,
    no loop) after an Embedding of 5000 x 64, five classes."""
    tokens = keras.Input((32,), dtype="int32")
    x = layers.Embedding(5000, 64)(tokens)
    x = layers.LSTM(128, unroll=True, return_sequences=True)(x)
    x = layers.LSTM(64, unroll=True)(x)
    return keras.Model(tokens, layers.Dense(5)(x), name="unrolled")


def maskednet() -> keras.Model:
    """Masking over 50 steps of 16 features, a bidirectional GRU, dot-product
    Attention of the sequence over itself, global max pooling, a softmax
    over 6 classes compiled with label-smoothed categorical cross-entropy."""
    inputs = keras.Input((50, 16))
    x = layers.Masking()(inputs)
    x = layers.Bidirectional(layers.GRU(64, return_sequences=True))(x)
    x = layers.Attention()([x, x])
    x = layers.GlobalMaxPooling1D()(x)
    model = keras.Model(inputs, layers.Dense(6, activation="softmax")(x), name="maskednet")
    model.compile(loss=keras.losses.CategoricalCrossentropy(label_smoothing=0.1))
    return model


def nested() -> keras.Model:
    """Three 256-wide inputs through one shared Sequential block (Dense 512
    GELU, LayerNormalization, Dense 256), averaged, ten logits."""
    block = keras.Sequential([layers.Dense(512, activation="gelu"), layers.LayerNormalization(),
                              layers.Dense(256)], name="shared_block")
    inputs = [keras.Input((256,)) for _ in range(3)]
    x = layers.Average()([block(i) for i in inputs])
    return keras.Model(inputs, layers.Dense(10)(x), name="nested")


def constrained() -> keras.Model:
    """An MLP on 784 inputs with max-norm kernel constraints (applied after
    every update), dropout with a shared noise shape, activity
    regularization, ten logits."""
    inputs = keras.Input((784,))
    x = inputs
    for width in (1024, 1024):
        x = layers.Dense(width, activation="relu",
                         kernel_constraint=keras.constraints.MaxNorm(3))(x)
        x = layers.ActivityRegularization(l2=1e-5)(x)
        x = layers.Dropout(0.3, noise_shape=(None, width))(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="constrained")


def regnetlike() -> keras.Model:
    """RegNetX-style stages on 96 x 96 images: a stride-2 stem, then per
    stage a block of 1 x 1 convolution, 3 x 3 grouped convolution (16
    channels per group, stride 2; Keras runs it with XLA on the CPU) and 1 x
    1 convolution, BatchNormalization and ReLU, with a strided 1 x 1
    shortcut added; 10 classes."""
    inputs = keras.Input((96, 96, 3))
    x = layers.ReLU()(layers.BatchNormalization()(
        layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False)(inputs)))
    for width in (48, 96, 192):
        h = layers.ReLU()(layers.BatchNormalization()(
            layers.Conv2D(width, 1, use_bias=False)(x)))
        h = layers.ReLU()(layers.BatchNormalization()(
            layers.Conv2D(width, 3, strides=2, padding="same", groups=width // 16,
                          use_bias=False)(h)))
        h = layers.BatchNormalization()(layers.Conv2D(width, 1, use_bias=False)(h))
        shortcut = layers.BatchNormalization()(
            layers.Conv2D(width, 1, strides=2, use_bias=False)(x))
        x = layers.ReLU()(layers.Add()([h, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="regnetlike")


def mobilenetv3large() -> keras.Model:
    """keras.applications.MobileNetV3Large (weights=None) on 160 x 160
    images: hard swish, squeeze-and-excitation, its own Rescaling."""
    return keras.applications.MobileNetV3Large(weights=None, input_shape=(160, 160, 3))


def convlstm1d() -> keras.Model:
    """ConvLSTM1D over 10 steps of 64 positions x 8 channels, returning the
    sequence, then a Conv1D over the last step's map and 4 classes."""
    inputs = keras.Input((10, 64, 8))
    x = layers.ConvLSTM1D(32, 3, padding="same", return_sequences=True)(inputs)
    x = layers.ConvLSTM1D(32, 3, padding="same")(x)
    x = layers.Conv1D(16, 3, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(4)(layers.GlobalMaxPooling1D()(x)),
                       name="convlstm1d")


def maskedmean() -> keras.Model:
    """An Embedding of 20000 x 128 with ``mask_zero=True``, the masked mean
    over 100 tokens, a softmax over 20 classes compiled with the categorical
    focal cross-entropy."""
    tokens = keras.Input((100,), dtype="int32")
    x = layers.Embedding(20000, 128, mask_zero=True)(tokens)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(256, activation="relu")(x)
    model = keras.Model(tokens, layers.Dense(20, activation="softmax")(x), name="maskedmean")
    model.compile(loss="categorical_focal_crossentropy")
    return model


def tdconv() -> keras.Model:
    """TimeDistributed Conv2D and pooling over 12 frames of 48 x 48 x 3, an
    LSTM over the frames' features, 5 classes."""
    frames = keras.Input((12, 48, 48, 3))
    x = layers.TimeDistributed(layers.Conv2D(32, 3, strides=2, activation="relu"))(frames)
    x = layers.TimeDistributed(layers.Conv2D(64, 3, strides=2, activation="relu"))(x)
    x = layers.TimeDistributed(layers.GlobalAveragePooling2D())(x)
    x = layers.LSTM(64)(x)
    return keras.Model(frames, layers.Dense(5)(x), name="tdconv")


def channelsfirst() -> keras.Model:
    """A CNN on 3 x 64 x 64 images in ``channels_first`` layout: three
    Conv2D with ReLU, max pooling, global average pooling, 10 classes."""
    inputs = keras.Input((3, 64, 64))
    x = inputs
    for filters in (16, 32, 64):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu",
                          data_format="channels_first")(x)
        x = layers.MaxPooling2D(2, data_format="channels_first")(x)
    x = layers.GlobalAveragePooling2D(data_format="channels_first")(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="channelsfirst")


def widedeep() -> keras.Model:
    """Wide and deep: a 100,000-row Embedding of 16 for 8 categorical ids
    (flattened) beside 32 numeric features through Dense 256 and 128, one
    sigmoid output compiled with binary cross-entropy."""
    ids = keras.Input((8,), dtype="int32")
    numeric = keras.Input((32,))
    wide = layers.Flatten()(layers.Embedding(100_000, 16)(ids))
    deep = layers.Dense(256, activation="relu")(numeric)
    deep = layers.Dense(128, activation="relu")(deep)
    out = layers.Dense(1, activation="sigmoid")(layers.Concatenate()([wide, deep]))
    model = keras.Model([ids, numeric], out, name="widedeep")
    model.compile(loss="binary_crossentropy")
    return model


def mhadropout() -> keras.Model:
    """Two transformer encoder blocks over 96 positions of 128 features:
    MultiHeadAttention (4 heads, attention dropout 0.1), residual adds,
    LayerNormalization, a GELU feed-forward of 512; the mean over positions,
    8 classes."""
    inputs = keras.Input((96, 128))
    x = inputs
    for _ in range(2):
        h = layers.MultiHeadAttention(4, 32, dropout=0.1)(x, x)
        x = layers.LayerNormalization()(layers.Add()([x, h]))
        h = layers.Dense(512, activation="gelu")(x)
        x = layers.LayerNormalization()(layers.Add()([x, layers.Dense(128)(h)]))
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, layers.Dense(8)(x), name="mhadropout")


def sepspatial() -> keras.Model:
    """SeparableConv2D blocks on 64 x 64 x 3 images with SpatialDropout2D and
    average pooling, a Maximum of two branches, 10 classes."""
    inputs = keras.Input((64, 64, 3))
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    a = layers.SeparableConv2D(32, 3, padding="same", activation="relu")(x)
    b = layers.SeparableConv2D(32, 5, padding="same", activation="relu")(x)
    x = layers.SpatialDropout2D(0.2)(layers.Maximum()([a, b]))
    x = layers.AveragePooling2D(2)(x)
    x = layers.SeparableConv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="sepspatial")


class _TiedLogits(layers.Layer):
    """The logits of a language model through the transposed embedding table
    (weight tying): reads the Embedding layer's variable."""

    def __init__(self, embedding: layers.Embedding, **kwargs) -> None:
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, x):
        return keras.ops.matmul(x, keras.ops.transpose(self.embedding.embeddings))


def tiedlm() -> keras.Model:
    """A small language model over 64 tokens with its embedding table (8000
    x 128) tied to the output projection: Embedding, a causal Conv1D, a
    Dense GELU, logits through the transposed table. The table's gradient
    sums the gather's rows and the projection's dense product."""
    tokens = keras.Input((64,), dtype="int32")
    embedding = layers.Embedding(8000, 128)
    x = embedding(tokens)
    x = layers.Conv1D(128, 3, padding="causal", activation="relu")(x)
    x = layers.Dense(128, activation="gelu")(x)
    logits = _TiedLogits(embedding)(x)
    model = keras.Model(tokens, logits, name="tiedlm")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def multihead() -> keras.Model:
    """One convolutional trunk on 64 x 64 x 3 images with three heads and
    three losses, weighted: 10-way classes (sparse categorical
    cross-entropy), 4 box coordinates (mean squared error), one objectness
    score (binary cross-entropy)."""
    inputs = keras.Input((64, 64, 3))
    x = inputs
    for filters in (32, 64, 128):
        x = layers.Conv2D(filters, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = {"classes": layers.Dense(10, name="classes")(x),
               "box": layers.Dense(4, name="box")(x),
               "objectness": layers.Dense(1, activation="sigmoid", name="objectness")(x)}
    model = keras.Model(inputs, outputs, name="multihead")
    model.compile(loss={"classes": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        "box": "mse", "objectness": "binary_crossentropy"},
                  loss_weights={"classes": 1.0, "box": 0.5, "objectness": 0.2})
    return model


def grudrop() -> keras.Model:
    """A GRU with recurrent dropout (``reset_after=False``) over 80 steps of
    24 features, returning the sequence, then a Conv1D and 3 classes."""
    inputs = keras.Input((80, 24))
    x = layers.GRU(96, return_sequences=True, recurrent_dropout=0.1, reset_after=False)(inputs)
    x = layers.Conv1D(32, 5, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(3)(layers.GlobalAveragePooling1D()(x)),
                       name="grudrop")


def efficientnetb2() -> keras.Model:
    """keras.applications.EfficientNetB2 (weights=None) on 160 x 160 images."""
    return keras.applications.EfficientNetB2(weights=None, input_shape=(160, 160, 3))



def lstmdrop() -> keras.Model:
    """An LSTM with input and recurrent dropout over a 5000 x 64 Embedding of
    100 tokens, returning the sequence, max-pooled to 4 classes."""
    tokens = keras.Input((100,), dtype="int32")
    x = layers.Embedding(5000, 64)(tokens)
    x = layers.LSTM(128, dropout=0.1, recurrent_dropout=0.2, return_sequences=True)(x)
    model = keras.Model(tokens, layers.Dense(4)(layers.GlobalMaxPooling1D()(x)),
                        name="lstmdrop")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def birnnsum() -> keras.Model:
    """Over 50 steps of 16 features: a bidirectional GRU (``reset_after=False``)
    whose directions are summed, then a bidirectional SimpleRNN returning the
    last state, one regression output (mean absolute error)."""
    inputs = keras.Input((50, 16))
    x = layers.Bidirectional(layers.GRU(64, reset_after=False, return_sequences=True),
                             merge_mode="sum")(inputs)
    x = layers.Bidirectional(layers.SimpleRNN(32))(x)
    model = keras.Model(inputs, layers.Dense(1)(x), name="birnnsum")
    model.compile(loss="mae")
    return model


def cropnet() -> keras.Model:
    """A convolutional autoencoder on 60 x 60 x 3 images: ZeroPadding2D to 64,
    two stride-2 convolutions, a bilinear UpSampling2D, a stride-2
    Conv2DTranspose, Cropping2D back to 60 x 60, compiled with mean squared
    error against the image."""
    inputs = keras.Input((60, 60, 3))
    x = layers.ZeroPadding2D(2)(inputs)
    x = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.UpSampling2D(interpolation="bilinear")(x)
    x = layers.Conv2DTranspose(32, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.Cropping2D(2)(x)
    model = keras.Model(inputs, layers.Conv2D(3, 1)(x), name="cropnet")
    model.compile(loss="mse")
    return model


class _Rotary(layers.Layer):
    """Rotary position embedding of the last axis: pairs of features turned by
    position-dependent angles (sin and cos computed in the call)."""

    def call(self, x):
        half = x.shape[-1] // 2
        positions = keras.ops.arange(x.shape[1], dtype="float32")[:, None]
        freqs = keras.ops.power(10000.0, -keras.ops.arange(half, dtype="float32") / half)
        angles = positions * freqs[None, :]
        sin, cos = keras.ops.sin(angles), keras.ops.cos(angles)
        a, b = x[..., :half], x[..., half:]
        return keras.ops.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def ropeattn() -> keras.Model:
    """A token model of 128 positions: Embedding (6000 x 128), rotary position
    embedding, two blocks of 4-head self-attention with residual adds and
    LayerNormalization and a 256-wide ReLU feed-forward, the mean over
    positions to 20 classes."""
    tokens = keras.Input((128,), dtype="int32")
    x = _Rotary()(layers.Embedding(6000, 128)(tokens))
    for _ in range(2):
        h = layers.MultiHeadAttention(4, 32)(x, x)
        x = layers.LayerNormalization()(layers.Add()([x, h]))
        h = layers.Dense(128)(layers.Dense(256, activation="relu")(x))
        x = layers.LayerNormalization()(layers.Add()([x, h]))
    return keras.Model(tokens, layers.Dense(20)(layers.GlobalAveragePooling1D()(x)),
                       name="ropeattn")


class _TopK(layers.Layer):
    """The k largest values over time of every channel (``top_k`` on the
    transposed sequence), flattened."""

    def __init__(self, k: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.k = k

    def call(self, x):
        values, _ = keras.ops.top_k(keras.ops.transpose(x, (0, 2, 1)), self.k)
        return keras.ops.reshape(values, (-1, x.shape[-1] * self.k))


def topkpool() -> keras.Model:
    """Two Conv1D (64 channels, kernel 7, ELU) over 512 steps of 8 features,
    the 8 largest values of each channel over time, a Dense to 6 classes."""
    inputs = keras.Input((512, 8))
    x = layers.Conv1D(64, 7, padding="same", activation="elu")(inputs)
    x = layers.Conv1D(64, 7, padding="same", activation="elu")(x)
    return keras.Model(inputs, layers.Dense(6)(_TopK(8)(x)), name="topkpool")



def imgattn() -> keras.Model:
    """A stride-2 convolutional stem to 16 x 16 x 64 on 64 x 64 x 3 images,
    then 4-head MultiHeadAttention over both spatial axes at once
    (``attention_axes=(1, 2)``) with a residual add and LayerNormalization,
    global average pooling, 10 classes."""
    inputs = keras.Input((64, 64, 3))
    x = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(inputs)
    x = layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(x)
    h = layers.MultiHeadAttention(4, 16, attention_axes=(1, 2))(x, x)
    x = layers.LayerNormalization()(layers.Add()([x, h]))
    return keras.Model(inputs, layers.Dense(10)(layers.GlobalAveragePooling2D()(x)),
                       name="imgattn")


def dwmult() -> keras.Model:
    """DepthwiseConv2D blocks with ``depth_multiplier=2`` (each doubling the
    channels), BatchNormalization and ReLU6, on 48 x 48 x 8 inputs; a softmax
    over 12 classes compiled with categorical cross-entropy with label
    smoothing (on probabilities: the loss reads the logits underneath)."""
    inputs = keras.Input((48, 48, 8))
    x = inputs
    for _ in range(3):
        x = layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", use_bias=False)(x)
        x = layers.ReLU(6.0)(layers.BatchNormalization()(x))
        x = layers.MaxPooling2D()(x)
    x = layers.Dense(12, activation="softmax")(layers.Flatten()(x))
    model = keras.Model(inputs, x, name="dwmult")
    model.compile(loss=keras.losses.CategoricalCrossentropy(label_smoothing=0.1))
    return model


def rmsmlp() -> keras.Model:
    """An MLP on 512 features: three Dense(1024) blocks with LayerNormalization
    without its offset (``center=False``), swish and AlphaDropout or
    GaussianDropout, a regression of 16 values compiled with the Huber loss."""
    inputs = keras.Input((512,))
    x = inputs
    for i in range(3):
        x = layers.Dense(1024)(x)
        x = layers.Activation("swish")(layers.LayerNormalization(center=False)(x))
        x = layers.AlphaDropout(0.1)(x) if i % 2 == 0 else layers.GaussianDropout(0.1)(x)
    model = keras.Model(inputs, layers.Dense(16)(x), name="rmsmlp")
    model.compile(loss=keras.losses.Huber())
    return model


class _SincConv(layers.Layer):
    """Band-pass filters built at every call from two trainable frequencies
    each (SincNet): the kernel is computed, not stored, then convolved."""

    def __init__(self, filters: int, width: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.filters, self.width = filters, width

    def build(self, input_shape):
        self.low = self.add_weight(shape=(self.filters,), initializer="uniform")
        self.band = self.add_weight(shape=(self.filters,), initializer="uniform")

    def call(self, x):
        t = keras.ops.arange(-(self.width // 2), self.width // 2 + 1, dtype="float32")
        t = keras.ops.where(keras.ops.equal(t, 0.0), 1e-3, t)[:, None]
        low, high = keras.ops.abs(self.low), keras.ops.abs(self.low) + keras.ops.abs(self.band)
        kernel = (keras.ops.sin(high * t) - keras.ops.sin(low * t)) / (3.14159 * t)
        kernel = kernel * keras.ops.hanning(self.width)[:, None]
        return keras.ops.conv(x, kernel[:, None, :], padding="same")


def sincnet() -> keras.Model:
    """A raw-waveform model over 8000 samples: 64 SincNet band-pass filters
    of width 101, max pooling, two Conv1D with LeakyReLU, global average
    pooling, 8 classes."""
    inputs = keras.Input((8000, 1))
    x = layers.MaxPooling1D(4)(layers.Activation("relu")(_SincConv(64, 101)(inputs)))
    x = layers.LeakyReLU()(layers.Conv1D(64, 5, strides=2)(x))
    x = layers.LeakyReLU()(layers.Conv1D(64, 5, strides=2)(x))
    return keras.Model(inputs, layers.Dense(8)(layers.GlobalAveragePooling1D()(x)),
                       name="sincnet")


def cosreg() -> keras.Model:
    """Two inputs (128 and 64 features) through their own Dense towers,
    concatenated, to a 256-wide embedding compiled with the cosine
    similarity loss."""
    a, b = keras.Input((128,)), keras.Input((64,))
    x = layers.Concatenate()([layers.Dense(512, activation="relu")(a),
                              layers.Dense(512, activation="relu")(b)])
    x = layers.Dense(512, activation="tanh")(x)
    model = keras.Model([a, b], layers.Dense(256)(x), name="cosreg")
    model.compile(loss=keras.losses.CosineSimilarity())
    return model



def bf16mixer() -> keras.Model:
    """An MLP-Mixer on 8 x 8 patches of 64 x 64 x 3 images under the
    ``mixed_bfloat16`` policy: two blocks mixing the 64 patches and then
    the 128 channels (Dense layers with GELU, LayerNormalization, residual
    adds), global average pooling, 10 classes in float32."""
    policy = "mixed_bfloat16"
    inputs = keras.Input((64, 64, 3))
    x = layers.Conv2D(128, 8, strides=8, dtype=policy)(inputs)
    x = layers.Reshape((64, 128), dtype=policy)(x)
    for _ in range(2):
        h = layers.LayerNormalization(dtype=policy)(x)
        h = layers.Permute((2, 1), dtype=policy)(h)
        h = layers.Dense(64, dtype=policy)(layers.Dense(128, activation="gelu", dtype=policy)(h))
        x = layers.Add(dtype=policy)([x, layers.Permute((2, 1), dtype=policy)(h)])
        h = layers.LayerNormalization(dtype=policy)(x)
        h = layers.Dense(128, dtype=policy)(layers.Dense(256, activation="gelu", dtype=policy)(h))
        x = layers.Add(dtype=policy)([x, h])
    x = layers.GlobalAveragePooling1D(dtype=policy)(x)
    return keras.Model(inputs, layers.Dense(10, dtype="float32")(x), name="bf16mixer")


def stackedgru() -> keras.Model:
    """Two stacked GRUs over 60 steps of 32 features, the second running
    backwards (``go_backwards=True``), a Dense over its last state to 5
    classes."""
    inputs = keras.Input((60, 32))
    x = layers.GRU(64, return_sequences=True)(inputs)
    x = layers.GRU(64, go_backwards=True)(x)
    return keras.Model(inputs, layers.Dense(5)(x), name="stackedgru")


class _Transform(layers.Layer):
    """Applies a predicted k x k transform to every point: ``x @ t``."""

    def call(self, inputs):
        x, t = inputs
        return keras.ops.matmul(x, t)


def pointnet() -> keras.Model:
    """A PointNet-style classifier over 1024 points of 3 coordinates: a small
    network predicts a 3 x 3 transform applied to every point, then a
    shared MLP (Conv1D with kernel 1: 64, 128, 256 channels with
    BatchNormalization), global max pooling, 8 classes."""
    points = keras.Input((1024, 3))
    t = layers.Conv1D(64, 1, activation="relu")(points)
    t = layers.GlobalMaxPooling1D()(t)
    t = layers.Reshape((3, 3))(layers.Dense(9)(t))
    x = _Transform()([points, t])
    for width in (64, 128, 256):
        x = layers.Activation("relu")(layers.BatchNormalization()(layers.Conv1D(width, 1)(x)))
    return keras.Model(points, layers.Dense(8)(layers.GlobalMaxPooling1D()(x)), name="pointnet")


def hourglass() -> keras.Model:
    """An encoder-decoder on 64 x 64 x 3 images with dilated convolutions,
    average pooling, nearest upsampling, a skip joined by Concatenate and a
    sigmoid gate (``Multiply``), and one output map compiled with binary
    cross-entropy."""
    inputs = keras.Input((64, 64, 3))
    skip = layers.Conv2D(32, 3, padding="same", dilation_rate=2, activation="relu")(inputs)
    x = layers.AveragePooling2D(2)(skip)
    x = layers.Conv2D(64, 3, padding="same", dilation_rate=2, activation="relu")(x)
    x = layers.UpSampling2D()(x)
    gate = layers.Conv2D(32, 1, activation="sigmoid")(x)
    x = layers.Concatenate()([layers.Multiply()([skip, gate]), x])
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    model = keras.Model(inputs, layers.Conv2D(1, 1, activation="sigmoid")(x), name="hourglass")
    model.compile(loss="binary_crossentropy")
    return model


class _FourierMix(layers.Layer):
    """FNet's token mixing: the real part of the 2-D Fourier transform over
    the sequence and the hidden axis."""

    def call(self, x):
        real, _ = keras.ops.fft2((x, keras.ops.zeros_like(x)))
        return real


def fnet() -> keras.Model:
    """FNet over 128 tokens of a 2000-word vocabulary: embeddings of 128, two
    blocks of Fourier mixing and a GELU feed-forward network of 512, each
    added back and layer-normalized; mean over tokens, 4 classes."""
    tokens = keras.Input((128,), dtype="int32")
    x = layers.Embedding(2000, 128)(tokens)
    for _ in range(2):
        x = layers.LayerNormalization()(layers.Add()([x, _FourierMix()(x)]))
        h = layers.Dense(128)(layers.Dense(512, activation="gelu")(x))
        x = layers.LayerNormalization()(layers.Add()([x, h]))
    return keras.Model(tokens, layers.Dense(4)(layers.GlobalAveragePooling1D()(x)),
                       name="fnet")


class _Routing(layers.Layer):
    """Capsules routed by agreement (Sabour et al. 2017): every input
    capsule's prediction for every output capsule through its own matrix,
    three iterations of softmax over the outputs and squashed weighted
    sums."""

    def __init__(self, capsules: int, dim: int, iterations: int = 3, **kwargs):
        super().__init__(**kwargs)
        self.capsules, self.dim, self.iterations = capsules, dim, iterations

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[1], self.capsules, input_shape[2],
                                        self.dim), initializer="glorot_uniform")

    def call(self, u):
        ops = keras.ops
        u_hat = ops.einsum("bid,ijde->bije", u, self.w)
        logits = ops.zeros_like(u_hat[..., 0])
        for i in range(self.iterations):
            c = ops.softmax(logits, axis=2)
            v = _squash(ops.einsum("bij,bije->bje", c, u_hat))
            if i + 1 < self.iterations:
                logits = logits + ops.einsum("bije,bje->bij", u_hat, v)
        return v


def _squash(s, axis: int = -1):
    ops = keras.ops
    norm2 = ops.sum(ops.square(s), axis=axis, keepdims=True)
    return s * norm2 / (1.0 + norm2) / ops.sqrt(norm2 + 1e-7)


def _margin_loss(y_true, y_pred):
    """The capsule network's margin loss on the output capsules' lengths."""
    ops = keras.ops
    present = y_true * ops.square(ops.relu(0.9 - y_pred))
    absent = 0.5 * (1.0 - y_true) * ops.square(ops.relu(y_pred - 0.1))
    return ops.sum(present + absent, axis=-1)


def capsnet() -> keras.Model:
    """A capsule network on 28 x 28 x 1 images: a 9 x 9 Conv2D of 128, 576
    primary capsules of 8 from a stride-2 9 x 9 Conv2D, routing by
    agreement to 10 capsules of 16, their lengths compiled with the margin
    loss (a Python function)."""
    inputs = keras.Input((28, 28, 1))
    x = layers.Conv2D(128, 9, activation="relu")(inputs)
    x = layers.Conv2D(16 * 8, 9, strides=2)(x)
    u = layers.Lambda(lambda t: _squash(keras.ops.reshape(t, (-1, 6 * 6 * 16, 8))))(x)
    v = _Routing(10, 16)(u)
    lengths = layers.Lambda(lambda t: keras.ops.sqrt(
        keras.ops.sum(keras.ops.square(t), axis=-1) + 1e-7))(v)
    model = keras.Model(inputs, lengths, name="capsnet")
    model.compile(loss=_margin_loss)
    return model


def inceptionresnet() -> keras.Model:
    """Keras' InceptionResNetV2, untrained, on 96 x 96 x 3 images, 10
    classes."""
    return keras.applications.InceptionResNetV2(weights=None, input_shape=(96, 96, 3),
                                                classes=10)


def resizer() -> keras.Model:
    """A CNN that upsamples inside: a Conv2D of 16 on 64 x 64 x 3, bilinear
    Resizing to 96 x 96, two stride-2 Conv2D with leaky clipped ReLUs
    (``ReLU(max_value=6, negative_slope=0.1)``), global average pooling, a
    Softmax layer on 10 logits, compiled with the KL divergence."""
    inputs = keras.Input((64, 64, 3))
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = layers.Resizing(96, 96, interpolation="bilinear")(x)
    for filters in (32, 64):
        x = layers.Conv2D(filters, 3, strides=2, padding="same")(x)
        x = layers.ReLU(max_value=6.0, negative_slope=0.1)(x)
    x = layers.Dense(10)(layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, layers.Softmax()(x), name="resizer")
    model.compile(loss="kl_divergence")
    return model


class _PrefixMean(layers.Layer):
    """The running mean over the positions so far (a cumulative sum over the
    sequence axis, divided by the position)."""

    def call(self, x):
        steps = keras.ops.arange(1, keras.ops.shape(x)[1] + 1, dtype=x.dtype)
        return keras.ops.cumsum(x, axis=1) / steps[None, :, None]


def prefixlm() -> keras.Model:
    """A causal language model over 256 tokens of a 1000-word vocabulary
    without attention: embeddings of 256, two blocks mixing tokens by a
    gated running mean (``cumsum``), each added back and layer-normalized;
    next-word logits at every position."""
    tokens = keras.Input((256,), dtype="int32")
    x = layers.Embedding(1000, 256)(tokens)
    for _ in range(2):
        gate = layers.Dense(256, activation="sigmoid")(x)
        mixed = _PrefixMean()(layers.Multiply()([gate, layers.Dense(256)(x)]))
        x = layers.LayerNormalization()(layers.Add()([x, layers.Dense(256)(mixed)]))
    return keras.Model(tokens, layers.Dense(1000)(x), name="prefixlm")


def _squeeze_excite(x, ratio: int = 4):
    """A channel gate (Hu et al. 2018): the map's channel means through a
    bottleneck to one sigmoid a channel, which scales the whole map."""
    channels = x.shape[-1]
    gate = layers.GlobalAveragePooling2D(keepdims=True)(x)
    gate = layers.Dense(channels // ratio, activation="relu")(gate)
    gate = layers.Dense(channels, activation="sigmoid")(gate)
    return layers.Multiply()([x, gate])


def senet() -> keras.Model:
    """A squeeze-and-excitation residual CNN on 64 x 64 x 3: a Conv2D stem
    of 32, three residual blocks (two 3 x 3 convolutions with
    BatchNormalization, a channel gate scaling the second, the second and
    third blocks strided with a 1 x 1 projection), global average pooling,
    10 classes."""
    inputs = keras.Input((64, 64, 3))
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    for filters, stride in ((32, 1), (64, 2), (128, 2)):
        h = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        h = layers.Activation("relu")(layers.BatchNormalization()(h))
        h = layers.BatchNormalization()(layers.Conv2D(filters, 3, padding="same",
                                                      use_bias=False)(h))
        h = _squeeze_excite(h)
        if stride != 1 or x.shape[-1] != filters:
            x = layers.Conv2D(filters, 1, strides=stride)(x)
        x = layers.Activation("relu")(layers.Add()([x, h]))
    return keras.Model(inputs, layers.Dense(10)(layers.GlobalAveragePooling2D()(x)),
                       name="senet")


def siren() -> keras.Model:
    """An implicit image (Sitzmann et al. 2020): 2-D coordinates through four
    Dense layers of 256 with sine activations (``sin(30 x)``), three
    colours out, compiled with the mean squared error."""
    coords = keras.Input((2,))
    x = coords
    for _ in range(4):
        x = layers.Lambda(lambda t: keras.ops.sin(30.0 * t))(layers.Dense(256)(x))
    model = keras.Model(coords, layers.Dense(3)(x), name="siren")
    model.compile(loss="mse")
    return model


class _SwiGLU(layers.Layer):
    """A gated feed-forward block: one Dense to twice the hidden width, split
    in two halves, ``silu(a) * b``, and a Dense back."""

    def __init__(self, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden

    def build(self, input_shape):
        self.up = layers.Dense(2 * self.hidden, use_bias=False)
        self.down = layers.Dense(input_shape[-1], use_bias=False)
        self.up.build(input_shape)
        self.down.build(tuple(input_shape[:-1]) + (self.hidden,))

    def call(self, x):
        a, b = keras.ops.split(self.up(x), 2, axis=-1)
        return self.down(keras.ops.silu(a) * b)


def swiglu() -> keras.Model:
    """A causal transformer over 128 tokens of 128, two pre-norm blocks with
    ``RMSNormalization``, causal four-headed attention and a SwiGLU
    feed-forward of 384, next-token logits over 2000 words at every
    position."""
    tokens = keras.Input((128,), dtype="int32")
    x = layers.Embedding(2000, 128)(tokens)
    for _ in range(2):
        h = layers.RMSNormalization()(x)
        h = layers.MultiHeadAttention(4, 32)(h, h, use_causal_mask=True)
        x = layers.Add()([x, h])
        h = _SwiGLU(384)(layers.RMSNormalization()(x))
        x = layers.Add()([x, h])
    x = layers.RMSNormalization()(x)
    return keras.Model(tokens, layers.Dense(2000)(x), name="swiglu")


def bigruattn() -> keras.Model:
    """A text classifier: embeddings of 64 for 200 tokens, a bidirectional
    GRU of 64 returning sequences, Keras' dot-product ``Attention`` of the
    sequence over itself, concatenated with it, global max pooling, 5
    classes."""
    tokens = keras.Input((200,), dtype="int32")
    x = layers.Embedding(5000, 64)(tokens)
    h = layers.Bidirectional(layers.GRU(64, return_sequences=True))(x)
    a = layers.Attention(use_scale=True)([h, h])
    x = layers.GlobalMaxPooling1D()(layers.Concatenate()([h, a]))
    return keras.Model(tokens, layers.Dense(5)(x), name="bigruattn")


class _Similarity(layers.Layer):
    """The in-batch logits of a dual encoder: every image's embedding against
    every text's, both L2-normalized, times a learned temperature (CLIP)."""

    def build(self, input_shape):
        self.log_scale = self.add_weight(
            shape=(), initializer=keras.initializers.Constant(2.659), name="log_scale")

    def call(self, inputs):
        a, b = inputs
        a = a / keras.ops.norm(a, axis=-1, keepdims=True)
        b = b / keras.ops.norm(b, axis=-1, keepdims=True)
        return keras.ops.matmul(a, keras.ops.transpose(b)) * keras.ops.exp(self.log_scale)

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], input_shape[1][0])


def dualencoder() -> keras.Model:
    """A CLIP-style dual encoder: 48 x 48 images through three strided
    convolutions and 32-token texts through an embedding and a Conv1D, each
    pooled to 128; the batch-by-batch similarity logits under a contrastive
    (sparse, from logits) cross-entropy."""
    image = keras.Input((48, 48, 3))
    x = image
    for filters in (32, 64, 128):
        x = layers.Conv2D(filters, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.Dense(128)(layers.GlobalAveragePooling2D()(x))
    text = keras.Input((32,), dtype="int32")
    t = layers.Embedding(5000, 128)(text)
    t = layers.Conv1D(128, 3, padding="same", activation="gelu")(t)
    t = layers.Dense(128)(layers.GlobalAveragePooling1D()(t))
    model = keras.Model([image, text], _Similarity()([x, t]), name="dualencoder")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _Cross(layers.Layer):
    """A DCN-v2 cross layer: ``x0 * (W x + b) + x``."""

    def build(self, input_shape):
        self.dense = layers.Dense(input_shape[0][-1])
        self.dense.build(input_shape[1])

    def call(self, inputs):
        x0, x = inputs
        return x0 * self.dense(x) + x


def dcn() -> keras.Model:
    """A Deep & Cross Network (v2) for click prediction: 8 categorical
    features embedded in 16 (one shared table of 8000) beside 16 numeric
    ones, three cross layers and a parallel ReLU tower of 512 and 256,
    concatenated into a sigmoid (binary cross-entropy)."""
    cats = keras.Input((8,), dtype="int32")
    nums = keras.Input((16,))
    x0 = layers.Concatenate()([layers.Flatten()(layers.Embedding(8000, 16)(cats)), nums])
    x = x0
    for _ in range(3):
        x = _Cross()([x0, x])
    d = layers.Dense(512, activation="relu")(x0)
    d = layers.Dense(256, activation="relu")(d)
    out = layers.Dense(1, activation="sigmoid")(layers.Concatenate()([x, d]))
    model = keras.Model([cats, nums], out, name="dcn")
    model.compile(loss="binary_crossentropy")
    return model


class _Distillation(layers.Layer):
    """Adds the KL divergence of the student's softened distribution from the
    teacher's (temperature 4) as a loss and passes the student's logits on."""

    def call(self, inputs):
        student, teacher = inputs
        p = keras.ops.softmax(teacher / 4.0)
        log_q = keras.ops.log_softmax(student / 4.0)
        kl = keras.ops.sum(p * (keras.ops.log(p + 1e-7) - log_q), axis=-1)
        self.add_loss(keras.ops.mean(kl))
        return student


def distill() -> keras.Model:
    """Knowledge distillation in one model: a frozen teacher (four 3 x 3
    convolutions of 64 and 128 on 64 x 64 images) and a small strided
    student see the same batch; the student's logits are trained on the
    labels and on the teacher's softened outputs (an added loss)."""
    image = keras.Input((64, 64, 3))
    teacher = keras.Sequential([
        keras.Input((64, 64, 3)),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(128, 3, padding="same", activation="relu"),
        layers.Conv2D(128, 3, padding="same", activation="relu"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(10),
    ], name="teacher")
    teacher.trainable = False
    student = keras.Sequential([
        keras.Input((64, 64, 3)),
        layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
        layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(10),
    ], name="student")
    out = _Distillation()([student(image), teacher(image)])
    model = keras.Model(image, out, name="distill")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _PerSampleDense(layers.Layer):
    """A dense map whose weights come per sample from a hypernetwork:
    ``y_b = x_b W_b`` with ``W_b`` the sample's (d x d) matrix."""

    def call(self, inputs):
        x, w = inputs
        d = x.shape[-1]
        return keras.ops.einsum("bi,bij->bj", x, keras.ops.reshape(w, (-1, d, d)))

    def compute_output_shape(self, input_shape):
        return input_shape[0]


def hypernet() -> keras.Model:
    """A hypernetwork regressor: a 16-feature context makes, through Dense
    256 ReLU, the 64 x 64 weights of each of two per-sample layers applied
    to 64 features (ReLU between), then Dense 10 (mean squared error)."""
    x = keras.Input((64,))
    context = keras.Input((16,))
    h = x
    for _ in range(2):
        w = layers.Dense(256, activation="relu")(context)
        w = layers.Dense(64 * 64)(w)
        h = layers.ReLU()(_PerSampleDense()([h, w]))
    model = keras.Model([x, context], layers.Dense(10)(h), name="hypernet")
    model.compile(loss="mse")
    return model


def focalcnn() -> keras.Model:
    """A convnet on 64 x 64 images with zero padding, LeakyReLU,
    SpatialDropout2D and average pooling, global max pooling into a softmax
    of 10, under a categorical focal cross-entropy with label smoothing
    (one-hot targets)."""
    image = keras.Input((64, 64, 3))
    x = layers.ZeroPadding2D(2)(image)
    x = layers.LeakyReLU(0.1)(layers.Conv2D(32, 5)(x))
    for filters in (64, 128):
        x = layers.SpatialDropout2D(0.2)(x)
        x = layers.AveragePooling2D(2)(x)
        x = layers.LeakyReLU(0.1)(layers.Conv2D(filters, 3, padding="same")(x))
    x = layers.GlobalMaxPooling2D()(x)
    model = keras.Model(image, layers.Dense(10, activation="softmax")(x), name="focalcnn")
    model.compile(loss=keras.losses.CategoricalFocalCrossentropy(label_smoothing=0.1))
    return model



# --- written after the loop sets; measured and estimated once (``--unsampled``) ---


def gcn() -> keras.Model:
    """A graph convolutional network on dense graphs of 256 nodes: node
    features (64) and an adjacency matrix (256 x 256) per sample, three
    layers ``relu(Dense(A @ H))`` of 128 units (``Dot`` over the nodes),
    mean pooling over the nodes, 10 classes."""
    features = keras.Input((256, 64))
    adjacency = keras.Input((256, 256))
    h = features
    for _ in range(3):
        h = layers.Dense(128, activation="relu")(layers.Dot(axes=(2, 1))([adjacency, h]))
    h = layers.GlobalAveragePooling1D()(h)
    return keras.Model([features, adjacency], layers.Dense(10)(h), name="gcn")


def conformer() -> keras.Model:
    """Two Conformer blocks over 256 frames of 80 features projected to
    144: half-step feed-forward modules (LayerNormalization, Dense 576
    swish, Dense 144, halved, residual), 4-head self-attention, a
    convolution module (a gated linear unit from two Dense layers, a
    15-wide DepthwiseConv1D, BatchNormalization, swish, Dense), a final
    LayerNormalization; average pooling over time, 10 classes."""
    frames = keras.Input((256, 80))
    x = layers.Dense(144)(frames)

    def half_ffn(x):
        h = layers.LayerNormalization()(x)
        h = layers.Dense(144)(layers.Dense(576, activation="swish")(h))
        return layers.Add()([x, layers.Rescaling(0.5)(h)])

    for _ in range(2):
        x = half_ffn(x)
        h = layers.LayerNormalization()(x)
        x = layers.Add()([x, layers.MultiHeadAttention(4, 36)(h, h)])
        h = layers.LayerNormalization()(x)
        h = layers.Multiply()([layers.Dense(144)(h), layers.Dense(144, activation="sigmoid")(h)])
        h = layers.DepthwiseConv1D(15, padding="same")(h)
        h = layers.Activation("swish")(layers.BatchNormalization()(h))
        x = layers.Add()([x, layers.Dense(144)(h)])
        x = layers.LayerNormalization()(half_ffn(x))
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(frames, layers.Dense(10)(x), name="conformer")


def _attention_gate(skip, gate, filters: int):
    """An attention U-Net's gate: 1 x 1 projections of the skip and the
    gate added, ReLU, a 1 x 1 convolution into one sigmoid channel that
    scales the skip."""
    f = layers.ReLU()(layers.Add()([layers.Conv2D(filters, 1)(skip),
                                    layers.Conv2D(filters, 1)(gate)]))
    return layers.Multiply()([skip, layers.Conv2D(1, 1, activation="sigmoid")(f)])


def attnunet() -> keras.Model:
    """An attention U-Net on 64 x 64 x 3 images: three encoder stages (two
    3 x 3 ReLU convolutions of 32, 64, 128 filters, max pooling), a
    256-filter bottleneck, decoder stages that upsample by Conv2DTranspose,
    gate the skip (``_attention_gate``) and concatenate, a 1 x 1 sigmoid
    mask out under binary cross-entropy."""
    image = keras.Input((64, 64, 3))
    x, skips = image, []
    for filters in (32, 64, 128):
        for _ in range(2):
            x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        skips.append(x)
        x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(256, 3, padding="same", activation="relu")(x)
    for filters, skip in zip((128, 64, 32), reversed(skips)):
        x = layers.Conv2DTranspose(filters, 2, strides=2)(x)
        x = layers.Concatenate()([_attention_gate(skip, x, filters // 2), x])
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    model = keras.Model(image, layers.Conv2D(1, 1, activation="sigmoid")(x), name="attnunet")
    model.compile(loss="binary_crossentropy")
    return model


def _mixture_nll(y_true, y_pred):
    """Negative log-likelihood of 2-D targets (the targets' first two
    columns) under a mixture of 8 diagonal Gaussians whose logits, means
    and log standard deviations are the 40 outputs."""
    from keras import ops

    target = ops.expand_dims(y_true[:, :2], 1)
    logits = y_pred[:, :8]
    means = ops.reshape(y_pred[:, 8:24], (-1, 8, 2))
    log_sigma = ops.reshape(y_pred[:, 24:40], (-1, 8, 2))
    z = (target - means) * ops.exp(-log_sigma)
    log_prob = -0.5 * ops.sum(z * z, axis=-1) - ops.sum(log_sigma, axis=-1)
    return -ops.logsumexp(ops.log_softmax(logits, axis=-1) + log_prob, axis=-1)


def mdn() -> keras.Model:
    """A mixture density network: 16 features through three Dense 256 tanh
    layers to the 40 parameters of a mixture of 8 2-D Gaussians, trained
    on their negative log-likelihood (``_mixture_nll``)."""
    x = inputs = keras.Input((16,))
    for _ in range(3):
        x = layers.Dense(256, activation="tanh")(x)
    model = keras.Model(inputs, layers.Dense(40)(x), name="mdn")
    model.compile(loss=_mixture_nll)
    return model


def fcnseg() -> keras.Model:
    """A fully convolutional segmenter on 128 x 128 x 3 images: a strided
    3 x 3 convolution of 32 filters, two 3 x 3 of 64, a 1 x 1 head into 3
    classes at 64 x 64, bilinear upsampling back to 128 x 128, per-pixel
    softmax (sparse categorical cross-entropy over the pixels)."""
    image = keras.Input((128, 128, 3))
    x = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(image)
    for _ in range(2):
        x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.UpSampling2D(2, interpolation="bilinear")(layers.Conv2D(3, 1)(x))
    return keras.Model(image, layers.Softmax()(x), name="fcnseg")


def accumcnn() -> keras.Model:
    """A small convnet on 32 x 32 x 3 images (two 3 x 3 convolutions of 64
    and 128 filters with max pooling, Dense 256, 10 classes), trained with
    an optimizer that accumulates gradients over steps."""
    image = keras.Input((32, 32, 3))
    x = layers.MaxPooling2D()(layers.Conv2D(64, 3, padding="same", activation="relu")(image))
    x = layers.MaxPooling2D()(layers.Conv2D(128, 3, padding="same", activation="relu")(x))
    x = layers.Dense(256, activation="relu")(layers.Flatten()(x))
    return keras.Model(image, layers.Dense(10)(x), name="accumcnn")

# --- keras.io's tutorials, as they write their models ---------------------------


def xceptionsmall() -> keras.Model:
    """keras.io's "Image classification from scratch" as it writes it:
    RandomFlip and RandomRotation, Rescaling, a small Xception-like network
    (separable convolutions of 256, 512 and 728 with strided 1 x 1
    residuals, then 1024), dropout and one logit; 128 x 128 inputs (the
    tutorial's 180 x 180), binary cross-entropy from logits."""
    inputs = keras.Input((128, 128, 3))
    x = layers.RandomFlip("horizontal")(inputs)
    x = layers.RandomRotation(0.1)(x)
    x = layers.Rescaling(1.0 / 255)(x)
    x = layers.Conv2D(128, 3, strides=2, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    previous = x
    for size in [256, 512, 728]:
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(size, 1, strides=2, padding="same")(previous)
        x = layers.add([x, residual])
        previous = x
    x = layers.SeparableConv2D(1024, 3, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.25)(x)
    m = keras.Model(inputs, layers.Dense(1, activation=None)(x), name="xceptionsmall")
    m.compile(loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return m


class _TokenAndPositionEmbedding(layers.Layer):
    """keras.io's token and position embedding, as it writes it."""

    def __init__(self, maxlen, vocab_size, embed_dim, **kw):
        super().__init__(**kw)
        self.token_emb = layers.Embedding(vocab_size, embed_dim)
        self.pos_emb = layers.Embedding(maxlen, embed_dim)

    def call(self, x):
        maxlen = keras.ops.shape(x)[-1]
        positions = keras.ops.arange(0, maxlen, 1)
        return self.token_emb(x) + self.pos_emb(positions)


class _TransformerBlock(layers.Layer):
    """keras.io's transformer block (post-norm, ReLU feed-forward), as it
    writes it."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kw):
        super().__init__(**kw)
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"),
                                     layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)


def texttransformer() -> keras.Model:
    """keras.io's "Text classification with Transformer" as it writes it:
    200 tokens given as floats, a vocabulary of 20,000, embeddings of 32, one
    block of two heads (key size 32) and a feed-forward of 32, pooling,
    dropout, Dense 20 and a softmax of two."""
    inputs = layers.Input(shape=(200,))
    x = _TokenAndPositionEmbedding(200, 20000, 32)(inputs)
    x = _TransformerBlock(32, 2, 32)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.1)(x)
    x = layers.Dense(20, activation="relu")(x)
    x = layers.Dropout(0.1)(x)
    m = keras.Model(inputs, layers.Dense(2, activation="softmax")(x), name="texttransformer")
    m.compile(loss="sparse_categorical_crossentropy")
    return m


def tstransformer() -> keras.Model:
    """keras.io's "Timeseries classification with a Transformer model" as it
    writes it: four pre-activation encoder blocks (four heads of key size
    256 with attention dropout, a Conv1D feed-forward of 4) over 500 steps of
    one feature, pooling over the channels, Dense 128 and a softmax of two."""
    inputs = keras.Input((500, 1))
    x = inputs
    for _ in range(4):
        h = layers.MultiHeadAttention(key_dim=256, num_heads=4, dropout=0.25)(x, x)
        h = layers.Dropout(0.25)(h)
        h = layers.LayerNormalization(epsilon=1e-6)(h)
        res = h + x
        h = layers.Conv1D(filters=4, kernel_size=1, activation="relu")(res)
        h = layers.Dropout(0.25)(h)
        h = layers.Conv1D(filters=1, kernel_size=1)(h)
        h = layers.LayerNormalization(epsilon=1e-6)(h)
        x = h + res
    x = layers.GlobalAveragePooling1D(data_format="channels_last")(x)
    x = layers.Dense(128, activation="relu")(x)
    x = layers.Dropout(0.4)(x)
    m = keras.Model(inputs, layers.Dense(2, activation="softmax")(x), name="tstransformer")
    m.compile(loss="sparse_categorical_crossentropy")
    return m


ZOO = {f.__name__: f for f in (mlp, cnn, resnet50, mobilenetv2, vgg16, densenet121, lstm,
                               transformer)}
HELD_OUT = {f.__name__: f for f in (unet, gru, vit, separable)}
UNSEEN = {f.__name__: f for f in (convnext, efficientnetb0, mobilenetv3small, xception,
                                  nasnetmobile, textcnn, autoencoder, groupnorm)}
FRESH = {f.__name__: f for f in (twotower, bilstm, timedistributed, skipnet, subclassed, causal,
                                 strided)}
NOVEL = {f.__name__: f for f in (wavenet, resnet50v2, inceptionv3, vae, gqa, regularized,
                                 convlstm)}
UNTRIED = {f.__name__: f for f in (mixer, generator, video, siamese, efficientnetv2b0, resnext,
                                   crossattn, highway)}
BLIND = {f.__name__: f for f in (deeplab, crnn, moe, selunet, additive, upconv1d, mobilenet,
                                 augmented)}
UNMET = {f.__name__: f for f in (film, linattn, bow, convmixer)}
UNHEARD = {f.__name__: f for f in (axialattn, emacnn, sepconv1d, permutemlp, denoiser)}
UNVISITED = {f.__name__: f for f in (unet3d, ncf, spectral, tokenattn, poissonnet)}
UNKNOWN = {f.__name__: f for f in (fp16cnn, unrolled, maskednet, nested, constrained)}
UNCHARTED = {f.__name__: f for f in (regnetlike, mobilenetv3large, convlstm1d, maskedmean,
                                     tdconv)}
UNTRODDEN = {f.__name__: f for f in (channelsfirst, widedeep, mhadropout, sepspatial)}
UNPLANNED = {f.__name__: f for f in (tiedlm, multihead, grudrop, efficientnetb2)}
UNFORESEEN = {f.__name__: f for f in (lstmdrop, birnnsum, cropnet, ropeattn, topkpool)}
UNEXPECTED = {f.__name__: f for f in (imgattn, dwmult, rmsmlp, sincnet, cosreg)}
UNANTICIPATED = {f.__name__: f for f in (bf16mixer, stackedgru, pointnet, hourglass)}
UNMAPPED = {f.__name__: f for f in (fnet, capsnet, inceptionresnet, resizer, prefixlm)}
UNSURVEYED = {f.__name__: f for f in (senet, siren, swiglu, bigruattn)}
UNEXAMINED = {f.__name__: f for f in (dualencoder, dcn, distill, hypernet, focalcnn)}
KERAS_IO = {f.__name__: f for f in (xceptionsmall, texttransformer, tstransformer)}
VOLUMES = {f.__name__: f for f in (video, unet3d, c3d, ae3d, r3d)}


# --- large models, estimated without building their weights ------------------


def decoder(blocks: int = 32, width: int = 4096, heads: int = 32, hidden: int = 11008,
            vocab: int = 32000, seq: int = 2048, name: str = "decoder") -> keras.Model:
    """A LLaMA-style decoder written with Keras layers: token embedding, then
    per block RMS-normalized causal self-attention and a SwiGLU feed-forward
    network, each with a residual add; a final norm and the vocabulary head.
    The defaults give about 6.7 billion parameters."""
    tokens = keras.Input((seq,), dtype="int32")
    x = layers.Embedding(vocab, width)(tokens)
    for _ in range(blocks):
        h = layers.RMSNormalization()(x)
        h = layers.MultiHeadAttention(heads, width // heads, use_bias=False)(
            h, h, use_causal_mask=True)
        x = layers.Add()([x, h])
        h = layers.RMSNormalization()(x)
        gate = layers.Dense(hidden, activation="silu", use_bias=False)(h)
        up = layers.Dense(hidden, use_bias=False)(h)
        h = layers.Dense(width, use_bias=False)(layers.Multiply()([gate, up]))
        x = layers.Add()([x, h])
    x = layers.RMSNormalization()(x)
    logits = layers.Dense(vocab, use_bias=False)(x)
    return keras.Model(tokens, logits, name=name)


def decoder_7b() -> keras.Model:
    return decoder()


def mlp_gelu() -> keras.Model:
    """Four [Dense 2048 gelu, Dense 512] blocks on 1024 inputs (the recomputation
    case of FINDINGS)."""
    x = keras.Input((1024,))
    h = x
    for _ in range(4):
        h = layers.Dense(2048, activation="gelu")(h)
        h = layers.Dense(512)(h)
    return keras.Model(x, layers.Dense(10)(h), name="mlp_gelu")


def _classifier(x, h, name: str) -> keras.Model:
    """``h`` into Dense 10, compiled with sparse cross-entropy from logits."""
    model = keras.Model(x, layers.Dense(10)(h), name=name)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _LinearScan(layers.Layer):
    """A linear state-space recurrence: ``h_t = sigmoid(a) * h_{t-1} + u_t``
    over the projected input ``u``, by ``keras.ops.scan`` over time."""

    def build(self, input_shape):
        self.a = self.add_weight(shape=(input_shape[-1],), initializer="zeros")
        self.proj = layers.Dense(input_shape[-1])
        self.proj.build(input_shape)

    def call(self, x):
        u = keras.ops.transpose(self.proj(x), (1, 0, 2))
        decay = keras.ops.sigmoid(self.a)

        def step(h, u_t):
            h = decay * h + u_t
            return h, h

        _, hs = keras.ops.scan(step, keras.ops.zeros_like(u[0]), u)
        return keras.ops.transpose(hs, (1, 0, 2))


def ssmscan() -> keras.Model:
    """A state-space sequence classifier: Dense 64 over 128 x 32 inputs, two
    residual ``_LinearScan`` blocks with LayerNormalization, average
    pooling, Dense 10 (sparse cross-entropy from logits)."""
    x = keras.Input((128, 32))
    h = layers.Dense(64)(x)
    for _ in range(2):
        h = layers.LayerNormalization()(h + _LinearScan()(h))
    return _classifier(x, layers.GlobalAveragePooling1D()(h), "ssmscan")


class _Refine(layers.Layer):
    """Four fixed-point iterations ``h = tanh(h W + x)`` from zeros, by
    ``keras.ops.fori_loop``."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], input_shape[-1]),
                                 initializer="glorot_uniform")

    def call(self, x):
        return keras.ops.fori_loop(
            0, 4, lambda i, h: keras.ops.tanh(keras.ops.matmul(h, self.w) + x),
            keras.ops.zeros_like(x))


def refine() -> keras.Model:
    """Dense 512 ReLU over 256 inputs, a ``_Refine`` layer, Dense 10 (sparse
    cross-entropy from logits)."""
    x = keras.Input((256,))
    return _classifier(x, _Refine()(layers.Dense(512, activation="relu")(x)), "refine")


class _TanhScan(layers.Layer):
    """An Elman recurrence written by hand: ``h_t = tanh(h_{t-1} W + u_t)``
    over the projected input, by ``keras.ops.scan`` over time."""

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.u = self.add_weight(shape=(input_shape[-1], self.units),
                                 initializer="glorot_uniform")
        self.w = self.add_weight(shape=(self.units, self.units), initializer="orthogonal")

    def call(self, x):
        u = keras.ops.transpose(keras.ops.matmul(x, self.u), (1, 0, 2))

        def step(h, u_t):
            h = keras.ops.tanh(keras.ops.matmul(h, self.w) + u_t)
            return h, h

        last, _ = keras.ops.scan(step, keras.ops.zeros_like(u[0]), u)
        return last


def rnnscan() -> keras.Model:
    """A ``_TanhScan`` of 256 units over 96 steps of 48 features, its last
    state into Dense 10 (sparse cross-entropy from logits)."""
    x = keras.Input((96, 48))
    return _classifier(x, _TanhScan(256)(x), "rnnscan")


class _Newton(layers.Layer):
    """Six Newton steps towards the square root of its input,
    ``y = (y + x / y) / 2`` from ones, by ``keras.ops.while_loop``."""

    def call(self, x):
        _, y = keras.ops.while_loop(
            lambda i, y: i < 6, lambda i, y: (i + 1, 0.5 * (y + x / y)),
            (0, keras.ops.ones_like(x)))
        return y


def newtonsqrt() -> keras.Model:
    """Dense 1024 softplus over 512 inputs, shifted by one, a ``_Newton``
    layer, Dense 1024 ReLU, Dense 10 (sparse cross-entropy from logits)."""
    x = keras.Input((512,))
    h = layers.Dense(1024, activation="softplus")(x)
    h = _Newton()(layers.Lambda(lambda t: t + 1.0)(h))
    return _classifier(x, layers.Dense(1024, activation="relu")(h), "newtonsqrt")


class _ChunkSum(layers.Layer):
    """The sum over eight column chunks of ``relu(chunk W)``, one chunk per
    iteration of ``keras.ops.fori_loop`` (a dynamic slice of the input)."""

    def build(self, input_shape):
        self.chunk = input_shape[-1] // 8
        self.w = self.add_weight(shape=(self.chunk, 512), initializer="glorot_uniform")

    def call(self, x):
        def body(i, acc):
            part = keras.ops.slice(x, (0, i * self.chunk), (keras.ops.shape(x)[0], self.chunk))
            return acc + keras.ops.relu(keras.ops.matmul(part, self.w))

        return keras.ops.fori_loop(
            0, 8, body, keras.ops.zeros((keras.ops.shape(x)[0], 512), dtype=x.dtype))


def chunksum() -> keras.Model:
    """Dense 1024 ReLU over 256 inputs, a ``_ChunkSum`` layer, Dense 10
    (sparse cross-entropy from logits)."""
    x = keras.Input((256,))
    return _classifier(x, _ChunkSum()(layers.Dense(1024, activation="relu")(x)), "chunksum")


class _TwinScan(layers.Layer):
    """A reversed ``keras.ops.scan`` with two carries: a leaky sum and its
    running maximum, both returned per step."""

    def call(self, x):
        xt = keras.ops.transpose(x, (1, 0, 2))

        def step(carry, u):
            a, b = carry
            a = a * 0.9 + u
            b = keras.ops.maximum(b, a)
            return (a, b), (a, b)

        zeros = keras.ops.zeros_like(xt[0])
        (_, last), (ya, yb) = keras.ops.scan(step, (zeros, zeros), xt, reverse=True)
        return keras.ops.transpose(ya + yb, (1, 0, 2)) + last[:, None, :]


def twinscan() -> keras.Model:
    """Dense 64 over 96 x 32 inputs, a ``_TwinScan``, average pooling,
    Dense 10 (sparse cross-entropy from logits)."""
    x = keras.Input((96, 32))
    h = _TwinScan()(layers.Dense(64)(x))
    return _classifier(x, layers.GlobalAveragePooling1D()(h), "twinscan")


class _NestedLoops(layers.Layer):
    """Three outer ``fori_loop`` iterations of two inner ones, ``h =
    tanh(h W) + x``."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], input_shape[-1]),
                                 initializer="glorot_uniform")

    def call(self, x):
        def outer(i, h):
            return keras.ops.fori_loop(
                0, 2, lambda j, g: keras.ops.tanh(keras.ops.matmul(g, self.w)) + x, h)

        return keras.ops.fori_loop(0, 3, outer, x)


def nestedloops() -> keras.Model:
    """Dense 512 over 256 inputs, a ``_NestedLoops`` layer, Dense 10 (sparse
    cross-entropy from logits)."""
    x = keras.Input((256,))
    return _classifier(x, _NestedLoops()(layers.Dense(512)(x)), "nestedloops")


def refine_bf16() -> keras.Model:
    """``refine`` with every layer under mixed_bfloat16, Dense 1024 wide."""
    x = keras.Input((256,))
    h = layers.Dense(1024, activation="relu", dtype="mixed_bfloat16")(x)
    h = _Refine(dtype="mixed_bfloat16")(h)
    model = keras.Model(x, layers.Dense(10, dtype="mixed_bfloat16")(h), name="refine_bf16")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def scanfirst() -> keras.Model:
    """A ``_TanhScan`` of 128 units straight on 64 x 32 inputs (no input
    gradient), its last state into Dense 10."""
    x = keras.Input((64, 32))
    return _classifier(x, _TanhScan(128)(x), "scanfirst")


def named(name: str) -> keras.Model:
    """The model a benchmark's ``--model`` names: a builder of this module,
    or ``module:function`` (``tests.models:gated_mlp``)."""
    import importlib
    import sys

    module, _, func = name.rpartition(":")
    return getattr(importlib.import_module(module) if module else sys.modules[__name__], func)()
