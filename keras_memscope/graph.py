"""The only code that walks Keras internals: a model -> layer-call records.

The model is called once, symbolically and in training mode, inside a
TensorFlow graph at the requested batch size, while a hook on
``keras.Operation.__call__`` records every layer and operation call with its
input and output tensors. That one route covers Sequential, Functional (nested
models, shared layers, several inputs and outputs, raw ``keras.ops`` nodes)
and subclassed models alike. Calls of layers that a cost rule knows are kept
whole; other containers are opened up into their own calls. Tensors made
between recorded calls by plain TensorFlow code (``x + y`` inside a subclassed
``call``) become "glue" calls whose inputs are found by walking the
TensorFlow graph back to recorded tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .ir import WeightUse
from .units import dtype_bytes, num_elements

logger = logging.getLogger(__name__)

Shape = tuple[int, ...]

#: TensorFlow ops whose gradient reads none of their inputs.
FREE_GRADIENT_TF_OPS = frozenset({
    "AddV2", "Add", "Sub", "Neg", "Cast", "Identity", "Reshape", "Pad", "PadV2",
    "ConcatV2", "StridedSlice", "Slice", "Transpose", "ExpandDims", "Squeeze",
    "Tile", "BiasAdd", "Pack", "Unpack", "Split", "SplitV", "Mean", "Sum",
    "AddN", "Shape", "Const", "Placeholder", "ReadVariableOp", "BroadcastTo",
    "GatherV2", "Reverse", "ReverseV2",
})


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A tensor of the traced step with its concrete shape."""

    id: int
    shape: Shape
    dtype: str

    @property
    def nbytes(self) -> int:
        return num_elements(self.shape) * dtype_bytes(self.dtype)


@dataclasses.dataclass(frozen=True)
class LoopKeeps:
    """What one iteration of a layer's forward loop keeps for its gradient:
    the sizes of the new buffers it pushes whatever gradients are wanted
    (``always``), and those it pushes beyond them when the gradient with
    respect to the layer's input is wanted too (``for_input``: a GRU's
    kernel slices, which only the input gradient reads).
    ``tfgraph.loop_iteration_bytes`` reads them off TensorFlow's loop."""

    always: tuple[int, ...]
    for_input: tuple[int, ...] = ()


@dataclasses.dataclass
class CallRecord:
    """One call of a layer or Keras operation, as the rules see it.

    ``layer`` is the Keras object (untyped on purpose: it stays inside
    ``graph.py`` and ``rules/``). ``glue`` calls stand for TensorFlow code between
    recorded calls; ``tf_ops`` then names the op types they ran, and
    ``constants`` the ``(key, bytes)`` of what grappler folds of them into
    constants held between steps (``tfgraph.folded_constants``: an
    attention's causal mask).
    """

    index: int
    name: str
    layer: Any
    class_name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    kwargs: dict[str, Any]
    weights: tuple[WeightUse, ...]
    shared: bool = False
    glue: bool = False
    tf_ops: tuple[str, ...] = ()
    args: tuple[Any, ...] = ()
    input_names: tuple[str, ...] = ()
    constants: tuple[tuple[str, int], ...] = ()
    #: per forward loop the call runs, in order, what one iteration keeps
    #: for the gradient, where its graph was read; empty: the rule's count
    loops: tuple[LoopKeeps, ...] = ()

    @property
    def params(self) -> int:
        return sum(_weight_elements(w) for w in self.weights)


@dataclasses.dataclass
class ModelGraph:
    """Every recorded call of one training-mode forward pass, in order."""

    model_name: str
    batch_size: int
    calls: list[CallRecord]
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    variables: tuple[WeightUse, ...]
    unattributed: tuple[WeightUse, ...]
    compute_dtype: str
    #: calls left out: they compute what an earlier call computed
    merged: tuple[str, ...] = ()
    #: tensors whose first dimension TensorFlow could not infer (a lookup
    #: layer's ragged tokens padded to a length), taken as the batch
    assumed_batch: tuple[str, ...] = ()


