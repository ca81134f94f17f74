"""Rebuild a model with a change, without allocating its weights.

``rebuild`` re-creates a Functional or Sequential model from its config inside
a weightless scope (every variable deferred, nothing allocated, and nothing
left for a later scope to allocate), with a different dtype policy or with
some layers frozen. The user's model is not touched.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable
from typing import Any

Freeze = Iterable[str] | Callable[[Any], bool] | None


def _set_policy(config: Any, policy: str) -> Any:
    """Every float dtype policy in a (nested) config set to ``policy``."""
    if isinstance(config, dict):
        out = {}
        for key, value in config.items():
            if key == "dtype" and _is_float_policy(value):
                out[key] = policy
            else:
                out[key] = _set_policy(value, policy)
        return out
    if isinstance(config, list):
        return [_set_policy(v, policy) for v in config]
    return config


def _is_float_policy(value: Any) -> bool:
    """A layer's serialized dtype policy (a plain dtype string, as an
    InputLayer has, is a tensor dtype and stays)."""
    if not (isinstance(value, dict)
            and value.get("class_name") in ("DTypePolicy", "FloatDTypePolicy")):
        return False
    name = value.get("config", {}).get("name")
    return name in ("float32", "float16", "bfloat16", "mixed_float16", "mixed_bfloat16")


def _check_rebuildable(model: Any, what: str) -> None:
    import keras
    from keras.src.models.functional import Functional

    if not isinstance(model, (Functional, keras.Sequential)):
        raise ValueError(
            f"{what} needs a model that can be rebuilt from its config (Sequential or "
            f"Functional); {type(model).__name__} is subclassed: build it yourself with the "
            "change (e.g. under keras.config.set_dtype_policy(...)) and estimate that"
        )


def check_policy(dtype_policy: Any) -> None:
    """A clear error for a dtype policy Keras does not know."""
    import keras

    try:
        keras.dtype_policies.get(dtype_policy)
    except (ValueError, TypeError):
        raise ValueError(
            f"unknown dtype policy {dtype_policy!r}: use e.g. 'float32', "
            "'mixed_float16', 'mixed_bfloat16', 'bfloat16'"
        ) from None


def rebuild(model: Any, *, dtype_policy: str | None = None, freeze: Freeze = None) -> Any:
    """A weightless copy of ``model`` with a dtype policy and/or frozen layers."""
    from .graph import weightless

    what = " and ".join(name for name, value in (("dtype_policy=", dtype_policy),
                                                 ("freeze=", freeze))
                        if value is not None) or "rebuilding"
    _check_rebuildable(model, what)
    config = model.get_config()
    if dtype_policy is not None:
        check_policy(dtype_policy)
        config = _set_policy(copy.deepcopy(config), dtype_policy)
    with weightless():
        clone = from_own_config(model, config, what, dtype_policy)
    # what estimates read from a compiled model: its optimizer and loss
    clone.optimizer = getattr(model, "optimizer", None)
    clone.loss = getattr(model, "loss", None)
    _copy_trainable(model, clone)
    if freeze is not None:
        apply_freeze(clone, freeze)
    return clone


@contextlib.contextmanager
def own_config(model: Any = None) -> Any:
    """A scope for rebuilding ``model`` from its own config in this process.
    Keras' safe mode refuses Lambda layers with Python functions, guarding
    configs read from files; here the functions are the model's own, already
    loaded, so rebuilding them runs no new code. The classes of the model's
    layers are named for the rebuild, so that a custom layer nobody
    registered (``keras.saving.register_keras_serializable``) is found."""
    import keras

    with contextlib.ExitStack() as stack:
        try:
            from keras.src.saving.serialization_lib import SafeModeScope
        except ImportError:  # another Keras layout: keep its default
            pass
        else:
            stack.enter_context(SafeModeScope(False))
        if model is not None:
            stack.enter_context(keras.saving.custom_object_scope(_layer_classes(model)))
        yield


def _layer_classes(model: Any) -> dict[str, type]:
    """The classes of ``model`` and of every layer in it, by class name and
    by the name Keras registers them under."""
    import keras

    found: dict[str, type] = {}
    for layer in model._flatten_layers(include_self=True):
        cls = type(layer)
        found.setdefault(cls.__name__, cls)
        try:
            found.setdefault(keras.saving.get_registered_name(cls), cls)
        except Exception:  # (a class Keras cannot name: its own name serves)
            pass
    return found


def from_own_config(model: Any, config: dict[str, Any], what: str,
                    dtype_policy: str | None = None) -> Any:
    """``type(model).from_config(config)`` inside :func:`own_config` and, when
    given, under ``dtype_policy`` as the global policy (restored after), with
    a clear error where Keras cannot rebuild a layer from its config."""
    import keras

    previous = keras.config.dtype_policy()
    with own_config(model):
        try:
            if dtype_policy is not None:
                keras.config.set_dtype_policy(dtype_policy)
            return type(model).from_config(config)
        except Exception as exc:
            # Keras nests the config in its message; the cause is its last line
            lines = [line for line in str(exc).splitlines() if line.strip()] or [""]
            cause = lines[-1].removeprefix("Exception encountered: ")[:300]
            raise ValueError(
                f"{what} rebuilds the model from its config, and Keras could not: "
                f"{cause}. A custom layer needs a get_config() that returns its "
                "__init__ arguments; or build the changed model yourself and estimate that"
            ) from exc
        finally:
            keras.config.set_dtype_policy(previous)


def _copy_trainable(src: Any, dst: Any) -> None:
    for a, b in zip(src._flatten_layers(include_self=False),
                    dst._flatten_layers(include_self=False)):
        b.trainable = a.trainable


def apply_freeze(model: Any, freeze: Freeze) -> list[str]:
    """Set ``trainable=False`` on the layers named (or matched by a predicate).

    Returns the names frozen; unknown names are an error.
    """
    layers = {layer.name: layer for layer in model._flatten_layers(include_self=False)}
    if callable(freeze):
        chosen = [name for name, layer in layers.items() if freeze(layer)]
    else:
        chosen = list(freeze)  # type: ignore[arg-type]
        missing = [n for n in chosen if n not in layers]
        if missing:
            raise ValueError(f"no layer named {missing[0]!r} in model {model.name!r}; "
                             f"layers: {', '.join(list(layers)[:12])}...")
    for name in chosen:
        layers[name].trainable = False
    return chosen


def with_dtype_policy(model: Any, policy: str) -> Any:
    return rebuild(model, dtype_policy=policy)


def _from_config(config: dict[str, Any]) -> Any:
    """A model from a Keras config: a full serialized object (with
    ``class_name``) or the ``get_config()`` of a Functional or Sequential."""
    import keras

    if "class_name" in config and "config" in config:
        # compile settings are read separately: compiling would build the
        # optimizer's slots
        config = {k: v for k, v in config.items() if k != "compile_config"}
        return keras.saving.deserialize_keras_object(config, safe_mode=True)
    errors = []
    for cls in (keras.Model, keras.Sequential):
        try:
            return cls.from_config(config)
        except Exception as exc:  # try the next form
            errors.append(f"{cls.__name__}: {exc}")
    raise ValueError("cannot build a model from this config (" + "; ".join(errors)[:300] + ")")


def _keras_file_config(path: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The model config (and compile config) inside a .keras archive,
    without reading its weights."""
    import json
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("config.json"))
    except (OSError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a readable .keras file ({exc})") from None
    return data, data.get("compile_config")


def resolve_model(source: Any) -> Any:
    """A Keras model from what ``estimate`` accepts.

    A model is returned as it is. A zero-argument callable, a config (dict,
    JSON text, or a ``.keras`` file, whose weights are not read) is built
    without allocating any weight (``graph.weightless``) and left that way.
    """
    import json
    import os

    import keras

    from .graph import weightless

    if isinstance(source, keras.Layer):
        return source
    compile_config = None
    if isinstance(source, (str, os.PathLike)):
        text = str(source)
        if text.endswith(".keras"):
            if not os.path.exists(text):
                raise ValueError(f"no such file: {text}")
            source, compile_config = _keras_file_config(text)
        elif text.lstrip().startswith("{"):
            try:
                source = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"model config is not valid JSON: {exc}") from None
        else:
            raise TypeError(
                f"cannot tell what model {text[:60]!r} is: pass a Keras model, a callable "
                "that builds one, a config dict or JSON text, or a .keras file path"
            )
    if isinstance(source, dict):
        compile_config = compile_config or source.get("compile_config")
        try:
            with weightless():
                model = _from_config(source)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"cannot build the model from its config: {exc}") from None
    elif callable(source):
        with weightless():
            model = source()
        if not isinstance(model, keras.Layer):
            raise TypeError(f"the model builder returned {type(model).__name__}, not a "
                            "Keras model")
    else:
        raise TypeError(
            f"expected a Keras model, a callable that builds one, a config or a .keras file; "
            f"got {type(source).__name__}"
        )
    if compile_config:
        _attach_compile_config(model, compile_config)
    return model


def _attach_compile_config(model: Any, compile_config: dict[str, Any]) -> None:
    """The optimizer and loss a .keras file was compiled with, for estimates
    (the model itself is not compiled)."""
    import keras

    opt = compile_config.get("optimizer")
    if opt is not None:
        try:
            model.optimizer = keras.optimizers.deserialize(opt)
        except Exception:
            pass
    model.loss = compile_config.get("loss")
