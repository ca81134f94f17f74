"""The order TensorFlow's executor gives a layer's two gradients."""

import re

import keras
import numpy as np
from keras import layers
from tensorflow.core.framework import graph_pb2

import keras_memscope as memscope
from keras_memscope import executor


def _node(graph_def, name, *inputs):
    node = graph_def.node.add()
    node.name, node.op = name, "NoOp"
    node.input.extend(inputs)
    return node


def test_the_constructor_adds_a_node_once_its_inputs_are_in_lowest_index_first():
    graph_def = graph_pb2.GraphDef()
    _node(graph_def, "late", "b")  # listed first, needs b
    _node(graph_def, "a")
    _node(graph_def, "b", "a")
    _node(graph_def, "c", "^a")
    order = [n.name for n in executor.constructor_order(list(graph_def.node))]
    # b and c are ready once a is in: b (index 2) goes first; that makes late
    # ready, and late (index 0) goes before c (3)
    assert order == ["a", "b", "late", "c"]


def _small_model():
    inputs = keras.Input((16, 16, 3))
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(32, activation="relu")(x)
    x = layers.Dense(32, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(10)(x))


def _runtime_flags(model, batch, optimizer):
    """The flags of the graph TensorFlow's runtime builds for a real step,
    each weight named as its resource argument is."""
    from benchmarks.executor_order import runtime_graph

    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  jit_compile=False)
    graph = runtime_graph(model, np.zeros((batch, 16, 16, 3), "float32"),
                          np.zeros((batch,), "int32"))
    arguments = {n.name: n.name for n in graph.node if n.op == "_Arg"}
    return executor._pairs(list(graph.node), arguments)


def test_the_traced_order_is_the_one_a_real_step_runs():
    """The flags read off grappler's rewrite of the traced step, without
    running it, equal those of the graph the runtime builds for a real step."""
    model = _small_model()
    traced = executor.weight_gradient_first(model, 32, "sgd")
    assert traced is not None
    runtime = _runtime_flags(model, 32, keras.optimizers.SGD())
    # the runtime names a variable's argument after the op that read it first
    # (its capture's placeholder), lowercased: match them by the kernel's layer
    by_layer = {}
    for name, flags in runtime.items():
        layer = re.search(r"(conv2d(_\d+)?|dense(_\d+)?)_\d+_(convolution|cast)", name)
        by_layer[layer.group(1)] = tuple(flags)
    ours = {}
    for layer in model.layers:
        kernel = getattr(layer, "kernel", None)
        if kernel is not None and id(kernel) in traced:
            ours[layer.name] = traced[id(kernel)]
    # every kernel but the first convolution's (no input gradient) has a pair
    assert len(ours) == 5
    assert ours == by_layer


def test_a_model_with_its_own_train_step_keeps_the_default_order():
    class Own(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    inputs = keras.Input((8,))
    model = Own(inputs, layers.Dense(4)(layers.Dense(8)(inputs)))
    assert executor.weight_gradient_first(model, 4, "sgd") is None
    est = memscope.estimate(model, 4, optimizer="sgd", device="cpu", method="graph")
    assert not any("grappler's rewrite of the training step" in n for n in est.notes)


def test_the_estimate_says_how_many_weight_gradients_go_first():
    est = memscope.estimate(_small_model(), 32, optimizer="sgd", device="cpu",
                            method="graph")
    note = next(n for n in est.notes if "grappler's rewrite of the training step" in n)
    assert re.search(r"\d+ of 5 weight gradients start first", note)


def test_reading_the_order_takes_no_names_from_the_user():
    keras.utils.clear_session()
    first = keras.optimizers.SGD().name
    keras.utils.clear_session()
    model = _small_model()
    # the fresh SGD it builds and traces takes no name: the user's next SGD
    # is named as the first after a clear session
    assert executor.weight_gradient_first(model, 8, "sgd") is not None
    assert keras.optimizers.SGD().name == first


def test_the_order_is_the_same_at_any_batch():
    model = _small_model()
    # (traced afresh each time, no cache)
    at = {b: executor._weight_gradient_first(model, b, keras.optimizers.SGD(), None)
          for b in (1, 32)}
    assert at[1] is not None and at[1] == at[32]


def test_the_order_is_read_once_per_model_and_optimizer(monkeypatch):
    model = _small_model()
    calls = []
    real = executor._weight_gradient_first
    monkeypatch.setattr(executor, "_weight_gradient_first",
                        lambda *a: calls.append(a[1:]) or real(*a))
    first = executor.weight_gradient_first(model, 8, keras.optimizers.SGD())
    # another instance of the same configuration (another name): read already
    assert executor.weight_gradient_first(model, 8, keras.optimizers.SGD()) == first
    # another batch: the same order, read already
    assert executor.weight_gradient_first(model, 16, keras.optimizers.SGD()) == first
    executor.weight_gradient_first(model, 16, keras.optimizers.Adam())
    model.layers[1].trainable = False  # another set of trainable weights
    executor.weight_gradient_first(model, 16, keras.optimizers.Adam())
    assert [(c[0], type(c[1]).__name__) for c in calls] == [(8, "SGD"), (16, "Adam"),
                                                             (16, "Adam")]