def _weight_elements(w: WeightUse) -> int:
    return w.nbytes // dtype_bytes(w.dtype)


# --- inputs -----------------------------------------------------------------


def _is_shape(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(
        d is None or isinstance(d, int) for d in value
    )


def _normalise_input_shapes(input_shape: Any, n_inputs: int) -> list[Shape | None]:
    if input_shape is None:
        return [None] * n_inputs
    if _is_shape(input_shape):
        shapes = [tuple(input_shape)]
    elif isinstance(input_shape, (tuple, list)) and all(_is_shape(s) for s in input_shape):
        shapes = [tuple(s) for s in input_shape]
    else:
        raise TypeError(
            f"input_shape must be a shape without the batch dimension, such as "
            f"(224, 224, 3), or a list of such shapes, one per model input; got "
            f"{input_shape!r}"
        )
    if len(shapes) != n_inputs:
        raise ValueError(
            f"input_shape gives {len(shapes)} shape(s) but the model has "
            f"{n_inputs} input(s); pass one shape per input, in order"
        )
    return shapes  # type: ignore[return-value]


def _model_input_specs(model: Any, input_shape: Any) -> list[tuple[str, tuple[Any, ...], str]]:
    """(name, shape with None batch, dtype) of each model input, building if needed."""
    import keras

    inputs = _symbolic_inputs(model)
    if inputs is None:
        if not model.built:
            if input_shape is None:
                raise ValueError(
                    f"model {model.name!r} is not built and its input shape is "
                    "unknown: pass input_shape=(...) without the batch dimension, "
                    "e.g. estimate(model, batch_size=32, input_shape=(28, 28, 1)), "
                    "or build the model first (keras.Input or model.build)"
                )
            shapes = _normalise_input_shapes(input_shape, _count_shapes(input_shape))
            try:
                if len(shapes) == 1:
                    model.build((None, *shapes[0]))  # type: ignore[misc]
                else:
                    model.build([(None, *s) for s in shapes])  # type: ignore[misc]
            except Exception as exc:
                raise ValueError(
                    f"could not build model {model.name!r} for input_shape="
                    f"{input_shape!r}: {exc}"
                ) from exc
            inputs = _symbolic_inputs(model)
        if inputs is None:
            shapes_dict = getattr(model, "_build_shapes_dict", None) or {}
            found = [s for s in shapes_dict.values() if s is not None]
            if not found:
                raise ValueError(
                    f"cannot tell the input shape of model {model.name!r}: pass "
                    "input_shape=(...) without the batch dimension"
                )
            specs = []
            for i, shape in enumerate(found):
                if _is_shape(shape):
                    specs.append((f"input_{i}", tuple(shape), _input_dtype(model)))
                else:  # several shapes under one argument
                    for j, s in enumerate(shape):
                        specs.append((f"input_{i}_{j}", tuple(s), _input_dtype(model)))
            return specs
    specs = []
    for i, t in enumerate(inputs):
        name = getattr(t, "name", None) or f"input_{i}"
        specs.append((name, tuple(t.shape), keras.backend.standardize_dtype(t.dtype)))
    return specs


def _count_shapes(input_shape: Any) -> int:
    return 1 if _is_shape(input_shape) else len(input_shape)


def _input_dtype(model: Any) -> str:
    dtype = getattr(model, "input_dtype", None) or "float32"
    return str(dtype)


def _symbolic_inputs(model: Any) -> list[Any] | None:
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    if not inputs:
        return None
    return list(inputs)


def concrete_input_shapes(
    model: Any, batch_size: int, input_shape: Any = None
) -> list[tuple[str, Shape, str]]:
    """(name, concrete shape, dtype) of every model input at ``batch_size``."""
    specs = _model_input_specs(model, input_shape)
    given = _normalise_input_shapes(input_shape, len(specs))
    out = []
    for (name, shape, dtype), override in zip(specs, given):
        dims = list(shape[1:])
        if override is not None:
            if len(override) != len(dims):
                raise ValueError(
                    f"input_shape {tuple(override)} has {len(override)} dimension(s) "
                    f"but model input {name!r} has shape {tuple(shape)} "
                    f"({len(dims)} without the batch)"
                )
            for i, (have, want) in enumerate(zip(dims, override)):
                if have is None:
                    dims[i] = want
                elif want is not None and want != have:
                    raise ValueError(
                        f"input_shape {tuple(override)} disagrees with model input "
                        f"{name!r} of shape {tuple(shape)} at dimension {i + 1}"
                    )
        unknown = [i + 1 for i, d in enumerate(dims) if d is None]
        if unknown:
            raise ValueError(
                f"model input {name!r} has shape {tuple(shape)} with unknown "
                f"dimension(s) at position(s) {unknown}: pass input_shape=... "
                f"giving every dimension after the batch, e.g. input_shape="
                f"{tuple(d if d is not None else 128 for d in dims)}"
            )
        out.append((name, (batch_size, *(int(d) for d in dims)), dtype))
    return out


# --- tracing ----------------------------------------------------------------


@dataclasses.dataclass
class _Frame:
    op: Any
    parent: _Frame | None
    children: list[_Frame] = dataclasses.field(default_factory=list)
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    outputs: Any = None


@contextlib.contextmanager
def _recording(root: _Frame) -> Iterator[None]:
    from keras.src.ops.operation import Operation

    original = Operation.__call__
    stack = [root]

    def hooked(op: Any, *args: Any, **kwargs: Any) -> Any:
        frame = _Frame(op=op, parent=stack[-1], args=args, kwargs=kwargs)
        stack[-1].children.append(frame)
        stack.append(frame)
        try:
            frame.outputs = original(op, *args, **kwargs)
        finally:
            stack.pop()
        return frame.outputs

    Operation.__call__ = hooked  # type: ignore[method-assign]
    try:
        yield
    finally:
        Operation.__call__ = original  # type: ignore[method-assign]


def _flat_tensors(value: Any) -> list[Any]:
    import tensorflow as tf
    from keras import tree

    try:
        flat = tree.flatten(value)
    except Exception:
        flat = [value]
    return [t for t in flat if isinstance(t, tf.Tensor)]


def _variables_of(op: Any) -> list[Any]:
    try:
        return list(op.weights)
    except Exception:
        return []


class _Tracer:
    def __init__(
        self,
        model: Any,
        is_leaf: Callable[[Any], bool],
        whole_if_computing: bool = False,
    ) -> None:
        self.model = model
        self.is_leaf = is_leaf
        self.whole_if_computing = whole_if_computing
        self.ids: dict[str, int] = {}
        self.infos: dict[int, TensorInfo] = {}
        self.calls: list[CallRecord] = []
        self.seen_ops: set[int] = set()
        self.claimed: dict[int, str] = {}
        self.var_use: dict[int, WeightUse] = {}
        self.keep: list[Any] = []
        self.graph: Any = None
        self.call_counts: dict[str, int] = {}
        self.batch_size = 0
        self.assumed_batch: list[str] = []

    # tensors
    def info(self, t: Any) -> TensorInfo:
        import keras

        key = t.name
        if key not in self.ids:
            tid = len(self.ids) + 1
            self.ids[key] = tid
            shape = tuple(int(d) if d is not None else -1 for d in t.shape)
            if shape and shape[0] < 0 and self.batch_size and min(shape[1:], default=0) >= 0:
                # every other dimension known: the batch's, as TensorFlow
                # loses it where ragged tokens are padded (TextVectorization)
                shape = (self.batch_size, *shape[1:])
                self.assumed_batch.append(t.op.name)
            if any(d < 0 for d in shape):
                raise ValueError(
                    f"tensor {key} has a dimension TensorFlow could not infer "
                    f"({t.shape}); pass input_shape=... so every dimension is known"
                )
            self.infos[tid] = TensorInfo(tid, shape, keras.backend.standardize_dtype(t.dtype))
            self.keep.append(t)
        return self.infos[self.ids[key]]

    def known(self, t: Any) -> bool:
        return t.name in self.ids

    # weights
    def weight_uses(self, variables: Sequence[Any], owner: Any) -> tuple[WeightUse, ...]:
        import keras

        uses = []
        names: dict[str, int] = {}
        for v in variables:
            names[v.name] = names.get(v.name, 0) + 1
        for v in variables:
            key = id(v)
            if key not in self.var_use:
                self.keep.append(v)
                dtype = keras.backend.standardize_dtype(v.dtype)
                nbytes = num_elements(tuple(v.shape)) * dtype_bytes(dtype)
                self.var_use[key] = WeightUse(key, v.name, nbytes, bool(v.trainable), dtype,
                                              tuple(int(d) for d in v.shape),
                                              getattr(v, "path", v.name))
            use = self.var_use[key]
            name = v.name if names[v.name] == 1 else v.path
            uses.append(dataclasses.replace(use, name=name))
        return tuple(uses)

    # frames
    def walk(self, frame: _Frame, prefix: str) -> None:
        for child in frame.children:
            if not _in_graph(child.outputs, self.graph):
                continue  # a scratch trace Keras ran to build something
            op = child.op
            name = getattr(op, "name", None) or type(op).__name__
            path = f"{prefix}{name}"
            if type(op).__name__ == "InputLayer":
                continue
            if self.is_leaf(op) or not child.children or (
                    self.whole_if_computing and self.computes_between(child)):
                self.add_call(child, path)
            else:
                self.walk(child, path + "/")
                own = self.own_variables(op)
                if own:
                    self.add_own_weights(op, path, own)

    def computes_between(self, frame: _Frame) -> bool:
        """Whether a layer (not a model) computes, in its own ``call``, with
        TensorFlow ops whose gradient reads what they were given, between the
        layers it calls (grouped-query attention between its projections, a
        gate between two Dense layers). Such a layer is best traced whole:
        opened, those ops would be one glue call, which keeps no intermediate
        (the attention's probabilities, the key repeated for every head) and
        no gradient temporaries. A layer around a recurrent loop is opened
        as before (its loop is sized by its rule, which a whole trace would
        not reach), and so is one around a model: traced as one call, a
        whole network's gradient is scheduled as one layer's (a MobileNetV2
        inside a layer that scales its output: 511 MiB against 402-417
        measured, 462 opened, 424 for the network alone)."""
        import keras

        op = frame.op
        if isinstance(op, keras.Model) or not isinstance(op, keras.layers.Layer):
            return False
        children = [c for c in frame.children if _in_graph(c.outputs, self.graph)]
        stack = list(children)
        while stack:
            f = stack.pop()
            if isinstance(f.op, (keras.layers.RNN, keras.Model)):
                return False
            stack.extend(f.children)
        boundary = {t.name for t in _flat_tensors((frame.args, frame.kwargs))}
        for c in children:  # what they made (a Dropout of rate 0 returns its input)
            given = {t.name for t in _flat_tensors((c.args, c.kwargs))}
            boundary.update(t.name for t in _flat_tensors(c.outputs) if t.name not in given)
        pending = [t for c in children for t in _flat_tensors((c.args, c.kwargs))]
        pending += _flat_tensors(frame.outputs)
        seen: set[str] = set()
        while pending:
            t = pending.pop()
            if t.name in seen or t.name in boundary or self.known(t):
                continue
            seen.add(t.name)
            if t.op.type not in FREE_GRADIENT_TF_OPS and t.op.type != "VarHandleOp":
                return True
            pending.extend(t.op.inputs)
        return False

    def own_variables(self, op: Any) -> list[Any]:
        """Variables of a container that no sub-layer owns."""
        mine = _variables_of(op)
        nested = set()
        for layer in getattr(op, "_flatten_layers", lambda **k: [])(include_self=False):
            nested.update(id(v) for v in _variables_of(layer))
        return [v for v in mine if id(v) not in nested and id(v) not in self.claimed]

    def add_own_weights(self, op: Any, path: str, variables: list[Any]) -> None:
        for v in variables:
            self.claimed[id(v)] = path
        # Recorded as a call with no tensors so that parameters add up; the
        # raw ops that read them are glue calls.
        self.calls.append(
            CallRecord(
                index=len(self.calls),
                name=f"{path}:own",
                layer=op,
                class_name=type(op).__name__,
                inputs=(),
                outputs=(),
                kwargs={},
                weights=self.weight_uses(variables, op),
                glue=True,
                tf_ops=("own weights",),
            )
        )

    def add_call(self, frame: _Frame, path: str) -> None:
        op = frame.op
        in_tensors = _flat_tensors((frame.args, frame.kwargs))
        out_tensors = _flat_tensors(frame.outputs)
        for t in in_tensors:
            if not self.known(t):
                self.add_glue(t, path)
        inputs = tuple(self.info(t) for t in in_tensors)
        count = self.call_counts.get(path, 0)
        self.call_counts[path] = count + 1
        name = path if count == 0 else f"{path}:{count}"
        shared = id(op) in self.seen_ops
        self.seen_ops.add(id(op))
        outputs = []
        for t in out_tensors:
            if self.known(t):
                # The call returned a tensor it was given (or one seen before):
                # give the output its own identity, a view of the same buffer.
                outputs.append(TensorInfo(-1, tuple(int(d) for d in t.shape),
                                          self.info(t).dtype))
            else:
                outputs.append(self.info(t))
        variables = _variables_of(op)
        for v in variables:
            self.claimed.setdefault(id(v), name)
        self.calls.append(
            CallRecord(
                index=len(self.calls),
                name=name,
                layer=op,
                class_name=type(op).__name__,
                inputs=inputs,
                outputs=tuple(outputs),
                kwargs=dict(frame.kwargs),
                weights=self.weight_uses(variables, op),
                shared=shared,
                args=tuple(frame.args),
                input_names=tuple(t.name for t in in_tensors),
            )
        )

    def add_glue(self, t: Any, path: str) -> None:
        """Record the TensorFlow ops that made ``t`` from recorded tensors."""
        from .tfgraph import folded_constants

        sources: list[Any] = []
        op_types: list[str] = []
        ran: dict[str, Any] = {}
        seen: set[str] = set()
        stack = [t]
        while stack:
            cur = stack.pop()
            if cur.name in seen:
                continue
            seen.add(cur.name)
            if self.known(cur) and cur is not t:
                sources.append(cur)
                continue
            tf_op = cur.op
            op_types.append(tf_op.type)
            ran[tf_op.name] = tf_op
            if tf_op.type in ("Placeholder", "ReadVariableOp", "Const", "VarHandleOp"):
                continue
            stack.extend(tf_op.inputs)
        for s in sources:
            if not self.known(s):
                self.add_glue(s, path)
        inputs = tuple(self.info(s) for s in sources)
        out = self.info(t)
        parent = path.rsplit("/", 1)[0] if "/" in path else self.model.name
        self.calls.append(
            CallRecord(
                index=len(self.calls),
                name=f"{parent}/<tf:{t.op.type}>",
                layer=None,
                class_name="TensorFlowOps",
                inputs=inputs,
                outputs=(out,),
                kwargs={},
                weights=(),
                glue=True,
                tf_ops=tuple(dict.fromkeys(op_types)),
                # (ops are made in order: their ids are a topological order)
                constants=folded_constants(sorted(ran.values(), key=lambda o: o._id), (t,)),
            )
        )


def _in_graph(outputs: Any, graph: Any) -> bool:
    tensors = _flat_tensors(outputs)
    if not tensors:
        return True
    return any(_graph_chain_contains(t.graph, graph) for t in tensors)


def _graph_chain_contains(g: Any, target: Any) -> bool:
    while g is not None:
        if g is target:
            return True
        g = getattr(g, "outer_graph", None)
    return False


def trace_model(
    model: Any,
    batch_size: int,
    *,
    input_shape: Any = None,
    is_leaf: Callable[[Any], bool] = lambda op: False,
    whole_if_computing: bool = False,
) -> ModelGraph:
    """Record every layer call of one training-mode forward pass of ``model``.

    Layers for which ``is_leaf`` holds are recorded whole, other containers
    opened into their calls; with ``whole_if_computing`` (the graph method,
    which traces each call) also the layers that compute between their
    sub-layers (:meth:`_Tracer.computes_between`)."""
    import keras
    import tensorflow as tf
    from keras import tree

    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "keras_memscope traces models with the TensorFlow backend; set "
            "KERAS_BACKEND=tensorflow before importing keras"
        )
    specs = concrete_input_shapes(model, batch_size, input_shape)
    tf_specs = [tf.TensorSpec(shape, dtype, name=_safe_name(name, i))
                for i, (name, shape, dtype) in enumerate(specs)]
    structure = getattr(model, "_inputs_struct", None)

    def forward(*xs: Any) -> Any:
        if structure is not None and len(xs) == len(tree.flatten(structure)):
            args = tree.pack_sequence_as(structure, list(xs))
        else:
            args = xs[0] if len(xs) == 1 else list(xs)
        return model(args, training=True)

    root = _Frame(op=None, parent=None)
    tracer = _Tracer(model, is_leaf, whole_if_computing)
    tracer.batch_size = batch_size
    # A model built weightlessly has deferred variables: trace it inside a
    # stateless scope, where reading them gives symbolic initial values.
    scope = weightless() if has_deferred_variables(model) else contextlib.nullcontext()
    with scope, _recording(root):
        concrete = tf.function(forward, autograph=False).get_concrete_function(*tf_specs)
    graph = concrete.graph
    tracer.graph = graph
    placeholders = [t for t in graph.inputs if t.dtype != tf.resource][: len(specs)]
    model_inputs = tuple(tracer.info(t) for t in placeholders)
    tops = [f for f in root.children if f.op is model and _in_graph(f.outputs, graph)]
    top = tops[-1] if tops else None
    if top is None:
        raise RuntimeError(f"calling model {model.name!r} recorded no operations")
    if tracer.is_leaf(top.op):
        tracer.add_call(top, model.name)
    else:
        tracer.walk(top, "")
    out_tensors = _flat_tensors(top.outputs)
    for t in out_tensors:
        if not tracer.known(t):
            tracer.add_glue(t, model.name)
    outputs = tuple(tracer.info(t) for t in out_tensors)

    calls, outputs, merged = _without_duplicates(tracer, graph, outputs)
    every = tracer.weight_uses(list(model.weights), model)
    unattributed = tuple(w for w in every if w.key not in tracer.claimed)
    for c in tracer.calls:
        if c.layer is not None:
            c.layer = c.layer  # keep untyped Keras objects here
    graph_obj = ModelGraph(
        model_name=model.name,
        batch_size=batch_size,
        calls=calls,
        inputs=model_inputs,
        outputs=outputs,
        variables=every,
        unattributed=unattributed,
        compute_dtype=str(getattr(model, "compute_dtype", "float32")),
        merged=merged,
        assumed_batch=tuple(tracer.assumed_batch),
    )
    graph_obj._keep = tracer.keep  # type: ignore[attr-defined]
    return graph_obj


