"""``estimate`` and ``summary``: a Keras model -> a MemoryEstimate.

model -> graph (layer calls at a concrete batch) -> rules (prims per call) ->
schedule (the simulated step) -> an immutable estimate.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import random
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import devices, optimizers, timing
from .graph import FREE_GRADIENT_TF_OPS, BatchScaler, CallRecord, ModelGraph, trace_model
from .ir import LayerOp, Prim, WeightUse, with_upcast
from .records import LayerRecord, MemoryEstimate
from .rules import DEFAULT_RULES, Builder, Rule, RuleSet, category_of, using
from .rules.core import fallback
from .schedule import LossSpec, folded_constants, simulate
from .units import dtype_bytes, human_bytes, round_up

logger = logging.getLogger(__name__)

_WARNED: set[str] = set()

def check_options(caller: str, options: Mapping[str, Any], *also: str) -> None:
    """``options`` handed on to :func:`estimate` by ``caller``: a misspelt
    one is named in the caller's terms, with the ones it takes."""
    import inspect

    known = [p for p in inspect.signature(estimate).parameters
             if p not in ("model", "batch_size")]
    for name in options:
        if name not in known:
            public = sorted({n for n in [*known, *also] if not n.startswith("_")})
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}; "
                            f"it takes {', '.join(public)}")


def _check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        try:
            import numpy as np

            if isinstance(batch_size, np.integer):
                batch_size = int(batch_size)
            else:
                raise TypeError
        except TypeError:
            raise TypeError(
                f"batch_size must be a positive integer, got {batch_size!r} "
                f"({type(batch_size).__name__})"
            ) from None
    if batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    return int(batch_size)


def _check_model(model: Any) -> None:
    import keras

    if not isinstance(model, keras.Layer):
        raise TypeError(
            f"expected a Keras model (keras.Model), got {type(model).__name__}; "
            "build it first, e.g. keras.applications.ResNet50(weights=None)"
        )
    if isinstance(model, keras.Sequential) and not model.layers:
        raise ValueError(f"model {model.name!r} has no layers (only its input): there is "
                         "no training step to estimate")


def glue_rule(call: CallRecord) -> list[Prim]:
    """TensorFlow code between recorded calls: a new buffer; the inputs are
    kept when any of its ops has a gradient that reads them."""
    b = Builder(call)
    if not call.outputs:
        return []
    ins = [f"in{i}" for i in range(len(call.inputs))]
    cheap = all(op in FREE_GRADIENT_TF_OPS for op in call.tf_ops)
    views = all(op in ("Reshape", "Identity", "ExpandDims", "Squeeze", "Placeholder",
                       "ReadVariableOp", "Const") for op in call.tf_ops)
    if views and ins and call.inputs[0].nbytes == call.outputs[0].nbytes:
        return b.finish(["in0"])
    z = b.add1("tf_ops", ins, call.outputs[0].nbytes,
               save_for={} if cheap else {i: tuple(ins) for i in ins},
               inplace=ins if cheap else [], grad_inplace=cheap)
    return b.finish([z])


def resolve_method(method: str) -> str:
    """``"auto"`` -> ``"graph"`` on the TensorFlow backend, else ``"rules"``."""
    if method not in ("rules", "graph", "auto"):
        raise ValueError(f"method must be 'rules', 'graph' or 'auto', got {method!r}")
    if method == "auto":
        import keras

        return "graph" if keras.backend.backend() == "tensorflow" else "rules"
    return method


def lower(graph: ModelGraph, ruleset: RuleSet, method: str = "rules",
          overrides: tuple[type, ...] = (), upcast_dtypes: Sequence[str] = (),
          xla_buffers: bool = True, accumulate_dtypes: Sequence[str] = (),
          gradient_buffer_dtypes: Sequence[str] | None = None,
          ) -> tuple[list[LayerOp], dict[str, int], list[str]]:
    """Every call -> a LayerOp via its rule (or, with ``method="graph"``, via
    TensorFlow's graph of the call, except for the classes in ``overrides``,
    whose rules the user gave); unknown classes use the fallback. Matmuls in
    ``upcast_dtypes`` get their float32 copies, those in ``accumulate_dtypes``
    their float32 result buffers (:func:`ir.with_upcast`). With
    ``xla_buffers`` the functions a layer has XLA compile are costed as XLA compiles
    them here (``keras_memscope.xla``), which is right for this machine's
    device."""
    ops: list[LayerOp] = []
    unsupported: dict[str, int] = {}
    rule_names: list[str] = []
    next_id = -1

    def by_rule(call: CallRecord) -> list[Prim]:
        found = ruleset.lookup(call.layer)
        if found is None:
            rule: Rule = fallback
            rule_names.append("fallback")
            unsupported[call.class_name] = unsupported.get(call.class_name, 0) + 1
            _warn_unsupported(call.class_name)
        else:
            rule, registered = found
            rule_names.append(registered)
        try:
            return rule(call)
        except Exception as exc:  # a rule that cannot handle this call
            logger.warning("rule for %s failed on %s (%s); using the fallback",
                           call.class_name, call.name, exc)
            rule_names[-1] = "fallback"
            unsupported[call.class_name] = unsupported.get(call.class_name, 0) + 1
            return fallback(call)

    with using(ruleset):
        for call in graph.calls:
            constants: tuple[tuple[str, int], ...] = ()
            outputs = []
            for t in call.outputs:
                if t.id == -1:  # a call that returned its input: a fresh view
                    outputs.append(next_id)
                    next_id -= 1
                else:
                    outputs.append(t.id)
            if call.glue and call.layer is not None and not call.outputs:
                prims: list[Prim] = []  # a container's own weights
                rule_names.append("own weights")
            elif call.glue:
                prims = glue_rule(call)
                rule_names.append("tensorflow ops")
                if method == "graph":
                    constants = call.constants
            elif (method == "graph" and call.layer is not None
                  and not isinstance(call.layer, overrides)):
                from .tfgraph import traced_constants, traced_prims

                try:
                    prims = traced_prims(call, xla_buffers=xla_buffers)
                    rule_names.append("graph")
                except NotImplementedError as exc:  # a loop: the rule sizes it
                    logger.info("%s: %s", call.name, exc)
                    kept = getattr(exc, "loops", ())
                    prims = []
                    if ruleset.lookup(call.layer) is None:
                        # no rule: the layer's own graph, its loops and lists sized
                        try:
                            prims = traced_prims(call, xla_buffers=xla_buffers,
                                                 loop_layer=True, upcast=upcast_dtypes)
                            rule_names.append("graph (loop layer)")
                        except Exception as inner:
                            logger.info("%s: %s", call.name, inner)
                    if not prims:
                        prims = by_rule(dataclasses.replace(call, loops=kept) if kept else call)
                except Exception as exc:  # not traceable on its own: use the rules
                    logger.warning("could not trace %s alone (%s); using its rule",
                                   call.name, exc)
                    prims = by_rule(call)
                # (a loop's constants too: its graph was made before the rule took over)
                constants = traced_constants(call)
            else:
                prims = by_rule(call)
            ops.append(
                LayerOp(
                    index=call.index,
                    name=call.name,
                    class_name=call.class_name,
                    inputs=tuple(t.id for t in call.inputs),
                    outputs=tuple(outputs),
                    output_bytes=tuple(t.nbytes for t in call.outputs),
                    prims=tuple(with_upcast(p, upcast_dtypes, accumulate_dtypes,
                                            gradient_buffer_dtypes)
                                 for p in prims),
                    weights=call.weights,
                    itemsize=dtype_bytes(call.outputs[0].dtype) if call.outputs else 4,
                    constants=constants,
                )
            )
    return _cancel_transposes(ops, {t.id for t in graph.outputs}), unsupported, rule_names


