"""Optimizer state and the memory an update step needs.

The state is read from the optimizer itself: a fresh copy of the user's
optimizer is built on the model's trainable variables inside a weightless
scope, so every slot Keras would create (momentum, Adam's moments, Adafactor's
factored statistics, EMA copies, gradient accumulators, the loss-scale
variables) is counted with its real shape and dtype, and nothing is
allocated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterator
from typing import Any

from .units import dtype_bytes, round_up

logger = logging.getLogger(__name__)

#: Temporaries one variable's update allocates, as multiples of its size, read
#: off each optimizer's ``update_step`` expression tree on TensorFlow (buffers
#: that cannot be overwritten in place while the gradient is still read).
#: Adam and AdamW checked in the allocator trace (VGG16's 392 MiB fc1 kernel,
#: the 4 MiB kernels of an MLP): one variable-sized temporary beside the
#: gradient (Square of g), then two once the gradient is freed (Sqrt of v,
#: the scaled m). The copy TensorFlow makes of a variable written while
#: another op still reads it is added by the schedule, which knows when that
#: happens.
_UPDATE_TEMPORARIES = {
    "SGD": 0,
    "SGD+momentum": 1,
    "SGD+nesterov": 2,
    "Adam": 1,
    "AdamW": 1,
    "Adamax": 2,
    "Nadam": 3,
    "Lamb": 3,
    "Lion": 2,
    "RMSprop": 2,
    "Adagrad": 1,
    "Adadelta": 3,
    "Ftrl": 3,
    "Adafactor": 3,
    "Muon": 3,
}
_DEFAULT_TEMPORARIES = 2

#: Element-wise kernels one variable's update runs (each reads and writes
#: variable-sized data), from the same expression trees.
_UPDATE_KERNELS = {
    "SGD": 2, "SGD+momentum": 4, "SGD+nesterov": 6, "Adam": 12, "AdamW": 14, "Adamax": 10,
    "Nadam": 16, "Lamb": 16, "Lion": 8, "RMSprop": 8, "Adagrad": 6, "Adadelta": 12,
    "Ftrl": 16, "Adafactor": 16, "Muon": 16,
}
_DEFAULT_KERNELS = 10

#: New variable-sized buffers one variable's update writes (the kernels that
#: cannot overwrite an input): Adam's Square of g, Sqrt of v and scaled m, and
#: none for plain SGD (its product with the learning rate takes over g's
#: buffer), both seen in the allocator trace; other optimizers: their
#: temporaries. The copy of a weight its input gradient still reads is one
#: more (the schedule decides which weights are copied).
_UPDATE_ALLOCATIONS = {"SGD": 0, "Adam": 3, "AdamW": 3}


@dataclasses.dataclass(frozen=True)
class Slot:
    """One optimizer variable: the model variable it follows (its path; None
    for the optimizer's own, e.g. the step counter), its bytes, and what makes
    two of them start as one buffer (shape, dtype, initial value).

    When ``fit`` or ``train_on_batch`` builds the optimizer while tracing its
    training step (no distribution strategy: Keras defers the build), every
    slot of the same shape, dtype and initial value starts as one shared
    buffer (ResNet-50 under Adam: 428 slots, 28 buffers, 43.6 MiB instead of
    195 MiB); a slot's first update writes a copy of its own, the last one
    keeps the buffer. So the slots are allocated during the first step, each
    beside its variable's update, in the order of the backward pass.

    With ``gradient_accumulation_steps`` Keras adds an accumulator per
    variable (``accumulator``), which starts shared in the same way; see
    ``schedule.simulate`` for what its steps do with it.
    """

    follows: str | None
    nbytes: int
    share_key: Any = None
    accumulator: bool = False


@dataclasses.dataclass(frozen=True)
class OptimizerState:
    """What an optimizer holds and how its update behaves.

    ``state_bytes`` is the sum of the optimizer's variables (allocator-rounded);
    ``update_temporaries`` the multiple of a variable's size its update
    allocates; ``update_kernels`` the element-wise kernels it runs per
    variable; ``needs_all_gradients`` is True when the update cannot start
    before every gradient exists (loss scaling checks all gradients for
    infinities, global-norm clipping needs their joint norm).

    A ``MultiOptimizer`` updates each variable with the optimizer it maps it
    to: ``groups`` lists them, each with its variables' paths and its own
    figures (:meth:`for_variable`); the optimizer-wide ones are the largest.
    """

    name: str
    description: str
    state_bytes: int
    update_temporaries: int
    update_kernels: int
    update_allocations: int
    needs_all_gradients: bool
    variables: tuple[tuple[str, tuple[int, ...], str], ...]
    slots: tuple[Slot, ...] = ()
    accumulation_steps: int = 0
    decayed: frozenset[str] = frozenset()
    early_temporaries: int = 0
    update_peak: int = 0
    final_update_peak: int = 0
    groups: tuple[tuple[tuple[str, ...], OptimizerState], ...] = ()
    #: a group's own optimizer (its update graphs are traced from it)
    optimizer: Any = dataclasses.field(default=None, compare=False, repr=False)

    def for_variable(self, path: str) -> OptimizerState:
        """The figures of the optimizer that updates the variable at ``path``."""
        for paths, state in self.groups:
            if path in paths:
                return state
        return self


def _named_classes() -> dict[str, type]:
    """Keras' optimizer classes that a name builds (those with no required
    arguments), by lower-case class name."""
    import inspect

    import keras

    classes = {}
    for n in dir(keras.optimizers):
        cls = getattr(keras.optimizers, n)
        if not (isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer)):
            continue
        required = [p for p in list(inspect.signature(cls).parameters.values())
                    if p.default is inspect.Parameter.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not required and n != "Optimizer":
            classes[n.lower()] = cls
    return classes


def by_name(name: str) -> Any:
    """A new Keras optimizer from its name: what ``keras.optimizers.get``
    accepts, or any optimizer class of ``keras.optimizers`` by its name in any
    case (``"lamb"``, which ``get`` does not know in Keras 3.15)."""
    import keras

    try:
        return keras.optimizers.get(name)
    except ValueError:
        pass
    classes = _named_classes()
    if name.lower() in classes:
        return classes[name.lower()]()
    raise ValueError(f"unknown optimizer {name!r}: use a keras.optimizers instance or one of "
                     f"{', '.join(sorted(classes))}") from None


def resolve(optimizer: Any, model: Any) -> tuple[Any, list[str]]:
    """The Keras optimizer to model, and notes about how it was chosen."""
    import keras

    notes: list[str] = []
    if optimizer is None:
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            notes.append(
                "no optimizer given and the model is not compiled: assumed Adam "
                "(pass optimizer=... to choose)"
            )
            optimizer = "adam"
    if isinstance(optimizer, str):
        optimizer = by_name(optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"optimizer must be a name or a keras.optimizers.Optimizer, got "
            f"{type(optimizer).__name__}"
        )
    # What Model.compile does: a mixed_float16 model trains with loss scaling.
    policy = getattr(getattr(model, "dtype_policy", None), "name", "")
    if policy == "mixed_float16" and not isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer
    ):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer, notes


def _fresh_copy(optimizer: Any) -> Any:
    """An unbuilt optimizer with the same configuration."""
    return type(optimizer).from_config(optimizer.get_config())


def _config_key(optimizer: Any) -> str:
    """The optimizer's class and configuration, as a cache key."""
    import json

    config = json.dumps(optimizer.get_config(), sort_keys=True, default=str)
    return f"{type(optimizer).__name__}:{config}"


