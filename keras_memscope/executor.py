"""Which of a layer's two gradients TensorFlow's CPU executor starts first.

A convolution's or matrix product's output gradient makes two ops ready at
once: its input gradient and its weight gradient. TensorFlow's executor
(``ExecutorState::ScheduleReady``) walks the finished op's out-edges in order,
keeps the last ready op on its own thread and hands the others to the thread
pool, which pushes them on the front of that thread's queue: the thread takes
them back newest first, the other thread steals the oldest. So where the other
thread is busy, the op that comes later in the out-edges runs first; with the
weight gradient later, the weight gradient runs before the input gradient
(``op_timeline`` of a separable net: every pair in the order this predicts).

Which comes later is fixed by the graph the runtime builds: grappler's rewrite
of the training step and the order ``GraphConstructor`` adds its nodes in
(each node when its inputs are in, the lowest index first), and differs from
layer to layer (a SENet's eight convolutions: five one way, three the other).
:func:`weight_gradient_first` rebuilds that graph without running a step:
Keras' training step traced for the batch, with a fresh optimizer of the same
configuration, given to grappler as the runtime gives a function (resource
arguments with their variables' shapes, return values and stateful ops kept),
its nodes put in the constructor's order. Against the graph the runtime
builds for a real step (``run_metadata``'s optimized function graph) it gives
the same order for 188 of 189 pairs of ten zoo configurations (``python -m
benchmarks.executor_order``; the one other: a separable convolution's
pointwise pair under Adafactor).
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import math
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from .devices import _cpu_available_bytes
from .units import dtype_bytes

logger = logging.getLogger(__name__)

#: Gradient ops that write a convolution's or product's input gradient and
#: read its weight at this input position.
_INPUT_GRADIENTS = {"Conv2DBackpropInput": 1, "Conv3DBackpropInputV2": 1,
                    "DepthwiseConv2dNativeBackpropInput": 1}
#: Gradient ops that write a convolution's weight gradient.
_WEIGHT_GRADIENTS = {"Conv2DBackpropFilter", "Conv3DBackpropFilterV2",
                     "DepthwiseConv2dNativeBackpropFilter"}
_PRODUCTS = {"MatMul", "BatchMatMulV2", "BatchMatMulV3"}
#: Ops between a variable's resource and the tensor a gradient op reads.
_READS = {"ReadVariableOp", "Cast", "Identity", "Reshape"}
#: The share of the machine's available memory a fresh optimizer's variables
#: may take while the step is traced; above it the order is not read.
MEMORY_SHARE = 0.25


def weight_gradient_first(model: Any, batch_size: int, optimizer: Any, *, input_shape: Any = None
                          ) -> dict[int, tuple[tuple[bool, bool | None], ...]] | None:
    """For each kernel that a convolution or matrix product reads (``id`` of
    the Keras variable, as ``WeightUse.key``), one ``(kernel, bias)`` pair per
    call, calls in the forward pass's order: whether the kernel's gradient
    comes after the input gradient among the output gradient's readers (so
    runs first where the other thread is busy), and whether the bias's
    (``BiasAddGrad``) does (None: no bias gradient reads it). None where the
    step cannot be traced here (a custom ``train_step``, an optimizer that
    cannot be copied, not enough memory for its variables, a step whose
    gradients are inside function calls, anything TensorFlow refuses): the
    caller then keeps its own rule."""
    from keras.src.backend.common import global_state

    key = _cache_key(model, optimizer, input_shape)
    try:
        cached = _ORDERS.get(model, {})
    except TypeError:  # (a model that cannot be weakly referenced)
        cached = {}
    if key is not None and key in cached:
        return cached[key]
    # (the fresh optimizer and loss tracker take no names from the user's)
    names = global_state.get_global_attribute("object_name_uids")
    kept = dict(names) if names is not None else None
    try:
        found = _weight_gradient_first(model, batch_size, optimizer, input_shape)
    except Exception as exc:  # the order is a refinement: never fail the estimate
        logger.info("executor order not read (%s: %s)", type(exc).__name__, exc)
        found = None
    finally:
        names = global_state.get_global_attribute("object_name_uids")
        if names is not None:
            names.clear()
            names.update(kept or {})
    if key is not None:
        with contextlib.suppress(TypeError):
            _ORDERS.setdefault(model, {})[key] = found
    return found


#: What was read, by model (weakly) and ``_cache_key``: an estimate of the
#: same model and optimizer again, at any batch, traces nothing (the order
#: does not change with the batch: the same at batches 1, B and 3B for
#: fourteen zoo configurations, ``python -m benchmarks.executor_order
#: --batches``).
_ORDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cache_key(model: Any, optimizer: Any, input_shape: Any) -> str | None:
    """The optimizer's configuration, the input shape and which variables
    are trainable now, as text; None where the optimizer's configuration
    cannot be written. Not the batch: the graph grappler rewrites is the same
    at any batch but for its shapes, and so is the order of its nodes."""
    import keras

    try:
        config = (optimizer if isinstance(optimizer, str)
                  else keras.optimizers.serialize(optimizer))
        if isinstance(config, dict) and isinstance(config.get("config"), dict):
            # (an optimizer's name says nothing of its step: each new one differs)
            config = {**config, "config": {k: v for k, v in config["config"].items()
                                           if k != "name"}}
        return json.dumps([config, repr(input_shape),
                           [id(v) for v in model.trainable_weights]],
                          sort_keys=True, default=repr)
    except Exception:
        return None


def _fresh_optimizer(optimizer: Any) -> Any:
    import keras

    if isinstance(optimizer, str):
        return keras.optimizers.get(optimizer)
    return keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))


def _step_graph(model: Any, batch_size: int, optimizer: Any, input_shape: Any,
                before_trace: Callable[[list[Any]], None] = lambda variables: None) -> Any:
    """Keras' training step (``TensorFlowTrainer.train_step``) for ``model``,
    traced for a batch of ``batch_size``: the concrete function, and the
    variables it may read (``before_trace`` gets them first)."""
    import keras
    import tensorflow as tf
    from keras.src.trainers.compile_utils import CompileLoss

    from .measure import synthetic_batch

    x, y, loss = synthetic_batch(model, 1, input_shape=input_shape)

    def spec(a: Any) -> Any:
        return tf.TensorSpec((batch_size, *a.shape[1:]), a.dtype)

    specs = tf.nest.map_structure(spec, (x, y))
    from .graph import has_deferred_variables, weightless

    opt = _fresh_optimizer(optimizer)
    weights = model.trainable_weights
    if has_deferred_variables(model):
        # a model built without its weights: the trace gets handles that hold
        # nothing (_deferred_handles), and the optimizer's variables wait too
        before_trace(list(model.variables))
        with weightless():
            opt.build(weights)
    else:
        slot_bytes = 3 * sum(math.prod(v.shape) * dtype_bytes(v.dtype) for v in weights)
        available = _cpu_available_bytes()
        if available is not None and slot_bytes > MEMORY_SHARE * available:
            raise MemoryError(f"a fresh optimizer's variables (up to {slot_bytes} bytes) "
                              f"would take more than a quarter of the {available} available")
        opt.build(weights)
    compile_loss = CompileLoss(loss, output_names=getattr(model, "output_names", None))
    tracker = keras.metrics.Mean(name="loss")

    def one_step(data: Any) -> Any:
        xs, ys = data
        with tf.GradientTape() as tape:
            y_pred = model(xs, training=True)
            value = compile_loss(ys, y_pred)
            if model.losses:
                value = value + tf.add_n([tf.cast(v, value.dtype) for v in model.losses])
            tracker.update_state(value, sample_weight=tf.shape(tf.nest.flatten(xs)[0])[0])
            value = opt.scale_loss(value)
        gradients = tape.gradient(value, weights)
        opt.apply_gradients(zip(gradients, weights))
        return tracker.result()

    variables = list(model.variables) + list(opt.variables) + list(tracker.variables)
    before_trace(variables)
    return (tf.function(one_step, reduce_retracing=True).get_concrete_function(specs),
            variables)


def _runtime_graph_def(function: Any, variables: list[Any]) -> tuple[Any, dict[str, int]]:
    """The GraphDef grappler makes of ``function``'s graph as the runtime
    optimizes a function it instantiates, and which resource argument is
    which variable (``id``)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer

    from .tfgraph import CPU_DEVICE

    graph = function.graph
    handles: dict[int, Any] = {}
    for v in variables:
        for owner in (v, getattr(v, "_value", None)):
            handle = getattr(owner, "handle", None)
            if handle is not None:
                handles[id(handle)] = v
    resource_of: dict[str, Any] = {}
    for external, internal in graph.captures:
        if internal.dtype == tf.resource and id(external) in handles:
            resource_of[internal.op.name] = handles[id(external)]
    graph_def = graph.as_graph_def(add_shapes=True)
    for node in graph_def.node:
        node.device = CPU_DEVICE
        variable = resource_of.get(node.name)
        if variable is not None:
            # a function's resource argument, with its variable's shape (what
            # lets grappler fold the shapes its gradient ops read)
            node.op = "_Arg"
            node.attr["T"].type = node.attr["dtype"].type
            for key in ("dtype", "shape"):
                if key in node.attr:
                    del node.attr[key]
            node.attr["_handle_dtypes"].list.type.append(
                tf.as_dtype(variable.dtype).as_datatype_enum)
            node.attr["_handle_shapes"].list.shape.add().CopyFrom(
                tf.TensorShape(variable.shape).as_proto())
    returns = []
    for k, t in enumerate(graph.outputs):
        node = graph_def.node.add()
        node.name, node.op, node.device = f"memscope_retval_{k}", "_Retval", CPU_DEVICE
        node.input.append(t.op.name if t.value_index == 0 else t.name)
        node.attr["T"].type = t.dtype.as_datatype_enum
        node.attr["index"].i = k
        returns.append(node.name)
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=graph)
    meta.graph_def.CopyFrom(graph_def)
    # the runtime's fetches are the return values; its kept ops, the stateful
    # ones the function must run
    meta.collection_def["train_op"].node_list.value.extend(
        returns + [op.name for op in graph.control_outputs])
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.min_graph_nodes = -1
    out = tf_optimizer.OptimizeGraph(config, meta)
    return out, {name: id(v) for name, v in resource_of.items()}