def _cancel_transposes(ops: list[LayerOp], model_outputs: set[int]) -> list[LayerOp]:
    """A recurrent layer's sequence read only by recurrent layers: the
    transpose back to batch-major and theirs to time-major undo each other,
    and grappler's arithmetic optimizer removes the pair (its
    ``RemoveIdentityTranspose``), in the forward pass and in their
    gradients: both become views of the loop's time-major output. An
    allocator trace of two stacked SimpleRNN (128 units over 100 steps,
    batch 64) has the first loop's 3.125 MiB stack and one 3.125 MiB
    gradient stack, no transposed copies of either."""
    readers: dict[int, list[LayerOp]] = {}
    for op in ops:
        for t in set(op.inputs):
            readers.setdefault(t, []).append(op)

    def first(op: LayerOp) -> bool:
        return (bool(op.prims) and op.prims[0].name == "to_time_major"
                and op.prims[0].inputs == ("in0",))

    def last(op: LayerOp) -> bool:
        return (len(op.outputs) == 1 and bool(op.prims) and op.prims[-1].name == "to_batch_major"
                and op.prims[-1].outputs[0][0] == "out0")

    producers: set[int] = set()  # their last prim becomes a view
    consumers: set[int] = set()  # their first prim becomes a view
    for op in ops:
        seq = op.outputs[0] if op.outputs else None
        if (seq is not None and last(op) and seq not in model_outputs and readers.get(seq)
                and all(first(r) and r.inputs[0] == seq
                        and seq not in r.inputs[1:] for r in readers[seq])):
            producers.add(op.index)
            consumers.update(r.index for r in readers[seq])

    def viewed(op: LayerOp, at: int) -> LayerOp:
        prims = list(op.prims)
        prims[at] = dataclasses.replace(prims[at], alias=True, grad_inplace=True, macs=0)
        return dataclasses.replace(op, prims=tuple(prims))

    out = []
    for op in ops:
        if op.index in producers:
            op = viewed(op, len(op.prims) - 1)
        if op.index in consumers:
            op = viewed(op, 0)
        out.append(op)
    return out


def _warn_unsupported(class_name: str) -> None:
    if class_name in _WARNED:
        return
    _WARNED.add(class_name)
    warnings.warn(
        f"keras_memscope has no cost rule for {class_name}: its weights are exact, "
        "its outputs are assumed kept for the backward pass. Add one with "
        f"estimate(..., rules={{{class_name}: my_rule}}).",
        stacklevel=4,
    )


def _label_bytes(model: Any, outputs: list[Any]) -> list[int]:
    """Bytes of the labels a fit() step holds: integer class ids for sparse
    losses, else a float32 tensor shaped like each output. A model that is
    not compiled is taken to train as ``measure`` trains it: a sparse
    categorical cross-entropy for an output of more than one unit, else the
    mean squared error."""
    from .measure import _default_loss, _loss_name

    loss = getattr(model, "loss", None)
    # a name, a Loss, a loss function or a serialized loss (a .keras file's
    # compile config), named as ``measure`` names it
    sparse = any("sparse" in _loss_name(item).lower()
                 for item in (loss if isinstance(loss, (list, tuple)) else [loss])
                 if item is not None)
    sizes = []
    for t in outputs:
        if loss is None:  # not compiled: the loss ``measure`` would train with
            sparse = _default_loss(tuple(t.shape)).startswith("sparse")
        if sparse:
            sizes.append(math.prod(t.shape[:-1]) * 8)
        else:
            sizes.append(math.prod(t.shape) * 4)
    return sizes


def _output_losses(model: Any, count: int) -> list[Any]:
    """Each output's loss: the compiled one (one for all, a list, or a dict by
    output name), else the one ``measure`` trains with."""
    loss = getattr(model, "loss", None)
    if loss is None:
        return [None] * count
    if isinstance(loss, dict) and "class_name" not in loss:
        names = list(getattr(model, "output_names", None) or [])
        return [loss.get(n) for n in names] if len(names) == count else [None] * count
    if isinstance(loss, (list, tuple)):
        return list(loss) if len(loss) == count else [None] * count
    return [loss] * count


def _from_logits(loss: Any) -> bool:
    """Whether a compiled loss (a name, a config dict, an instance or a
    function) is told its inputs are logits."""
    if isinstance(loss, dict):
        return bool(loss.get("config", {}).get("from_logits", False))
    get_config = getattr(loss, "get_config", None)
    if callable(get_config):
        try:
            return bool(get_config().get("from_logits", False))
        except Exception:  # a custom loss whose config cannot be read
            return False
    return False


def _output_activation(model: Any, index: int) -> str:
    """The name of the activation that makes output ``index`` (Dense's
    ``activation``, an Activation or a Softmax layer); "" when unknown."""
    try:
        layer = model.outputs[index]._keras_history[0]
    except Exception:
        return ""
    if type(layer).__name__ == "Softmax":
        return "softmax"
    return str(getattr(getattr(layer, "activation", None), "__name__", ""))