def op_attributes(op: Any) -> tuple[tuple[str, bytes], ...]:
    """An op's attributes, serialized, less TensorFlow's internal ones: two
    ops of one type with the same attributes compute the same function."""
    return tuple(sorted((k, v.SerializeToString(deterministic=True))
                        for k, v in op.node_def.attr.items() if not k.startswith("_")))


def _op_signatures(graph: Any) -> dict[str, str]:
    """Each tensor of ``graph`` -> the first tensor computed the same way: the
    same op type and attributes on the same inputs (recursively), no side
    effects. Grappler's arithmetic optimizer merges such ops in the function
    TensorFlow runs (NASNet applies a separate ReLU layer to one tensor in
    every branch of a cell: one tensor is kept, not five)."""
    first: dict[tuple, str] = {}  # signature -> op name
    canon: dict[str, str] = {}  # op name -> its first equivalent
    tensors: dict[str, str] = {}
    for op in graph.get_operations():
        if op._is_stateful or op.type in ("Placeholder", "VarHandleOp") or op.control_inputs:
            canon[op.name] = op.name
        else:
            sig = (op.type, op_attributes(op),
                   tuple((canon.get(t.op.name, t.op.name), t.value_index) for t in op.inputs))
            canon[op.name] = first.setdefault(sig, op.name)
        for t in op.outputs:
            tensors[t.name] = f"{canon[op.name]}:{t.value_index}"
    return tensors