def _apply_graph(optimizer: Any, shape: tuple[int, ...], name: str, specs: list[Any],
                 gradient: Any) -> Any:
    """TensorFlow's graph of a fresh copy of ``optimizer`` applying
    ``gradient(*arguments)`` (the arguments' ``specs``) to a zero variable of
    ``shape``, built outside the traced function."""
    import keras
    import tensorflow as tf

    copy = _fresh_copy(optimizer)
    with tf.init_scope():
        variable = keras.Variable(tf.zeros(shape), name=name)
        copy.build([variable])

    def update(*arguments: Any) -> Any:
        copy.apply([gradient(*arguments)], [variable])
        return tf.constant(0)

    return tf.function(update, autograph=False).get_concrete_function(*specs).graph


def _kind(optimizer: Any) -> str:
    import keras

    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        return _kind(inner)
    name = type(optimizer).__name__
    if isinstance(optimizer, keras.optimizers.SGD):
        if getattr(optimizer, "nesterov", False) and optimizer.momentum:
            return "SGD+nesterov"
        if optimizer.momentum:
            return "SGD+momentum"
        return "SGD"
    return name


def _describe(optimizer: Any) -> str:
    inner = getattr(optimizer, "inner_optimizer", None)
    base = type(optimizer).__name__
    if inner is not None:
        return f"{base}({_describe(inner)})"
    options = []
    for attr in ("momentum", "nesterov", "amsgrad", "centered", "use_ema"):
        value = getattr(optimizer, attr, None)
        if value:
            options.append(f"{attr}={value}")
    steps = getattr(optimizer, "gradient_accumulation_steps", None)
    if steps:
        options.append(f"gradient_accumulation_steps={steps}")
    return base + (f"({', '.join(options)})" if options else "")