def _loss_specs(model: Any, outputs: list[Any], traced: bool) -> list[LossSpec]:
    """What each output's loss keeps: one output-sized tensor (the softmax's
    gradient of a cross-entropy on logits, which becomes the output's
    gradient), or, with the graph method, what TensorFlow's graph of the loss
    and its gradient holds (``tfgraph.trace_loss``): a cross-entropy on
    values taken as probabilities keeps their clipped copy, its logarithm's
    input and masks. A cross-entropy on a softmax or sigmoid output is
    computed by Keras from the logits underneath, so it keeps the one
    tensor too."""
    import keras

    from . import tfgraph
    from .measure import _default_loss, _loss_name

    specs = []
    for i, (t, item) in enumerate(zip(outputs, _output_losses(model, len(outputs)))):
        default = LossSpec(saved_bytes=math.prod(t.shape) * 4)
        if item is None:
            item = _default_loss(tuple(t.shape))
        name = _loss_name(item).lower()
        if not traced or keras.backend.backend() != "tensorflow":
            specs.append(default)
            continue
        # a cross-entropy told its values are probabilities reads the logits
        # under a softmax or sigmoid; one told they are logits reads the output
        on_logits = ("crossentropy" in name.replace("_", "")
                     and not _from_logits(item)
                     and _output_activation(model, i) in ("softmax", "sigmoid", ""))
        try:
            fn = (keras.losses.deserialize(item) if isinstance(item, dict)
                  else keras.losses.get(item) if isinstance(item, str) else item)
            if not isinstance(fn, keras.losses.Loss):  # as compile() wraps a function
                from keras.src.losses.losses import LossFunctionWrapper

                fn = (LossFunctionWrapper(fn, from_logits=True) if on_logits
                      else LossFunctionWrapper(fn))
            elif on_logits:
                fn = type(fn).from_config({**fn.get_config(), "from_logits": True})
            spec = tfgraph.trace_loss(fn, tuple(t.shape), t.dtype, "sparse" in name)
        except Exception as exc:  # a loss that cannot be traced alone
            logger.info("loss %s not traced (%s); one output-sized tensor assumed", name, exc)
            spec = default
        if on_logits:
            # the graph Keras runs (on the logits) gives the constants; what
            # the step holds stays the one output-sized tensor
            spec = dataclasses.replace(default, constants=spec.constants)
        specs.append(spec)
    return specs


#: folded constants from this size on get a note saying where the largest is
_CONSTANTS_NOTE_BYTES = 1 << 20


def _constants_note(ops: Sequence[LayerOp], losses: Sequence[LossSpec], total: int) -> str:
    """Where the largest of the step's folded constants comes from."""
    nbytes, where = max(folded_constants(ops, losses).values())
    return (f"{human_bytes(total)} of folded constants held between steps: TensorFlow's "
            f"graph optimizer computes the parts of the step made of constants and static "
            f"shapes once and keeps them; the largest, {human_bytes(nbytes)}, is in {where}")


def _policy_name(model: Any) -> str:
    policy = getattr(model, "dtype_policy", None)
    return getattr(policy, "name", None) or str(getattr(model, "dtype", "float32"))