def _without_duplicates(tracer: _Tracer, graph: Any, outputs: tuple[TensorInfo, ...]
                        ) -> tuple[list[CallRecord], tuple[TensorInfo, ...], tuple[str, ...]]:
    """The calls less those without weights that compute what an earlier call
    computed (the same ops on the same tensors, ``_op_signatures``), the
    model's outputs, and the names of the calls left out: later calls read
    the earlier call's outputs instead."""
    same = _op_signatures(graph)
    name_of = {tid: name for name, tid in tracer.ids.items()}
    alias: dict[int, int] = {}

    def resolved(ts: tuple[TensorInfo, ...]) -> tuple[TensorInfo, ...]:
        return tuple(tracer.infos[alias[t.id]] if t.id in alias else t for t in ts)

    calls: list[CallRecord] = []
    merged: list[str] = []
    for c in tracer.calls:
        inputs = resolved(c.inputs)
        if inputs != c.inputs:
            c = dataclasses.replace(c, inputs=inputs)
        if not c.glue and not c.weights and c.outputs and all(t.id > 0 for t in c.outputs):
            firsts = [tracer.ids.get(same.get(name_of[t.id], "")) for t in c.outputs]
            if all(f is not None and f != t.id for f, t in zip(firsts, c.outputs)):
                alias.update({t.id: alias.get(f, f) for f, t in zip(firsts, c.outputs)})
                merged.append(c.name)
                continue
        calls.append(c)
    return calls, resolved(outputs), tuple(merged)