def constructor_order(nodes: list[Any]) -> list[Any]:
    """``nodes`` (NodeDefs) in the order TensorFlow's ``GraphConstructor``
    adds them to a graph: a node once all its inputs are in, the lowest
    index first. Each node's out-edges are made in this order."""
    index = {n.name: i for i, n in enumerate(nodes)}
    pending = [0] * len(nodes)
    readers: dict[int, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for name in node.input:
            src = index.get(name.lstrip("^").split(":")[0])
            if src is not None:
                pending[i] += 1
                readers[src].append(i)
    ready = [i for i, p in enumerate(pending) if p == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in readers[i]:
            pending[j] -= 1
            if pending[j] == 0:
                heapq.heappush(ready, j)
    return order


def _pairs(nodes: list[Any], variable_of: dict[str, int]
           ) -> dict[int, list[tuple[bool, bool | None]]]:
    """For each weight (``id``), the flag of each gradient pair that reads it,
    its calls in the forward pass's order."""
    by_name = {n.name: n for n in nodes}

    def source(name: str) -> str:
        return name.lstrip("^").split(":")[0]

    def weight(name: str) -> int | None:
        node = by_name.get(source(name))
        for _ in range(8):
            if node is None:
                return None
            if node.name in variable_of:
                return variable_of[node.name]
            if node.op not in _READS or not node.input:
                return None
            node = by_name.get(source(node.input[0]))
        return None

    def call_at(weight_gradient: Any, key: int, default: int) -> int:
        """Where the forward op of this weight gradient's call is: the op
        outside the gradient that reads the same activation and the weight
        (a shared layer's calls in the forward pass's order)."""
        activations = {name for name in weight_gradient.input[:2]
                       if weight(name) is None}
        for position, node in enumerate(nodes):
            if ("gradient_tape" not in node.name and activations & set(node.input)
                    and any(weight(name) == key for name in node.input)):
                return position
        return default

    readers: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for position, node in enumerate(nodes):
        for name in node.input:
            if not name.startswith("^"):
                readers[name if ":" in name and not name.endswith(":0")
                        else source(name)].append((position, node))
    flags: dict[int, list[tuple[int, tuple[bool, bool | None]]]] = defaultdict(list)
    for read in readers.values():
        inputs, weights, biases = [], [], []
        for position, node in read:
            if "gradient_tape" not in node.name:
                continue
            if node.op in _INPUT_GRADIENTS:
                key = weight(node.input[_INPUT_GRADIENTS[node.op]])
                if key is not None:
                    inputs.append((position, key))
            elif node.op in _WEIGHT_GRADIENTS:
                weights.append(position)
            elif node.op == "BiasAddGrad":
                biases.append(position)
            elif node.op in _PRODUCTS:
                keys = [weight(name) for name in node.input[:2]]
                key = next((k for k in keys if k is not None), None)
                if key is not None:
                    inputs.append((position, key))
                else:
                    weights.append(position)
        if len(inputs) == 1 and len(weights) == 1:
            (at, key), = inputs
            bias = biases[0] > at if len(biases) == 1 else None
            flags[key].append((call_at(nodes[weights[0]], key, at), (weights[0] > at, bias)))
    return {key: [flag for _, flag in sorted(found)] for key, found in flags.items()}


def _weight_gradient_first(model: Any, batch_size: int, optimizer: Any, input_shape: Any
                           ) -> dict[int, tuple[tuple[bool, bool | None], ...]]:
    if type(model).train_step is not _keras_train_step():
        raise TypeError("the model has its own train_step")
    with _deferred_handles() as deferred:
        function, variables = _step_graph(model, batch_size, optimizer, input_shape,
                                          before_trace=deferred)
        graph_def, variable_of = _runtime_graph_def(function, variables)
    nodes = constructor_order(list(graph_def.node))
    found = _pairs(nodes, variable_of)
    if not found:
        # (a model whose step calls functions, a recurrent layer's loop among
        # them: the runtime inlines their bodies before grappler, this does not)
        raise LookupError("no layer's two gradients found in the step's graph")
    return {key: tuple(flags) for key, flags in found.items()}


@contextlib.contextmanager
def _deferred_handles() -> Iterator[Callable[[list[Any]], None]]:
    """Variables made without memory (``graph.weightless``) traced as
    resource handles that hold nothing (TensorFlow's ``UninitializedVariable``)
    while the step is traced, and deferred again after: the graph is the one
    the same model with its weights would have. The function this yields
    takes the step's variables before the trace."""
    from tensorflow.python.ops import resource_variable_ops

    swapped: list[Any] = []

    def swap(variables: list[Any]) -> None:
        for v in variables:
            if getattr(v, "_value", 0) is None:
                v._value = resource_variable_ops.UninitializedVariable(
                    shape=tuple(v.shape), dtype=v.dtype, trainable=bool(v.trainable))
                swapped.append(v)

    try:
        yield swap
    finally:
        for v in swapped:
            v._value = None


def _keras_train_step() -> Any:
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer.train_step