def estimate(
    model: Any,
    batch_size: int,
    *,
    optimizer: Any = None,
    device: str | devices.DeviceProfile | None = "gpu",
    dtype_policy: str | None = None,
    input_shape: Any = None,
    rules: Mapping[type, Rule] | None = None,
    method: str = "auto",
    distribution: Any = None,
    device_count: int | None = None,
    remat: Any = None,
    _graphs: Any = None,
) -> MemoryEstimate:
    """Predict the memory of one steady-state training step of ``model``.

    Args:
        model: a built Keras 3 model (Sequential, Functional or subclassed),
            or what builds one without allocating its weights: a zero-argument
            callable, a config (``model.get_config()``, a serialized dict,
            JSON text) or the path of a ``.keras`` file (its weights are not
            read).
        batch_size: samples per step (a positive integer).
        optimizer: a name or a ``keras.optimizers.Optimizer``; defaults to the
            model's compiled optimizer, else Adam.
        device: ``"gpu"``, ``"cpu"`` or a :class:`DeviceProfile`. On the CPU,
            whose executor runs input and weight gradients (and independent
            forward branches) on two threads in an order that varies with op
            times, the step is simulated in the nominal order and
            ``order_histories`` others and the estimate is the highest peak
            (``history_peaks``).
        dtype_policy: e.g. ``"mixed_bfloat16"`` to estimate the model rebuilt
            under that policy (its own policy otherwise).
        input_shape: input shape(s) without the batch dimension, for models
            whose inputs have unknown dimensions or that are not built.
        rules: ``{LayerClass: rule}`` overriding or adding cost rules.
        method: ``"graph"`` (each distinct layer call's forward and gradient
            traced with TensorFlow and turned into prims: what TensorFlow
            really keeps, for any layer; loops use their rule), ``"rules"``
            (the layer-rule engine: faster, and the one sweeps over batch
            sizes use) or ``"auto"`` (the default: ``"graph"`` on TensorFlow).
        distribution: a ``tf.distribute.MirroredStrategy`` or a
            ``keras.distribution`` DataParallel/ModelParallel: the estimate is
            then per device (see ``keras_memscope.distribution``); ``batch_size``
            stays the global batch.
        device_count: shorthand for data parallelism over that many replicas.
        remat: recomputation to apply: a Keras ``RematScope`` mode
            (``"activations"``, ``"full"``, ``"larger_than"``,
            ``"list_of_layers"``; or a dict of RematScope arguments),
            ``"checkpoints"`` (about sqrt(n) checkpointed segments) or a number
            of segments. A model built under ``RematScope`` is estimated with
            its own modes.

    Returns:
        A :class:`~keras_memscope.records.MemoryEstimate`.

    Example:
        >>> import keras, keras_memscope as memscope
        >>> model = keras.Sequential([keras.Input((1000,)),
        ...     keras.layers.Dense(100, activation="relu"),
        ...     keras.layers.Dense(10)])
        >>> est = memscope.estimate(model, batch_size=256, optimizer="sgd")
        >>> est.params
        101110
        >>> est.weights_bytes == 101110 * 4 + 3 * 256 - (101110 * 4) % 256
        False
    """
    batch_size = _check_batch_size(batch_size)
    from .transform import resolve_model

    model = resolve_model(model)
    _check_model(model)
    profile = devices.get_device(device)
    method = resolve_method(method)
    if _graphs is not None and method == "graph":
        _graphs = None  # the graph method traces each layer call at its shapes
    ruleset = DEFAULT_RULES.with_overrides(rules)
    notes: list[str] = []
    if dtype_policy is not None and dtype_policy != _policy_name(model):
        from .transform import with_dtype_policy

        model = with_dtype_policy(model, dtype_policy)
    opt, opt_notes = optimizers.resolve(optimizer, model)
    notes += opt_notes
    from .distribution import sharding_of

    sharding = sharding_of(model, distribution=distribution, device_count=device_count)
    global_batch = batch_size
    batch_size = -(-global_batch // sharding.batch_split)
    if sharding.devices > 1:
        notes.append(
            f"per device, one of {sharding.devices} ({sharding.kind.replace('_', ' ')}): "
            f"batch {batch_size} of the global {global_batch}"
            + (", rounded up" if global_batch % sharding.batch_split else ""))

    from . import remat as remat_lib

    remat_spec = remat_lib.parse_remat(remat)
    # under remat='activations' every layer, in a model built under the scope
    # the layers built in it: Keras fails on them in training, and would in the trace
    blockers = remat_lib.activation_blockers(
        model, scoped_only=remat_spec is None or remat_spec.mode != "activations")
    if blockers:
        raise ValueError(remat_lib.blocked_note(blockers) + "; Keras fails in the first "
                         "training step, so there is no step to estimate")
    if _graphs is not None and dtype_policy is None and not rules and method == "rules":
        # a BatchScaler for this model (its traces open every layer no rule
        # knows: the graph method traces some of those whole)
        graph = _graphs.at(batch_size)
    else:
        graph = trace_model(model, batch_size, input_shape=input_shape,
                            is_leaf=lambda op: ruleset.lookup(op) is not None,
                            whole_if_computing=method == "graph")
    if sharding.local_shapes:
        graph = _shard_weights(graph, sharding)
    if graph.merged:
        notes.append(
            f"{len(graph.merged)} layer call(s) compute what an earlier call computes "
            f"({', '.join(graph.merged[:3])}{', ...' if len(graph.merged) > 3 else ''}): "
            "TensorFlow runs them once (grappler merges them), and so does the estimate")
    if graph.assumed_batch:
        first = graph.assumed_batch[0]
        more = len(graph.assumed_batch) - 1
        notes.append(
            f"TensorFlow could not infer the first dimension of {first}"
            f"{f' (nor of {more} tensor(s) made from it)' if more else ''}, whose other "
            "dimensions are known: taken as the batch size; what a preprocessing layer "
            "makes from the data itself (a string's tokens before they are padded) "
            "depends on the data and is not counted")
    overrides = tuple(rules or ())  # (classes: with_overrides checked them)
    # XLA compiles for this machine's CPU: its buffers are the CPU's
    ops, unsupported, rule_names = lower(graph, ruleset, method, overrides,
                                         profile.upcast_dtypes,
                                         xla_buffers=profile.kind == "cpu",
                                         accumulate_dtypes=profile.accumulate_dtypes,
                                         gradient_buffer_dtypes=profile.gradient_buffer_dtypes)
    for dt in sorted({p.compute_dtype for op in ops for p in op.prims} - {""}):
        if dt in profile.upcast_dtypes:
            notes.append(
                f"{dt} matrix products on this {profile.kind} convert both operands and "
                "the result to float32 copies while they run (TensorFlow's own CPU "
                "kernels), counted in the estimate: lower precision saves less than half "
                "of their activations")
        elif dt in profile.accumulate_dtypes:
            notes.append(
                f"{dt} matrix products on this CPU run natively (oneDNN's kernels, "
                "AVX512_BF16) with a float32 buffer of the result where a matmul is fused "
                "with its bias add"
                + (" and for each kernel's gradient" if dt in profile.gradient_buffer_dtypes
                   else " (with AMX, none for the kernels' gradients)")
                + ", counted in the estimate")
    call_dtypes = {c.index: (c.outputs[0].dtype if c.outputs else "float32")
                   for c in graph.calls}
    # the types whose weight gradients the time model runs at a reference
    # kernel's rate
    slow: set[str] = set()
    for op in ops:
        dt = call_dtypes.get(op.index, "float32")
        if any(w.trainable for w in op.weights) and any(
                f"{timing.GRADIENT_FAMILIES[p.kernel][1]}:{dt}" in profile.reference_kernels
                for p in op.prims if p.kernel in timing.GRADIENT_FAMILIES):
            slow.add(dt)
    for dt in sorted(slow):
        notes.append(
            f"{dt} convolution filter gradients on this CPU run oneDNN's reference "
            "loops (under 1 GFLOP/s, some hundreds of times slower than its float32 "
            "kernels; bfloat16 has fast ones where the CPU has AVX512_BF16 or AMX): "
            "the step takes far longer, and its input gradients wait for them")
    loop_backlog = _loop_backlog(ops)
    loop_extra = 0
    state = optimizers.optimizer_state(opt, model, sharding.local_shapes)
    per_layer = remat_lib.model_remat(graph.calls)
    regions = remat_lib.regions(ops, graph.calls, remat_spec, per_layer)
    used = {s.mode for s in per_layer.values()} | ({remat_spec.mode} if remat_spec else set())
    for mode in sorted(used & set(remat_lib.FAILS_IN_FIT_ON_TF)):
        notes.append(f"RematScope mode {mode!r} fails inside fit() on TensorFlow "
                     "(keras#21207): use mode='activations', or keras.remat(fn)(x) with "
                     "positional arguments")

    weights_bytes = sum(round_up(w.nbytes) for w in graph.variables)
    input_sizes = [t.nbytes for t in graph.inputs] + _label_bytes(model, list(graph.outputs))
    if getattr(model, "loss", None) is None and graph.outputs:
        notes.append("the model is not compiled: labels sized as class indices for an output "
                     "of more than one unit (sparse categorical cross-entropy), else like the "
                     "output (mean squared error), as measure() trains it; compile the model "
                     "with its loss to size them")
    # fit() with steps_per_execution > 1 runs its steps in a tf.while_loop
    # whose body fetches the next batch beside the step it runs (the fetch
    # does not wait for the step): two batches are alive through each step
    per_call = _steps_per_execution(model)
    batches = 2 if per_call > 1 else 1
    input_bytes = batches * sum(round_up(n) for n in input_sizes)
    if per_call > 1:
        notes.append(
            f"compiled with steps_per_execution={per_call}: fit() runs {per_call} steps per "
            f"call in a loop that fetches the next batch while a step runs, so two batches "
            f"are alive through each step ({human_bytes(input_bytes)} of inputs and labels, "
            f"counted in input_bytes); with steps_per_execution=1 the next batch waits in "
            f"the input pipeline")
    # In the order a training run makes them: weights when the model is built,
    # then the batch, then the optimizer's variables at its first step.
    temporaries_of = _initializer_temporaries(model)
    persistent: list[tuple] = [("weights", w.nbytes, w.key, temporaries_of.get(w.key, 0))
                               for w in graph.variables]
    persistent += [("input batch", n) for n in input_sizes] * batches
    # Without a distribution strategy Keras builds the optimizer while tracing
    # the first step, and slots that start equal share one buffer until their
    # first update (optimizers.Slot); under a strategy it builds them eagerly.
    weight_key = {w.path: w.key for w in graph.variables}
    slots = [(weight_key.get(slot.follows), slot.nbytes,
              slot.share_key if sharding.devices <= 1 else None, slot.accumulator)
             for slot in state.slots]

    n_trainable = sum(1 for w in graph.variables if w.trainable)
    all_reduce = sharding.all_reduce
    lag = (n_trainable + 1 if state.needs_all_gradients or all_reduce
           else profile.update_lag)
    losses = _loss_specs(model, list(graph.outputs), method == "graph")
    # each variable's update is its optimizer's (a MultiOptimizer's differ)
    updater = {w.key: state.for_variable(w.path) for w in graph.variables}
    # the speeds that order the CPU's two threads (nominal where uncalibrated)
    ordering = timing.ordering_profile(profile)
    backward_time = _ordering_seconds(timing.backward_seconds, ordering, call_dtypes)
    forward_time = _ordering_seconds(timing.forward_seconds, ordering, call_dtypes)
    sparse_sizes, scatters = _sparse_update(_sparse_updater(state, ops, notes) or opt, ops)
    weight_first = None
    if method == "graph" and profile.weight_grad_lag > 0 and sharding.devices <= 1:
        # which of each layer's two gradients the executor starts first
        from . import executor

        orders = executor.weight_gradient_first(model, batch_size, opt,
                                                input_shape=input_shape)
        if orders is not None:
            weight_first = _weight_first(ops, orders)
            notes.append(
                f"the order TensorFlow's executor gives each layer's input and weight "
                f"gradients is read from grappler's rewrite of the training step: "
                f"{sum(f[0] for fl in orders.values() for f in fl)} of "
                f"{sum(len(f) for f in orders.values())} weight "
                f"gradients start first where the other thread is busy")
    step = functools.partial(
        simulate,
        model_inputs=[t.id for t in graph.inputs],
        model_outputs=[t.id for t in graph.outputs],
        losses=losses,
        update_workspace=lambda nbytes, key: nbytes * _update_temporaries(
            updater.get(key, state)),
        final_update_workspace=lambda nbytes, key: nbytes * _update_temporaries(
            updater.get(key, state), final=True),
        sparse_update=sparse_sizes,
        copy_on_read=scatters,
        early_update=lambda key: updater.get(key, state).early_temporaries,
        persistent=persistent,
        slots=slots,
        accumulation_steps=state.accumulation_steps,
        # in the model's order (a set's order changes from process to process)
        decayed=[w.key for w in graph.variables if w.path in state.decayed],
        update_lag=lag,
        weight_grad_lag=profile.weight_grad_lag,
        backward_time=backward_time,
        forward_time=forward_time,
        all_reduce_bytes=(sum(w.nbytes for w in graph.variables if w.trainable)
                          if all_reduce else 0),
        remat=regions,
        allocator=profile.allocator,
        update_time=lambda nbytes, key: _update_seconds(
            updater.get(key, state), ordering, nbytes),
        steps=profile.simulated_steps if profile.weight_grad_lag > 0 else 1,
        products_timed="gemm_read" in ordering.rates,
        weight_first=weight_first,
    )
    nominal = step(ops)
    result, history_peaks = nominal, ()
    if profile.weight_grad_lag > 0 and profile.order_histories > 0:
        # other orders of the two threads: the highest peak has to fit. Op
        # times vary in both passes, so the forward pass's branches interleave
        # in other orders too (a shared encoder's towers one after the other)
        others = [step(ops, backward_time=_scaled_times(backward_time, profile.op_time_sigma,
                                                        seed),
                       forward_time=_scaled_forward(forward_time, profile.op_time_sigma,
                                                    seed))
                  for seed in range(1, profile.order_histories + 1)]
        history_peaks = (nominal.peak_bytes, *(r.peak_bytes for r in others))
        result = max([nominal, *others], key=lambda r: r.peak_bytes)
        if result.peak_bytes > min(history_peaks):
            notes.append(
                f"the CPU runs input and weight gradients on two threads, in an order that "
                f"varies with op times from step to step: across {len(history_peaks)} "
                f"simulated orders (op times spread as measured) the step peaks at "
                f"{human_bytes(min(history_peaks))} to {human_bytes(max(history_peaks))} "
                f"(median {human_bytes(statistics.median(history_peaks))}); the estimate is "
                f"the highest (history_peaks). A change's saving taken median to median is "
                f"not moved by one order's allocator layout")
    if result.constants_bytes >= _CONSTANTS_NOTE_BYTES:
        notes.append(_constants_note(ops, losses, result.constants_bytes))
    if result.accumulator_zeros_bytes:
        notes.append(
            f"gradient accumulation over {state.accumulation_steps} steps: an updating step "
            f"starts with every accumulator holding its own buffer, and the optimizer state "
            f"includes the zeros they are reset to "
            f"({human_bytes(result.accumulator_zeros_bytes)}, one constant per shape)")
    if loop_backlog:
        # the same step with every recurrent loop's backlog held while its
        # gradient runs: how much higher the peak can be
        loop_extra = max(0, step(ops, worst_case=True).peak_bytes - result.peak_bytes)
        notes += _loop_notes(loop_backlog, loop_extra)

    timed = timing.has_timing(profile)
    times = timing.layer_times(result.costs, profile, call_dtypes) if timed else None
    flops = timing.layer_times(result.costs, _UNTIMED, call_dtypes) if not timed else times
    records = _layer_records(graph, ops, rule_names, result.layer_saved_bytes,
                             result.layer_workspace_bytes, flops, timed)
    if method == "graph" and profile.kind == "cpu":
        notes += _grouped_convolution_notes(graph, records)
    untrainable = _channels_first_note(graph) if profile.kind == "cpu" else None
    if untrainable:
        notes.append(untrainable)
        warnings.warn(untrainable, stacklevel=3)
    if profile.kind == "gpu":
        notes.append(_xla_note(model))
    elif _compiled_with_xla(model):
        notes.append(
            "this model is compiled with jit_compile=True: Keras has XLA compile its training "
            "step, and XLA assigns the step's buffers itself; this estimate follows "
            "TensorFlow's executor without XLA, as memscope.measure trains; compile with "
            "jit_compile=False to train as estimated")
    own_step = _own_train_step(model)
    if own_step:
        notes.append(
            f"{own_step}.train_step replaces Keras' training step: this estimate is of "
            "Keras' own (one forward pass, its gradient, one optimizer update); a step that "
            "does more (a second forward pass, a gradient penalty, a second optimizer) "
            "holds more. memscope.measure trains with the model's own step")
    trainable = [w for w in graph.variables if w.trainable]
    # new buffers per update: the optimizer's, and the copy of a weight its
    # input gradient still reads
    update_s = (sum(timing.update_time(
        [w.nbytes], updater[w.key].update_kernels, profile,
        [updater[w.key].update_allocations + (w.key in result.copied_weights)])
        for w in trainable) if timed else None)
    params = sum(_elements(w) for w in graph.variables)
    trainable_params = sum(_elements(w) for w in trainable)
    if graph.unattributed:
        notes.append(
            f"{len(graph.unattributed)} variable(s) are read by no recorded layer call; "
            "counted in the weights"
        )
    return MemoryEstimate(
        model_name=graph.model_name,
        batch_size=global_batch,
        method=method,
        device=profile.name,
        optimizer=state.description,
        dtype_policy=_policy_name(model),
        params=params,
        trainable_params=trainable_params,
        weights_bytes=weights_bytes,
        optimizer_bytes=state.state_bytes + result.accumulator_zeros_bytes,
        input_bytes=input_bytes,
        input_batches=batches,
        activations_bytes=result.activations_bytes,
        gradients_bytes=result.gradients_bytes,
        workspace_bytes=result.workspace_bytes,
        allocator_bytes=result.allocator_bytes,
        released_bytes=result.released_bytes,
        constants_bytes=result.constants_bytes,
        held_bytes=nominal.held_bytes,
        overhead_bytes=profile.overhead_bytes,
        saved_activations_bytes=result.saved_activations_bytes,
        forward_macs=sum(r.forward_macs for r in records),
        peak_phase=result.peak_phase,
        layers=tuple(records),
        unsupported=unsupported,
        timeline=result.timeline,
        peak_holders=result.holders,
        notes=tuple(notes),
        forward_flops=sum(r.forward_flops for r in records),
        backward_flops=sum(r.backward_flops for r in records),
        update_time_s=update_s,
        timing_source=profile.source if timed else "",
        devices=sharding.devices,
        device_batch_size=batch_size,
        recompute_flops=sum(c.forward_flops for c in result.costs if c.recomputed),
        step_allocated_bytes=result.allocated_bytes,
        possible_extra_bytes=loop_extra,
        history_peaks=history_peaks,
        remat=(remat_spec.describe() if remat_spec else
               ", ".join(sorted({s.describe() for s in per_layer.values()}))),
    )


def _steps_per_execution(model: Any) -> int:
    """The steps ``fit`` runs per call of its training function, as the
    model was compiled (``compile(steps_per_execution=N)``); 1 where it was
    not compiled or the setting is not a positive integer."""
    if not getattr(model, "compiled", False):
        return 1
    value = getattr(model, "steps_per_execution", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return 1
    return value


def _own_train_step(model: Any) -> str | None:
    """The name of the class that overrides Keras' ``train_step``, where one
    outside Keras does."""
    for cls in type(model).__mro__:
        if "train_step" in vars(cls):
            return None if cls.__module__.split(".")[0] == "keras" else cls.__qualname__
    return None


def _compiled_with_xla(model: Any) -> bool:
    """Whether the model is compiled to train with XLA (``jit_compile=True``,
    given or resolved from ``"auto"`` where a GPU was present)."""
    return bool(getattr(model, "compiled", False) and getattr(model, "_jit_compile", None) is True)


def _xla_note(model: Any) -> str:
    """Keras compiles the training step with XLA where a GPU is present:
    ``compile(jit_compile="auto")``, its default, resolves to True on the
    TensorFlow backend when the machine has a GPU, no tf.distribute strategy
    is used and every layer supports it (``Trainer._resolve_auto_jit_compile``)."""
    said = " (this model was compiled with jit_compile=True)" if _compiled_with_xla(model) else ""
    return ("on a GPU, Keras compiles the training step with XLA unless the model is "
            "compiled with jit_compile=False (the default, 'auto', turns it on where a GPU "
            f"is present and every layer supports it){said}: this estimate follows "
            "TensorFlow's executor without XLA, whose buffers XLA assigns otherwise; "
            "compile with jit_compile=False to train as estimated")


def _grouped_convolution_notes(graph: ModelGraph, records: Sequence[LayerRecord]) -> list[str]:
    """A note on convolutions with one input channel per group: Keras runs
    them with XLA on the CPU, whose filter gradient is a dense k x k x C x C
    convolution (``keras_memscope.xla``); DepthwiseConv2D computes the same
    with TensorFlow's own depthwise kernels."""
    workspace = {r.name: r.workspace_bytes for r in records}
    found = []
    for call in graph.calls:
        groups = getattr(call.layer, "groups", 1) or 1
        if (groups > 1 and call.inputs and len(call.inputs[0].shape) == 4
                and call.inputs[0].shape[-1] == groups):
            found.append((workspace.get(call.name, 0), call.name))
    if not found:
        return []
    largest, name = max(found)
    return [f"{len(found)} convolution(s) with one input channel per group (e.g. {name}): "
            "Keras runs them with XLA on the CPU, whose filter gradient is a dense "
            f"kernel x kernel x channels x channels convolution ({human_bytes(largest)} "
            "of workspace at the most); DepthwiseConv2D computes the same without it"]


def _channels_first_note(graph: ModelGraph) -> str | None:
    """What to do where a 1-D or 2-D convolution (or its transpose) computes
    in ``channels_first`` and TensorFlow runs its own kernels for its type
    on this CPU (:func:`~keras_memscope.devices.cpu_onednn_runs`): their
    gradients support NHWC only, and ``fit`` fails in its first step
    ("Conv2DCustomBackpropFilterOp only supports NHWC", the input
    gradient's alike, on an AVX2 CPU; Conv3D, depthwise and separable
    convolutions and pooling train). A frozen one fails where a gradient
    flows through it: one after a trainable layer."""
    import keras

    kinds = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv1DTranspose,
             keras.layers.Conv2DTranspose)
    found, trained_before = [], False
    for call in graph.calls:
        layer = call.layer
        trainable = bool(getattr(layer, "trainable_weights", None)) and getattr(
            layer, "trainable", False)
        if (isinstance(layer, kinds) and getattr(layer, "data_format", "") == "channels_first"
                and (trainable or trained_before)
                and not devices.cpu_onednn_runs(str(getattr(layer, "compute_dtype",
                                                             "float32")))):
            found.append(call.name)
        trained_before = trained_before or trainable
    if not found:
        return None
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    return (f"{found[0]}{more} computes a convolution in channels_first, and on this CPU "
            "TensorFlow runs its own kernels for it (not oneDNN's), whose gradients support "
            "NHWC only: training fails in its first step (\"Conv2DCustomBackpropFilterOp only "
            "supports NHWC\"). Build the convolutions with data_format=\"channels_last\" to "
            "train on this CPU; the estimate is of the step as it would run")


def _ordering_seconds(seconds: Callable[..., Any], ordering: devices.DeviceProfile,
                      dtypes: dict[int, str]) -> Callable[[Any], Any]:
    """``seconds(prim cost, ordering, dtype)`` (``timing.backward_seconds``: a
    prim's input and weight gradients; ``timing.forward_seconds``: its
    forward kernel, which a recomputed prim runs again) on the speeds that
    order the CPU's two gradient streams in the simulated step
    (``timing.ordering_profile``: the profile's, or nominal CPU speeds)."""
    return lambda c: seconds(c, ordering, dtypes.get(c.layer_index, "float32"))


def _update_temporaries(state: Any, final: bool = False) -> int:
    """The variable-sized temporaries one variable's update makes beyond its
    gradient: where some are made from the state alone at the step's start
    (``early_update``), those the update adds; ``final``: after the backward
    pass, when the update's ready ops run together (both threads)."""
    temporaries = (state.update_peak - state.early_temporaries - 1 if state.early_temporaries
                   else state.update_temporaries)
    if final:
        return max(temporaries, state.final_update_peak - state.early_temporaries - 1)
    return temporaries


def _update_seconds(state: Any, ordering: devices.DeviceProfile, nbytes: int) -> float:
    """One variable's update (``nbytes``) on ``ordering``: it orders the
    updates run beside the last weight gradients in the simulated step."""
    return timing.update_time([nbytes], state.update_kernels, ordering, state.update_allocations)


def _weight_first(ops: Sequence[LayerOp], orders: Mapping[int, Sequence[tuple[bool, Any]]]
                  ) -> frozenset[tuple[int, int]]:
    """``(layer op index, weight key)`` of each call whose kernel's gradient
    the executor starts before its input gradient, and of each call whose
    bias's gradient it starts before (``executor.weight_gradient_first``'s
    flags, a kernel's calls in the forward pass's order)."""
    calls: dict[int, int] = {}
    first = set()
    for op in ops:
        for w in op.weights:
            flags = orders.get(w.key)
            if flags is None:
                continue
            k = calls.get(w.key, 0)
            calls[w.key] = k + 1
            if k < len(flags) and flags[k][0]:
                first.add((op.index, w.key))
            if k < len(flags) and flags[k][1]:
                first.update((op.index, b.key) for b in op.weights
                             if b.trainable and b.path.rsplit("/", 1)[-1] == "bias")
    return frozenset(first)


def _sparse_updater(state: Any, ops: Sequence[LayerOp], notes: list[str]) -> Any:
    """The optimizer that updates the variables whose gradients are
    ``IndexedSlices``, where a ``MultiOptimizer`` maps them to one of its own
    (None: the optimizer itself does)."""
    if not state.groups:
        return None
    chosen = [state.for_variable(w.path) for op in ops if any(p.sparse_grad for p in op.prims)
              for w in op.weights if w.trainable]
    if len({id(s) for s in chosen}) > 1:
        notes.append(f"{state.name} updates the embedding tables with different optimizers; "
                     f"each table's sparse update is modelled as {chosen[0].name}'s")
    return chosen[0].optimizer if chosen else None


def _sparse_update(optimizer: Any, ops: Sequence[LayerOp]
                   ) -> tuple[Callable[[int, int], tuple[Any, ...]] | None, bool]:
    """The allocations ``optimizer``'s update makes for an IndexedSlices
    gradient (values bytes, table bytes -> the values-sized ones, the
    table-sized ones, and what the update holds with its ops run one at a
    time: ``optimizers.sparse_update_in_order``), where a prim has one
    (TensorFlow), and whether it scatters into the variable (copy-on-read
    afterwards)."""
    import keras

    if keras.backend.backend() != "tensorflow" or not any(
            p.sparse_grad for op in ops for p in op.prims):
        return None, False
    made, dense, scatters = optimizers.sparse_update(optimizer)
    in_order: dict[tuple[int, int], Any] = {}  # (each simulated order asks again)

    def allocations(values: int, table: int) -> tuple[Any, ...]:
        if (values, table) not in in_order:
            in_order[values, table] = optimizers.sparse_update_in_order(optimizer, values, table)
        return [values] * made, [table] * dense, in_order[values, table]
    return allocations, scatters


def _prim_factors(sigma: float, rng: random.Random,
                  count: int) -> Callable[[Any], tuple[float, ...]]:
    """``count`` independent log-normal factors of spread ``sigma`` for each
    prim, drawn from ``rng`` in the order the prims are first asked for (the
    schedule asks in step order, so the same seed gives the same history)."""
    factors: dict[int, tuple[float, ...]] = {}

    def of(cost: Any) -> tuple[float, ...]:
        key = id(cost)
        if key not in factors:
            factors[key] = tuple(rng.lognormvariate(0.0, sigma) for _ in range(count))
        return factors[key]
    return of


def _scaled_times(times: Callable[[Any], tuple[float, float]], sigma: float,
                  seed: int) -> Callable[[Any], tuple[float, float]]:
    """``times`` with each prim's input- and weight-gradient seconds scaled by
    independent log-normal factors of spread ``sigma``, drawn from ``seed``
    (:func:`_prim_factors`)."""
    factors = _prim_factors(sigma, random.Random(seed), 2)

    def scaled(cost: Any) -> tuple[float, float]:
        (a, b), (fa, fb) = times(cost), factors(cost)
        return a * fa, b * fb
    return scaled


def _scaled_forward(times: Callable[[Any], float], sigma: float,
                    seed: int) -> Callable[[Any], float]:
    """``times`` (a prim's forward seconds) with each prim's scaled by an
    independent log-normal factor of spread ``sigma``, as
    :func:`_scaled_times` does the gradients' (a stream of its own, drawn
    from ``seed``, so that the gradients' factors stay those of the seed)."""
    factors = _prim_factors(sigma, random.Random(seed + 7919), 1)
    return lambda cost: times(cost) * factors(cost)[0]


def _initializer_temporaries(model: Any) -> dict[int, int]:
    """For each variable (by ``id``), how many variable-sized temporaries its
    initializer makes before the value the variable keeps: a random
    initializer draws (``StatelessRandomUniformV2``), scales (``Mul``) and
    shifts (``AddV2``, the value kept), so two; a constant fill makes the
    value directly. Variables whose initializer the layer does not name are
    counted as constants."""
    from keras.src.initializers.random_initializers import RandomInitializer

    found: dict[int, int] = {}
    layers = model._flatten_layers() if hasattr(model, "_flatten_layers") else ()
    for layer in layers:
        own = list(getattr(layer, "_trainable_variables", ())) + list(
            getattr(layer, "_non_trainable_variables", ()))
        names = [str(getattr(v, "name", "")).split("/")[-1] for v in own]
        attrs = [a for a in getattr(layer, "__dict__", {}) if a.endswith("_initializer")]
        named = {}
        for v, name in zip(own, names):
            for attr in (f"{name}_initializer",
                         f"{name.removesuffix('_kernel')}_initializer"):
                if getattr(layer, attr, None) is not None:
                    named[id(v)] = attr
                    break
        # a variable named otherwise than its initializer (DepthwiseConv2D's
        # ``kernel`` from ``depthwise_initializer``): the one initializer
        # no other variable of the layer is named for
        unclaimed = [a for a in attrs if a not in named.values()]
        for v in own:
            attr = named.get(id(v)) or (unclaimed[0] if len(unclaimed) == 1 else None)
            init = getattr(layer, attr, None) if attr else None
            found[id(v)] = 2 if isinstance(init, RandomInitializer) else 0
    return found


def _loop_backlog(ops: Sequence[LayerOp]) -> list[tuple[str, int, bool]]:
    """The layer calls whose gradient loop may run ahead of its
    weight-gradient sums, with the bytes it would then hold (their prims'
    ``backlog_parts``: ``rules.recurrent``, ``looplayer``) and whether it
    is a recurrent layer's (a ``"recurrence"`` prim)."""
    found = [(op.name, sum(sum(p.backlog_parts) for p in op.prims),
              any(p.name == "recurrence" for p in op.prims)) for op in ops]
    return [(name, n, recurrent) for name, n, recurrent in found if n]


def _loop_notes(backlog: list[tuple[str, int, bool]], extra: int) -> list[str]:
    """What gradient loops may add, in words: each layer's backlog, and how
    much higher the simulated peak is with them held."""
    from .looplayer import PARALLEL_ITERATIONS as LOOP_ITERATIONS
    from .rules.recurrent import PARALLEL_ITERATIONS

    notes = [
        f"{name}: its gradient loop can run iterations ahead of the sums it carries (up "
        f"to its loop's parallel_iterations, {LOOP_ITERATIONS} unless set), each iteration "
        f"ahead holding one more of its partial gradients ({human_bytes(n)} at most); the "
        "estimate assumes the sums keep up. "
        "TensorFlow runs a loop's iterations side by side where they do not wait for each "
        "other; where it must fit, plan for possible_extra_bytes "
        "(fits(...).worst_case_fits)"
        if not recurrent else
        f"{name}: its gradient loop can run up to {PARALLEL_ITERATIONS} timesteps ahead "
        f"of its weight-gradient sums, each step ahead holding one more partial kernel "
        f"gradient ({human_bytes(n)} at most); the estimate assumes the sums keep up. "
        "They fall behind when TensorFlow's graph optimizer orders the state gradient "
        "last among the readers of a step's gate gradients and the per-step weight "
        "products are the slower work, which depends on the whole training step and "
        "the CPU: on one 2-core CPU after an Embedding with Adam, AdamW or Adagrad and "
        "not with SGD or RMSprop, on another with SGD in two of three processes and a "
        "bidirectional LSTM with Adam in all; where it must fit, plan for "
        "possible_extra_bytes (fits(...).worst_case_fits)"
        for name, n, recurrent in backlog]
    notes.append(f"with every loop's backlog held, the simulated peak is "
                 f"{human_bytes(extra)} higher (possible_extra_bytes)" if extra else
                 "with every loop's backlog held, the simulated peak is no higher than the "
                 "estimate: the step reaches its peak elsewhere (possible_extra_bytes is 0)")
    return notes


def _shard_weights(graph: ModelGraph, sharding: Any) -> ModelGraph:
    """Each weight as one device holds it: its local shard's bytes."""
    import dataclasses

    def local(w: WeightUse) -> WeightUse:
        shape = sharding.local_shape(w.path, w.shape)
        if shape == w.shape:
            return w
        return dataclasses.replace(w, shape=shape,
                                   nbytes=math.prod(shape) * dtype_bytes(w.dtype))

    calls = [dataclasses.replace(c, weights=tuple(local(w) for w in c.weights))
             for c in graph.calls]
    out = dataclasses.replace(graph, calls=calls,
                              variables=tuple(local(w) for w in graph.variables),
                              unattributed=tuple(local(w) for w in graph.unattributed))
    out._keep = getattr(graph, "_keep", None)  # type: ignore[attr-defined]
    return out


def batch_scaler(model: Any, *, input_shape: Any = None,
                 rules: Mapping[type, Rule] | None = None) -> BatchScaler:
    """Traces of ``model`` from which every batch size follows (for sweeps)."""
    ruleset = DEFAULT_RULES.with_overrides(rules)
    return BatchScaler(model, input_shape=input_shape,
                       is_leaf=lambda op: ruleset.lookup(op) is not None)


def _elements(w: WeightUse) -> int:
    return w.nbytes // dtype_bytes(w.dtype)


#: A profile with unit speeds, to sum FLOPs when the device has no timing.
_UNTIMED = devices.DeviceProfile(name="untimed", kind="cpu", overhead_bytes=0,
                                 peak_flops={"float32": 1.0}, bandwidth_bytes_s=1.0,
                                 op_overhead_s=0.0)


def _layer_records(
    graph: ModelGraph,
    ops: list[LayerOp],
    rule_names: list[str],
    saved: dict[int, int],
    workspace: dict[int, int],
    costs: dict[int, Any] | None = None,
    timed: bool = False,
) -> list[LayerRecord]:
    counted: set[int] = set()
    records = []
    for call, op, rule in zip(graph.calls, ops, rule_names):
        params = trainable = nbytes = 0
        for w in call.weights:
            if w.key in counted:
                continue
            counted.add(w.key)
            params += _elements(w)
            trainable += _elements(w) if w.trainable else 0
            nbytes += round_up(w.nbytes)
        records.append(
            LayerRecord(
                name=call.name,
                class_name=call.class_name,
                input_shapes=tuple(t.shape for t in call.inputs),
                output_shapes=tuple(t.shape for t in call.outputs),
                output_dtypes=tuple(t.dtype for t in call.outputs),
                params=params,
                trainable_params=trainable,
                weights_bytes=nbytes,
                activation_bytes=saved.get(op.index, 0),
                workspace_bytes=workspace.get(op.index, 0),
                forward_macs=sum(p.macs for p in op.prims),
                shared=call.shared,
                rule=rule,
                category=category_of(call.layer),
                **_cost_fields(costs, op.index, timed),
            )
        )
    rest = [w for w in graph.variables if w.key not in counted]
    if rest:
        records.append(
            LayerRecord(
                name="<unattributed>", class_name="Variable", input_shapes=(),
                output_shapes=(), output_dtypes=(),
                params=sum(_elements(w) for w in rest),
                trainable_params=sum(_elements(w) for w in rest if w.trainable),
                weights_bytes=sum(round_up(w.nbytes) for w in rest),
                activation_bytes=0, workspace_bytes=0, forward_macs=0, rule="",
                forward_time_s=0.0 if timed else None, backward_time_s=0.0 if timed else None,
            )
        )
    return records


def _cost_fields(costs: dict[int, Any] | None, index: int, timed: bool) -> dict[str, Any]:
    if not costs or index not in costs:
        return {"forward_time_s": 0.0 if timed else None,
                "backward_time_s": 0.0 if timed else None}
    c = costs[index]
    return {"forward_flops": c.forward_flops, "backward_input_flops": c.backward_input_flops,
            "backward_weight_flops": c.backward_weight_flops,
            "forward_time_s": c.forward_time_s if timed else None,
            "backward_time_s": c.backward_time_s if timed else None}


def summary(
    model: Any,
    batch_size: int,
    *,
    print_fn: Callable[[str], None] | None = None,
    **options: Any,
) -> MemoryEstimate:
    """Estimate, print a table of layers and totals, and return the estimate.

    Takes the options of :func:`estimate`; ``print_fn`` receives the text
    (``print`` by default, like ``model.summary``).
    """
    from .report import render_summary

    check_options("summary", options, "print_fn")
    est = estimate(model, batch_size, **options)
    (print_fn or print)(render_summary(est))
    return est