def _stand_in_class() -> type:
    """The class of :func:`_stand_ins`' variables, made once Keras is imported."""
    global _STAND_IN
    if _STAND_IN is None:
        import keras

        class StandIn(keras.KerasTensor):
            """What an optimizer's ``build`` reads of a variable (shape, dtype,
            names), without a value that TensorFlow would materialize to
            colocate slots. Symbolic: what a ``build`` computes from it (a slot
            that starts as a copy of its variable, ScheduleFreeAdamW's momentum)
            is shapes only."""

            def __init__(self, shape: tuple[int, ...], dtype: str, name: str, path: str,
                         trainable: bool = True, overwrite_with_gradient: bool = False) -> None:
                super().__init__(shape, dtype=dtype, name=name)
                self.path = path
                self.trainable = trainable
                self.overwrite_with_gradient = overwrite_with_gradient
                self.device = ""

            def __hash__(self) -> int:
                return id(self)

        _STAND_IN = StandIn
    return _STAND_IN


_STAND_IN: type | None = None


def _stand_ins(variables: list[Any],
               local_shapes: dict[str, tuple[int, ...]] | None = None) -> list[Any]:
    import keras

    local_shapes = local_shapes or {}
    stand_in = _stand_in_class()
    out = []
    for v in variables:
        path = getattr(v, "path", v.name)
        shape = local_shapes.get(path, tuple(int(d) for d in v.shape))
        out.append(stand_in(shape, keras.backend.standardize_dtype(v.dtype), v.name, path,
                            bool(v.trainable),
                            bool(getattr(v, "overwrite_with_gradient", False))))
    return out