def has_deferred_variables(model: Any) -> bool:
    """True when some variable of ``model`` was created without memory."""
    return any(getattr(v, "_value", 0) is None for v in model.weights)


def _safe_name(name: str, i: int) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in "_." else "_" for ch in str(name))
    if not cleaned or not cleaned[0].isalpha():
        cleaned = f"input_{i}_{cleaned}"
    return cleaned


@contextlib.contextmanager
def weightless() -> Iterator[None]:
    """Create Keras variables without allocating them, and leave it that way.

    Variables made inside ``keras.StatelessScope(initialize_variables=False)``
    wait in a global list that the next top-level stateless scope would
    allocate; the ones made here are taken off that list on the way out.
    """
    import keras
    from keras.src.backend.common import global_state
    from keras.src.backend.common.variables import Variable as KerasVariable

    # Keras refuses variables made from a concrete value (Nadam's u_product,
    # Adafactor's placeholders) inside a stateless scope; give them an
    # initializer that returns the value, so they are deferred like the rest.
    original_init = KerasVariable.__init__

    def init(self: Any, initializer: Any, shape: Any = None, dtype: Any = None,
             *args: Any, **kwargs: Any) -> None:
        if not callable(initializer) and not isinstance(initializer, str):
            value = keras.ops.convert_to_tensor(initializer, dtype=dtype)
            dtype = dtype or keras.backend.standardize_dtype(value.dtype)
            shape = tuple(value.shape) if shape is None else shape

            def initializer(shape: Any, dtype: Any = None, _v: Any = value) -> Any:
                return keras.ops.cast(_v, dtype) if dtype else _v

        original_init(self, initializer, shape, dtype, *args, **kwargs)

    before = list(global_state.get_global_attribute("uninitialized_variables") or [])
    KerasVariable.__init__ = init  # type: ignore[method-assign]
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        KerasVariable.__init__ = original_init  # type: ignore[method-assign]
        current = global_state.get_global_attribute("uninitialized_variables") or []
        mine = {id(v) for v in current} - {id(v) for v in before}
        global_state.set_global_attribute(
            "uninitialized_variables", [v for v in current if id(v) not in mine]
        )


