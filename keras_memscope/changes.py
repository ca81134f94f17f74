"""What if? The estimate under a change, and the change applied for real.

``whatif`` answers "how much would mixed precision / recomputation / another
optimizer / gradient accumulation / freezing save?" without the user
rebuilding anything; ``apply`` builds the changed model for a training run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .records import MemoryEstimate

Freeze = Iterable[str] | Callable[[Any], bool] | None


def _chosen(model: Any, freeze: Freeze) -> list[Any]:
    """The layers ``freeze`` names (every layer of a name, nested ones too:
    the sublayers of different attention layers share theirs), or those its
    predicate picks."""
    layers = list(model._flatten_layers(include_self=False))
    if isinstance(freeze, str):
        freeze = [freeze]  # one layer's name
    if callable(freeze):
        return [layer for layer in layers if freeze(layer)]
    chosen = []
    for name in freeze or ():
        named = [layer for layer in layers if layer.name == name]
        if not named:
            raise ValueError(f"no layer named {name!r} in model {model.name!r}")
        chosen += [layer for layer in named if layer not in chosen]
    return chosen


def weighted_layers(model: Any) -> list[Any]:
    """The outermost layers that own trainable weights, in order: a recurrent
    layer rather than its cell, an attention layer rather than its
    projections; nested models are opened."""
    import keras

    found = []
    for layer in model._flatten_layers(include_self=False, recursive=False):
        if isinstance(layer, keras.Model):
            found += weighted_layers(layer)
        elif layer.trainable_weights:
            found.append(layer)
    return found


@contextlib.contextmanager
def frozen(model: Any, freeze: Freeze) -> Iterator[None]:
    """Layers set non-trainable for the duration, then restored."""
    chosen = _chosen(model, freeze)
    before = [layer.trainable for layer in chosen]
    try:
        for layer in chosen:
            layer.trainable = False
        yield
    finally:
        for layer, was in zip(chosen, before):
            layer.trainable = was


def _check_steps(steps: Any) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"accumulation_steps must be a positive integer, got {steps!r}")


def accumulating(optimizer: Any, model: Any, steps: int) -> Any:
    """A copy of the (resolved) optimizer that accumulates ``steps`` gradients
    (one step: no accumulation)."""
    from .optimizers import accumulation_steps, resolve

    opt, _ = resolve(optimizer, model)
    already = accumulation_steps(opt)
    if already:
        raise ValueError(
            f"the optimizer already accumulates {already} steps "
            f"(gradient_accumulation_steps={already}), so accumulation_steps={steps} would "
            f"replace it and change what batch_size means: pass an optimizer without "
            f"gradient_accumulation_steps, or leave accumulation_steps out")
    if steps == 1:
        return type(opt).from_config(opt.get_config())
    config = opt.get_config()
    if "gradient_accumulation_steps" not in config and "inner_optimizer" not in config:
        raise ValueError(
            f"{type(opt).__name__} takes no gradient_accumulation_steps in Keras, so "
            f"accumulation_steps={steps} cannot be applied to it: set "
            "gradient_accumulation_steps on an optimizer that has it (Adam, SGD, ...), "
            "or leave accumulation_steps out")
    if "inner_optimizer" in config:  # a LossScaleOptimizer: accumulate inside
        inner = opt.inner_optimizer.get_config()
        inner["gradient_accumulation_steps"] = steps
        return type(opt)(type(opt.inner_optimizer).from_config(inner))
    config["gradient_accumulation_steps"] = steps
    return type(opt).from_config(config)


def whatif(
    model: Any,
    batch_size: int,
    *,
    dtype_policy: str | None = None,
    optimizer: Any = None,
    remat: Any = None,
    accumulation_steps: int | None = None,
    freeze: Freeze = None,
    **options: Any,
) -> MemoryEstimate:
    """The estimate of a training step of ``model`` under one or more changes.

    Args:
        model: as for :func:`estimate`.
        batch_size: the effective batch; with ``accumulation_steps=k`` each
            step trains on ``batch_size / k`` samples (k must divide it, or
            the effective batch would change) and the optimizer accumulates k
            gradients.
        dtype_policy: e.g. ``"mixed_bfloat16"``.
        optimizer: a name or an instance.
        remat: as for :func:`estimate` (a RematScope mode, ``"checkpoints"``,
            a number of segments).
        accumulation_steps: gradient accumulation.
        freeze: layer names, or a predicate on layers, to make non-trainable.
        options: more :func:`estimate` options (``device``, ``input_shape``...).
    """
    from .estimator import _check_batch_size, check_options, estimate
    from .transform import resolve_model

    check_options("whatif", options, "dtype_policy", "accumulation_steps", "freeze")
    model = resolve_model(model)
    batch_size = _check_batch_size(batch_size)
    step_batch = batch_size
    if accumulation_steps is not None:
        _check_steps(accumulation_steps)
        if batch_size % accumulation_steps:
            divisors = [k for k in range(1, batch_size + 1) if batch_size % k == 0]
            raise ValueError(
                f"batch {batch_size} does not split into {accumulation_steps} equal "
                f"micro-batches, so accumulation would change the effective batch: use "
                f"accumulation_steps in {divisors}, or a batch_size that "
                f"{accumulation_steps} divides")
        step_batch = batch_size // accumulation_steps
        optimizer = accumulating(optimizer, model, accumulation_steps)
    with frozen(model, freeze):
        est = estimate(model, step_batch, dtype_policy=dtype_policy, optimizer=optimizer,
                       remat=remat, **options)
    changes = []
    if dtype_policy:
        changes.append(f"dtype policy {dtype_policy}")
    if remat is not None:
        changes.append(f"recompute {est.remat}")
    if accumulation_steps:
        changes.append(f"batch {step_batch} x {accumulation_steps} accumulation steps "
                       f"(effective batch {batch_size})")
    if freeze is not None:
        changes.append(f"{len(_chosen(model, freeze))} layer(s) frozen")
    if optimizer is not None and not accumulation_steps:
        changes.append(f"optimizer {est.optimizer}")
    if changes:
        import dataclasses

        est = dataclasses.replace(est, notes=(*est.notes, "what-if: " + "; ".join(changes)))
    return est


def apply(
    model: Any,
    *,
    dtype_policy: str | None = None,
    optimizer: Any = None,
    remat: Any = None,
    accumulation_steps: int | None = None,
    freeze: Freeze = None,
    loss: Any = None,
) -> Any:
    """A new model with the changes applied, ready for ``fit``: rebuilt from
    the config under the dtype policy and ``keras.RematScope`` (Keras modes
    only), the original weights copied in, the layers frozen, compiled with
    the optimizer (accumulating gradients when asked) and the original loss.
    """
    import keras

    from .estimator import _steps_per_execution
    from .remat import FAILS_IN_FIT_ON_TF, activation_blockers, blocked_note, parse_remat
    from .transform import _check_rebuildable, _set_policy, check_policy, from_own_config

    _check_rebuildable(model, "apply()")
    # every argument checked before the model is rebuilt
    if optimizer is not None:
        from .optimizers import resolve

        optimizer, _ = resolve(optimizer, model)
    if dtype_policy is not None:
        check_policy(dtype_policy)
    if accumulation_steps is not None:
        _check_steps(accumulation_steps)
        accumulating(optimizer if optimizer is not None
                     else getattr(model, "optimizer", None) or "adam", model, accumulation_steps)
    _chosen(model, freeze)
    spec = parse_remat(remat)
    if spec is not None and spec.mode == "checkpoints":
        raise ValueError("Keras has no segment checkpointing: use remat='activations' "
                         "(or wrap blocks in keras.remat yourself)")
    blockers = activation_blockers(model) if spec is not None and \
        spec.mode == "activations" else []
    if blockers:
        raise ValueError("apply(remat='activations'): " + blocked_note(blockers)
                         + "; the model would fail in its first training step")
    if spec is not None and spec.mode in FAILS_IN_FIT_ON_TF:
        import warnings

        warnings.warn(f"RematScope mode {spec.mode!r} fails inside fit() on TensorFlow "
                      "(keras#21207); mode='activations' works", stacklevel=2)
    config = model.get_config()
    if dtype_policy is not None:
        config = _set_policy(config, dtype_policy)
    scope = (keras.RematScope(mode=spec.mode, output_size_threshold=spec.output_size_threshold,
                              layer_names=list(spec.layer_names))
             if spec is not None else contextlib.nullcontext())
    with scope:
        new = from_own_config(model, config, "apply()", dtype_policy)
    new.set_weights(model.get_weights())
    for layer in _chosen(new, freeze):
        layer.trainable = False
    opt = optimizer if optimizer is not None else getattr(model, "optimizer", None) or "adam"
    if accumulation_steps:
        opt = accumulating(opt, model, accumulation_steps)
    elif isinstance(opt, keras.optimizers.Optimizer):
        opt = type(opt).from_config(opt.get_config())
    # fit's steps per call as the user compiled them (a loop of several
    # holds the next batch through each step)
    new.compile(optimizer=opt, loss=loss or getattr(model, "loss", None),
                steps_per_execution=_steps_per_execution(model))
    return new