@contextlib.contextmanager
def _building_on_stand_ins(reference: dict[int, tuple[str, str, bool]]) -> Iterator[None]:
    """Let any Keras optimizer (and the optimizers a ``MultiOptimizer``
    makes) build on :func:`_stand_ins`: TensorFlow's optimizer keys a
    variable by the ``tf.Variable`` behind it, which a stand-in does not
    have (its ``id`` serves), and an assignment in ``build`` (a slot that
    starts as a copy of its variable) is noted instead of computed. Each
    slot's model variable, initial value and whether it is a gradient
    accumulator go into ``reference``, by the slot's ``id``."""
    import keras

    stand_in = _stand_in_class()
    cls = keras.optimizers.Optimizer
    saved = {name: cls.__dict__.get(name) for name in
             ("_var_key", "add_variable_from_reference", "assign", "assign_add", "assign_sub")}
    var_key, add_from_reference = cls._var_key, cls.add_variable_from_reference

    def key(self: Any, variable: Any) -> Any:
        return id(variable) if isinstance(variable, stand_in) else var_key(self, variable)

    def add(self: Any, reference_variable: Any, name: Any = None,
            initializer: Any = "zeros") -> Any:
        var = add_from_reference(self, reference_variable, name=name, initializer=initializer)
        start = (initializer if isinstance(initializer, str)
                 else f"{type(initializer).__name__}{sorted(initializer.get_config().items())}")
        reference[id(var)] = (getattr(reference_variable, "path", reference_variable.name),
                              start, name == "gradient_accumulator")
        return var

    def assigned(self: Any, variable: Any, value: Any) -> None:
        # the slot starts from a value of its own: no buffer shared with others
        if id(variable) in reference:
            path, _, accumulator = reference[id(variable)]
            reference[id(variable)] = (path, f"assigned {id(variable)}", accumulator)

    patches = {"_var_key": key, "add_variable_from_reference": add, "assign": assigned,
               "assign_add": assigned, "assign_sub": assigned}
    try:
        for name, fn in patches.items():
            setattr(cls, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            if fn is None:
                delattr(cls, name)
            else:
                setattr(cls, name, fn)


def optimizer_state(optimizer: Any, model: Any,
                    local_shapes: dict[str, tuple[int, ...]] | None = None) -> OptimizerState:
    """Build a fresh copy of ``optimizer`` weightlessly and read its variables.

    ``local_shapes`` gives sharded variables' per-device shapes: their slots
    follow them.
    """
    import keras

    from .graph import weightless

    trainable = _stand_ins(list(model.trainable_variables), local_shapes)
    copy = _fresh_copy(optimizer)
    # note which model variable each slot follows, and what it starts from
    reference: dict[int, tuple[str, str, bool]] = {}
    with weightless(), _building_on_stand_ins(reference):
        try:
            copy.build(trainable)
        except Exception as err:
            raise ValueError(
                f"{type(optimizer).__name__} could not be built on the model's variables "
                f"without allocating them ({type(err).__name__}: {err}); pass a Keras "
                "optimizer whose build() only creates its variables, or name a similar "
                "one (optimizer='adam')") from err
        variables = list(copy.variables)
    described = []
    slots = []
    total = 0
    for v in variables:
        dtype = keras.backend.standardize_dtype(v.dtype)
        shape = tuple(int(d) for d in v.shape)
        nbytes = math.prod(shape) * dtype_bytes(dtype)
        total += round_up(nbytes)
        described.append((v.path if hasattr(v, "path") else v.name, shape, dtype))
        ref, start, accumulator = reference.get(id(v), (None, "", False))
        slots.append(Slot(ref, nbytes, (shape, dtype, start) if ref is not None else None,
                          accumulator))
    model_variables = list(model.trainable_variables)
    # (a MultiOptimizer, or one a loss-scale optimizer wraps)
    inner = getattr(copy, "inner_optimizer", None)
    groups = (_sub_optimizers(copy, optimizer, trainable, model_variables)
              or (_sub_optimizers(inner, optimizer, trainable, model_variables)
                  if inner is not None else []))
    description = _describe(optimizer)
    if not groups:
        updates = _update_figures(optimizer, model_variables)
    else:
        # each variable's update is its own optimizer's; the optimizer-wide
        # figures are the largest of them
        parts = [state for _, state in groups]
        updates = {field: max(getattr(part, field) for part in parts)
                   for field in _UPDATE_FIELDS}
        updates["needs_all_gradients"] = _waits_for_all(optimizer) or any(
            part.needs_all_gradients for part in parts)
        updates["decayed"] = frozenset().union(*(part.decayed for part in parts))
        # which optimizer updates how many variables
        described = ", ".join(
            f"{state.description} for {len(paths)} variable{'s' * (len(paths) != 1)}"
            for paths, state in groups)
        description = (description[:-1] + f"({described}))" if inner is not None
                       else f"{description}({described})")
    return OptimizerState(
        name=type(optimizer).__name__,
        description=description,
        state_bytes=total,
        variables=tuple(described),
        slots=tuple(slots),
        accumulation_steps=accumulation_steps(optimizer),
        groups=tuple(groups),
        **updates,
    )


#: the fields of :class:`OptimizerState` that say how one variable's update runs
_UPDATE_FIELDS = ("update_temporaries", "update_kernels", "update_allocations",
                  "early_temporaries", "update_peak", "final_update_peak")


def _update_figures(optimizer: Any, variables: list[Any]) -> dict[str, Any]:
    """How ``optimizer`` updates each of ``variables`` (the model's): the
    :data:`_UPDATE_FIELDS`, whether it waits for every gradient, and which
    variables it decays."""
    kind = _kind(optimizer)
    early = early_update(optimizer)
    return {
        "update_temporaries": _UPDATE_TEMPORARIES.get(kind, _DEFAULT_TEMPORARIES),
        "update_kernels": _UPDATE_KERNELS.get(kind, _DEFAULT_KERNELS),
        "update_allocations": _UPDATE_ALLOCATIONS.get(
            kind, _UPDATE_TEMPORARIES.get(kind, _DEFAULT_TEMPORARIES)),
        "early_temporaries": early[0],
        "update_peak": early[1],
        "final_update_peak": early[2],
        "needs_all_gradients": _waits_for_all(optimizer),
        "decayed": decayed_paths(optimizer, variables),
    }


def _waits_for_all(optimizer: Any) -> bool:
    """Whether the optimizer's updates wait for every gradient: loss scaling
    checks them all for infinities, global-norm clipping needs their norm."""
    return (getattr(optimizer, "inner_optimizer", None) is not None
            or bool(getattr(optimizer, "global_clipnorm", None)))


def _sub_optimizers(copy: Any, optimizer: Any, stand_ins: list[Any], variables: list[Any]
                    ) -> list[tuple[tuple[str, ...], OptimizerState]]:
    """For a ``MultiOptimizer`` (``copy`` built on ``stand_ins``), each
    optimizer it delegates to, with the paths of the variables it updates and
    how it updates them; empty for any other optimizer."""
    index = getattr(copy, "_var_to_optimizer_idx", None)
    inner = getattr(copy, "optimizers", None)
    if index is None or not isinstance(inner, list):
        return []
    by_path = {getattr(v, "path", v.name): v for v in variables}
    groups = []
    for k, sub in enumerate(inner):
        paths = tuple(s.path for s in stand_ins if index.get(id(s)) == k)
        if not paths:
            continue
        if accumulation_steps(sub):
            raise ValueError(
                f"{type(optimizer).__name__} delegates to {type(sub).__name__} with "
                "gradient_accumulation_steps, which is not modelled; estimate without it "
                "(what-if accumulation_steps=k applies it to the whole model)")
        figures = _update_figures(sub, [by_path[p] for p in paths if p in by_path])
        groups.append((paths, OptimizerState(
            name=type(sub).__name__, description=_describe(sub), state_bytes=0,
            variables=(), optimizer=sub, **figures)))
    return groups


_EARLY: dict[str, tuple[int, int, int]] = {}


def early_update(optimizer: Any) -> tuple[int, int, int]:
    """``(early, in_order, at_once)``: how many variable-sized buffers one
    variable's update computes from the optimizer's state alone, before its
    gradient exists (Lion's ``m * beta_1`` and ``m * beta_2``, SGD's ``m *
    momentum``, RMSprop's ``rho * velocity``), and how many variable-sized
    buffers, those and the gradient's own included, are alive at once while
    the update runs: its ops one at a time in the graph's order, or each as
    soon as its inputs are ready. TensorFlow's executor runs an op once its
    inputs are ready, so the early ones run at the start of the step, for
    every variable at once, and each is held until its variable's gradient
    arrives (allocator trace of ResNet50V2 under Lion, batch 8: 342 such
    products, 183.5 MiB of the 371.7 MiB the step had allocated at its
    peak). An update that runs while the other thread computes gradients runs
    in order; one after the last gradient (the first layer's) has both
    threads, and the ops a gradient makes ready run together: Adam's ``g -
    m`` and ``g * g`` beside ``g`` (allocator trace of a 1024 x 4096 Dense
    layer under Adam: three 16 MiB tensors in the update; under Lion, two
    products of the momentum and two of the gradient beside it).

    Read from TensorFlow's graph of a fresh copy's ``apply`` on a small dense
    variable (cached by configuration). Early: the variable-shaped results
    of ops that neither read the gradient nor wait for an op that does (data
    or control input), read by one that does; weight decay (``variable * wd
    * lr``, written into the variable at once) is not among them. An
    element-wise result is written into an input no one else will read (not
    a variable's), an assigned result is taken by its variable. An update
    inside a conditional (gradient accumulation, loss scaling) runs in a
    branch function and counts ``(0, 0, 0)``, as does one that cannot be
    traced."""
    import tensorflow as tf

    key = _config_key(optimizer)
    if key in _EARLY:
        return _EARLY[key]
    shape = (97, 3)
    try:
        graph = _apply_graph(optimizer, shape, "early", [tf.TensorSpec(shape)],
                             lambda gradient: gradient)
    except Exception as err:  # an optimizer that cannot be traced alone
        logger.info("%s: update not traced (%s); no early products assumed",
                    type(optimizer).__name__, err)
        _EARLY[key] = (0, 0, 0)
        return _EARLY[key]
    _EARLY[key] = _early_counts(graph, shape)
    return _EARLY[key]


def _early_counts(graph: Any, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(early, in order, at once)``: the early products, and the most
    variable-sized buffers alive at once, the gradient's own included, with
    the ops run one at a time in the graph's order, and with every op run as
    soon as its inputs are ready (all ops of a dependency level together)."""
    from .tfgraph import VIEW_OPS

    ops = list(graph.get_operations())  # in the order they were made
    gradient = None
    late: set[str] = set()  # ops that read the gradient or wait for one that does
    level: dict[str, int] = {}
    for op in ops:
        sources = [t.op for t in op.inputs] + list(op.control_inputs)
        level[op.name] = 1 + max((level.get(src.name, 0) for src in sources), default=-1)
        if gradient is None and op.type == "Placeholder" and op.outputs[0].dtype.is_floating \
                and op.outputs[0].shape == shape:
            gradient = op.outputs[0].name
            late.add(op.name)
        elif any(src.name in late for src in sources):
            late.add(op.name)

    def sized(t: Any) -> bool:
        return t.dtype.is_floating and t.shape == shape

    early = {op.name for op in ops
             if op.name not in late and op.type not in VIEW_OPS and op.type != "Const"
             and op.outputs and sized(op.outputs[0])
             and any(c.name in late for c in op.outputs[0].consumers())}
    # what neither reads the gradient nor is made for it (weight decay, made
    # and written into the variable at the step's start) is not the update's
    ops = [op for op in ops if op.name in late or op.name in early or op.type in VIEW_OPS]
    in_order = _update_peak([[op] for op in ops], early, gradient, sized)
    by_level: dict[int, list[Any]] = {}
    for op in ops:
        by_level.setdefault(level[op.name], []).append(op)
    at_once = _update_peak([by_level[k] for k in sorted(by_level)], early, gradient, sized)
    return len(early), in_order, max(at_once, in_order)


def _update_peak(groups: list[list[Any]], early: set[str], gradient: str | None,
                 sized: Any, size: Any = None, alive: list[int] | None = None) -> int:
    """The most variable-sized buffers alive at once (the early products made
    first, the gradient's counted) when each group of ops runs together: its
    results made, then its inputs released. A result is written into an input
    no one else will read (not a variable's value) of its size; an assigned
    result is taken by its variable. With ``size(tensor)`` the buffers are
    counted by it (bytes) instead of one each, and ``alive`` (a list) gets
    the sizes of the buffers alive at the peak (with no early products)."""
    from .tfgraph import VIEW_OPS

    if size is None:
        def size(t: Any) -> int:
            return 1

    readers: dict[str, int] = {}
    for group in groups:
        for op in group:
            for t in op.inputs:
                readers[t.name] = readers.get(t.name, 0) + 1
    buffer: dict[str, int | None] = {}  # tensor -> our buffer (None: not counted)
    refs: dict[int, int] = {}  # readers left per buffer
    nbytes: dict[int, int] = {}  # each buffer's count
    live = len(early)
    next_id = 0
    if gradient is not None:  # buffer 0, which results may take over
        buffer[gradient] = 0
        refs[0] = readers.get(gradient, 0)
        made = next((t for group in groups for op in group for t in op.outputs
                     if t.name == gradient), None)
        nbytes[0] = size(made) if made is not None else 1
        live += nbytes[0]
    held = {0: nbytes[0]} if gradient is not None else {}
    if alive is not None:
        alive[:] = list(held.values())
    peak = live
    for group in groups:
        for op in group:
            if op.type == "Placeholder":
                continue
            ins = list(op.inputs)
            if op.type in VIEW_OPS:
                for t in op.outputs:
                    src = buffer.get(ins[0].name) if ins and op.type != "ReadVariableOp" else None
                    buffer[t.name] = src
                    if src is not None:
                        refs[src] += readers.get(t.name, 0)
                continue
            for t in op.outputs:
                if not sized(t):
                    continue
                taken = None
                if op.name in early:  # made at the start
                    next_id += 1
                    taken = next_id
                    refs[taken] = 0
                    nbytes[taken] = 1
                for i in ([] if taken is not None else ins):  # into an input read last
                    b = buffer.get(i.name)
                    if b is not None and refs.get(b) == 1 and sized(i) and size(i) == size(t):
                        taken = b
                        break
                if taken is None:
                    next_id += 1
                    taken = next_id
                    refs[taken] = 0
                    nbytes[taken] = size(t)
                    live += nbytes[taken]
                    held[taken] = nbytes[taken]
                refs[taken] += readers.get(t.name, 0)
                buffer[t.name] = taken
        if live > peak and alive is not None:
            alive[:] = sorted(held.values(), reverse=True)
        peak = max(peak, live)
        for op in group:
            if op.type == "Placeholder":
                continue
            ins = list(op.inputs)
            if op.type == "AssignVariableOp" and len(ins) > 1:
                b = buffer.get(ins[1].name)
                if b is not None and refs.get(b) == 1:  # the variable takes the buffer
                    refs[b] = 0
                    live -= nbytes[b]
                    held.pop(b, None)
                    continue
            for i in ins:
                b = buffer.get(i.name)
                if b is not None and refs.get(b, 0) > 0:
                    refs[b] -= 1
                    if refs[b] == 0:
                        live -= nbytes[b]
                        held.pop(b, None)
    return peak


_SPARSE_UPDATES: dict[str, tuple[int, int, bool]] = {}
_SPARSE_GRAPHS: dict[str, tuple[Any, tuple[int, int], tuple[int, int]]] = {}


def sparse_update(optimizer: Any) -> tuple[int, int, bool]:
    """What ``optimizer``'s update does with a gradient that arrives as
    ``IndexedSlices`` (an Embedding's): ``(values, tables, scatters)``, the
    new buffers the size of the values (kernels reading them, such as Adam's
    ``Square``), the table-sized densifications (``UnsortedSegmentSum``, one
    per use that needs a dense tensor: Adam's two moments), and whether it
    scatters into a variable. A scatter puts TensorFlow's resource variable
    in copy-on-read mode: from then on every read of it is a copy (the
    allocator trace of an Embedding under SGD shows a table-sized
    ``ReadVariableOp`` before each gather).

    Read from TensorFlow's graph of a fresh copy's ``apply`` on a small
    variable (cached by configuration): SGD scatters the scaled values
    (``(1, 0, True)``), Adam and AdamW densify twice (``(1, 2, False)``).
    """
    import tensorflow as tf

    key = _config_key(optimizer)
    if key in _SPARSE_UPDATES:
        return _SPARSE_UPDATES[key]
    rows, cols, ids = 97, 3, 5
    try:
        graph = _apply_graph(
            optimizer, (rows, cols), "table",
            [tf.TensorSpec((ids, cols)), tf.TensorSpec((ids,), tf.int32)],
            lambda values, indices: tf.IndexedSlices(values, indices,
                                                     tf.constant([rows, cols])))
    except Exception as err:  # an optimizer that cannot take IndexedSlices
        logger.info("%s: sparse update not traced (%s); one dense copy assumed",
                    type(optimizer).__name__, err)
        _SPARSE_UPDATES[key] = (0, 1, False)
        return _SPARSE_UPDATES[key]
    made, dense, scatters = _sparse_counts(graph, (ids, cols))
    _SPARSE_GRAPHS[key] = (graph, (ids, cols), (rows, cols))
    # a conditional update (a LossScaleOptimizer's) runs in a branch function
    branches = [_sparse_counts(fn.graph, (ids, cols))
                for fn in getattr(graph, "_functions", {}).values()
                if getattr(fn, "graph", None) is not None]
    if branches:
        extra = max(branches, key=lambda c: (c[1], c[0]))
        made, dense = made + extra[0], dense + extra[1]
        scatters = scatters or any(c[2] for c in branches)
    _SPARSE_UPDATES[key] = (made, dense, scatters)
    return made, dense, scatters


def sparse_update_in_order(optimizer: Any, values_bytes: int,
                           table_bytes: int) -> tuple[list[int], bool] | None:
    """The buffers an update of an IndexedSlices gradient (``values_bytes``
    of values for a ``table_bytes`` variable) holds at its highest, beyond
    the values, when its ops run one at a time in the order one executor
    thread takes them (:func:`_last_ready_first`): as on the one thread left
    beside a weight-gradient job; with whether the values are still alive
    then. Adam's moments are densified one after the other, each written
    into its moment before the next segment sum: the second moment first,
    whose square root then waits for the first moment's segment sum and
    scaled copy, so at most two table-sized buffers, or one with the squared
    values (allocator traces of a text CNN on TensorFlow's kernels: Adam's
    ``Sqrt_1`` and one ``UnsortedSegmentSum`` alive beside the
    convolution's filter gradient, or ``Square`` and the other). None where
    the update was not traced, runs in a branch (a loss-scale optimizer's)
    or makes a segment sum of no static shape."""
    sparse_update(optimizer)  # traces the graph
    entry = _SPARSE_GRAPHS.get(_config_key(optimizer))
    if entry is None:
        return None
    graph, values_shape, table_shape = entry
    if getattr(graph, "_functions", None):
        return None
    ops = list(graph.get_operations())
    values = next((op.outputs[0].name for op in ops if op.type == "Placeholder"
                   and op.outputs[0].dtype.is_floating
                   and tuple(op.outputs[0].shape) == values_shape), None)
    if values is None or any(op.type == "UnsortedSegmentSum"
                             and tuple(op.outputs[0].shape) != table_shape for op in ops):
        return None

    def sized(t: Any) -> bool:
        return t.dtype.is_floating and tuple(t.shape) in (values_shape, table_shape)

    def size(t: Any) -> int:
        return values_bytes if tuple(t.shape) == values_shape else table_bytes

    alive: list[int] = []
    _update_peak([[op] for op in _last_ready_first(ops, values)], set(), values, sized,
                 size, alive)
    if values_bytes in alive:
        alive.remove(values_bytes)  # the values: the gradient's own buffer
        return alive, True
    return alive, False


def _last_ready_first(ops: list[Any], source: str) -> list[Any]:
    """``ops`` in the order one thread of TensorFlow's executor runs them once
    ``source`` (a tensor) arrives: what does not wait for it first, in the
    graph's order (done before it comes); then, from it, each op's newly
    ready readers queued in the graph's order and run last in, first out."""
    def sources(op: Any) -> list[str]:
        return list(dict.fromkeys([t.op.name for t in op.inputs]
                                  + [c.name for c in op.control_inputs]))

    late: set[str] = set()
    for op in ops:
        if source in {t.name for t in op.outputs} or any(s in late for s in sources(op)):
            late.add(op.name)
    order = [op for op in ops if op.name not in late]
    pending = {op.name: sum(1 for s in sources(op) if s in late)
               for op in ops if op.name in late}
    readers: dict[str, list[Any]] = {}
    for op in ops:
        for s in sources(op):
            readers.setdefault(s, []).append(op)
    stack = [op for op in ops if op.name in late and pending[op.name] == 0]
    while stack:
        op = stack.pop()
        order.append(op)
        for reader in readers.get(op.name, ()):
            if reader.name in pending:
                pending[reader.name] -= 1
                if pending[reader.name] == 0:
                    stack.append(reader)
    return order


def _sparse_counts(graph: Any, shape: tuple[int, int]) -> tuple[int, int, bool]:
    """Values-sized buffers computed from the values (a float placeholder of
    ``shape`` and its views), segment sums, and whether a scatter writes a
    variable, in one graph."""
    from .tfgraph import VIEW_OPS

    ops = graph.get_operations()
    values = {t.name for op in ops if op.type == "Placeholder" for t in op.outputs
              if t.dtype.is_floating and t.shape == shape}
    made = dense = 0
    scatters = any(op.type.startswith("ResourceScatter") for op in ops)
    for op in ops:
        reads = any(t.name in values for t in op.inputs)
        if op.type in VIEW_OPS:
            if reads:
                values.update(t.name for t in op.outputs)
        elif op.type == "UnsortedSegmentSum":
            dense += 1
        elif (reads and op.outputs and op.outputs[0].dtype.is_floating
              and op.outputs[0].shape == shape):
            made += 1
    return made, dense, scatters


def decayed_paths(optimizer: Any, variables: list[Any]) -> frozenset[str]:
    """The paths of the variables whose weight decay the optimizer applies
    (Keras' ``weight_decay``, AdamW's by default; a variable excluded with
    ``exclude_from_weight_decay`` is not decayed).

    TensorFlow applies it as ``variable.assign_sub(variable * wd * lr)``,
    which depends on nothing but the variable: it runs at the start of the
    step, while the forward pass's reads of the variable are still held, so
    TensorFlow writes it into a copy (see ``schedule.simulate``)."""
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if opt is None or not getattr(opt, "weight_decay", None):
            continue
        found = []
        for v in variables:
            try:
                use = bool(opt._use_weight_decay(v))
            except Exception:  # an optimizer without Keras' exclusion lists
                use = True
            if use:
                found.append(getattr(v, "path", v.name))
        return frozenset(found)
    return frozenset()


def accumulation_steps(optimizer: Any) -> int:
    """How many steps' gradients the optimizer (or the one a loss-scale
    optimizer wraps) sums before it updates; 0 without accumulation."""
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        steps = getattr(opt, "gradient_accumulation_steps", None) if opt is not None else None
        if steps:
            return int(steps)
    return 0