class BatchScaler:
    """Every batch size from two traces.

    Shapes in a training step are affine in the batch size (a dimension is
    ``fixed + per_sample * batch``), so two traces at batch sizes ``a`` and
    ``b`` give each dimension's two coefficients, and the graph at any other
    batch size follows without tracing again. When the two traces disagree in
    structure (a model whose layers depend on the batch size), ``at`` traces.
    """

    def __init__(self, model: Any, *, input_shape: Any = None,
                 is_leaf: Callable[[Any], bool] = lambda op: False,
                 sizes: tuple[int, int] = (2, 3)) -> None:
        self.model = model
        self.input_shape = input_shape
        self.is_leaf = is_leaf
        self.a, self.b = sizes
        self.ga = trace_model(model, self.a, input_shape=input_shape, is_leaf=is_leaf)
        self.gb = trace_model(model, self.b, input_shape=input_shape, is_leaf=is_leaf)
        self.ok = self._aligned()

    def _aligned(self) -> bool:
        ga, gb = self.ga, self.gb
        if len(ga.calls) != len(gb.calls) or len(ga.inputs) != len(gb.inputs):
            return False
        for ca, cb in zip(ga.calls, gb.calls):
            if (ca.name, ca.class_name, len(ca.inputs), len(ca.outputs)) != \
                    (cb.name, cb.class_name, len(cb.inputs), len(cb.outputs)):
                return False
            for ta, tb in zip((*ca.inputs, *ca.outputs), (*cb.inputs, *cb.outputs)):
                if ta.id != tb.id or len(ta.shape) != len(tb.shape) or ta.dtype != tb.dtype:
                    return False
                for da, db in zip(ta.shape, tb.shape):
                    if (db - da) % (self.b - self.a):
                        return False
        return True

    def _scale(self, ta: TensorInfo, tb: TensorInfo, n: int) -> TensorInfo:
        dims = []
        for da, db in zip(ta.shape, tb.shape):
            per = (db - da) // (self.b - self.a)
            dims.append(da + per * (n - self.a))
        if any(d <= 0 for d in dims):
            raise ValueError("scaled shape is not positive")
        return TensorInfo(ta.id, tuple(dims), ta.dtype)

    def at(self, batch_size: int) -> ModelGraph:
        if batch_size == self.a:
            return self.ga
        if batch_size == self.b:
            return self.gb
        if not self.ok:
            return trace_model(self.model, batch_size, input_shape=self.input_shape,
                               is_leaf=self.is_leaf)
        calls = []
        for ca, cb in zip(self.ga.calls, self.gb.calls):
            calls.append(dataclasses.replace(
                ca,
                inputs=tuple(self._scale(x, y, batch_size) for x, y in zip(ca.inputs, cb.inputs)),
                outputs=tuple(self._scale(x, y, batch_size)
                              for x, y in zip(ca.outputs, cb.outputs)),
            ))
        graph = dataclasses.replace(
            self.ga, batch_size=batch_size, calls=calls,
            inputs=tuple(self._scale(x, y, batch_size)
                         for x, y in zip(self.ga.inputs, self.gb.inputs)),
            outputs=tuple(self._scale(x, y, batch_size)
                          for x, y in zip(self.ga.outputs, self.gb.outputs)),
        )
        graph._keep = self.ga._keep  # type: ignore[attr-defined]
        return graph
