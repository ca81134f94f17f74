"""Real memory of training steps, read from TensorFlow's allocator.

On the CPU, TensorFlow's default allocator does not count small tensors; with
``TF_CPU_ALLOCATOR_USE_BFC=true`` set before TensorFlow is imported the CPU
uses the same BFC allocator as GPUs and every allocation is counted. A
measurement therefore runs in a fresh Python process with that set (the model
travels as its Keras config, or as a ``module:function`` that builds it),
unless the calling process was started with it.

Method: build, compile, hold one synthetic batch as tensors, run one warm-up
step (it traces), then for each step reset the peak statistics, run the step
and read the peak. ``persistent_bytes`` is what was allocated before a step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any

from .optimizers import by_name
from .records import Measurement

ENV_BFC = "TF_CPU_ALLOCATOR_USE_BFC"


def peak_rss_bytes() -> int:
    """This process's peak resident set size.

    Read from ``/proc/self/status`` (``VmHWM``, which starts afresh when a
    process starts); ``getrusage`` is the fallback, but on Linux its maximum
    survives ``exec`` and so can report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _default_loss(output_shape: tuple[int | None, ...]) -> str:
    if len(output_shape) >= 2 and (output_shape[-1] or 1) > 1:
        return "sparse_categorical_crossentropy"
    return "mse"


def _output_shapes(model: Any, specs: list[tuple[str, tuple, str]]) -> list[tuple]:
    """The shapes of ``model``'s outputs for inputs of ``specs`` (a subclassed
    model is traced symbolically: it need not implement
    ``compute_output_shape``)."""
    import keras

    outputs = getattr(model, "outputs", None)
    if outputs:
        return [tuple(o.shape) for o in outputs]
    args = [keras.KerasTensor(shape, dtype=dtype) for _, shape, dtype in specs]
    spec = model.compute_output_spec(args[0] if len(args) == 1 else args)
    return [tuple(s.shape) for s in keras.tree.flatten(spec)]


def synthetic_tensor(shape: Any, dtype: str, *, zeros: bool = False) -> Any:
    """A batch-sized tensor that TensorFlow's allocator holds, made in one
    allocation.

    Floating tensors are ones (``zeros=True`` for zeros), all others (integer,
    boolean, string) zeros: the memory a step takes does not depend on the
    values. Made by ``tf.ones`` / ``tf.zeros`` (one ``Fill``), as a batch made
    by a dataset is one tensor. Not ``tf.constant`` of a NumPy array: such a
    constant sometimes keeps the array's own buffer instead of copying it
    (about one array in six here, by where NumPy put it), and the allocator
    never sees the batch. Not ``tf.random``: its temporaries (2.1 MiB beside
    a 0.75 MiB batch) leave free chunks where later tensors go.
    """
    import tensorflow as tf

    if zeros or not (dtype.startswith("float") or dtype == "bfloat16"):
        return tf.zeros(shape, dtype=dtype)
    return tf.ones(shape, dtype=dtype)


def synthetic_batch(model: Any, batch_size: int, *, loss: Any = None,
                    input_shape: Any = None) -> tuple[Any, Any, Any]:
    """``(x, y, loss)``: a batch of ``batch_size`` for ``model``'s inputs
    (:func:`synthetic_tensor`), targets shaped for its outputs and losses,
    and the loss it trains with: ``loss``, else the model's compiled one,
    else per output sparse categorical cross-entropy for an output of more
    than one unit and mean squared error otherwise (class indices as
    targets for a sparse loss, zeros like the output for any other)."""
    from .graph import concrete_input_shapes

    specs = concrete_input_shapes(model, batch_size, input_shape)
    xs = [synthetic_tensor(shape, dtype) for _, shape, dtype in specs]
    x = xs[0] if len(xs) == 1 else xs
    out_shapes = _output_shapes(model, specs)
    if loss is None:
        loss = getattr(model, "loss", None) or [_default_loss(s) for s in out_shapes]
        if isinstance(loss, list) and len(loss) == 1:
            loss = loss[0]
    names = list(getattr(model, "output_names", None) or [])
    if isinstance(loss, dict):  # one loss per named output
        losses = [loss.get(n) for n in names]
    elif isinstance(loss, (list, tuple)):
        losses = list(loss)
    else:
        losses = [loss] * len(out_shapes)
    ys = []
    for shape, item in zip(out_shapes, losses):
        if "sparse" in _loss_name(item).lower():  # class indices
            ys.append(synthetic_tensor((batch_size, *shape[1:-1]), "int32"))
        else:
            ys.append(synthetic_tensor((batch_size, *shape[1:]), "float32", zeros=True))
    if isinstance(getattr(model, "output", None), dict) and len(names) == len(ys):
        y = dict(zip(names, ys))  # the targets in the outputs' structure
    else:
        y = ys[0] if len(ys) == 1 else ys
    return x, y, loss


def run_steps(model: Any, batch_size: int, *, optimizer: Any, loss: Any, steps: int,
              device: str, input_shape: Any = None,
              around_step: Callable[[Callable[[], Any]], Any] | None = None,
              read_memory: bool = True) -> dict[str, Any]:
    """Compile ``model``, train it on one synthetic batch, read the allocator.

    Runs in the current process; the caller is responsible for the allocator
    setting (see :func:`measure`). ``around_step(step)``, where given, runs
    each measured step (not the warm-up) by calling ``step()``
    (``benchmarks/step_phases.py`` profiles each step's allocations). With
    ``read_memory=False`` the allocator is not read (its peaks and current
    bytes come back as 0): a caller that wants the steps only, in a process
    whose CPU allocator keeps no statistics.
    """
    import tensorflow as tf

    x, y, loss = synthetic_batch(model, batch_size, loss=loss, input_shape=input_shape)
    if isinstance(optimizer, str):
        optimizer = by_name(optimizer)
    model.compile(optimizer=optimizer, loss=loss, jit_compile=False)
    dev = "GPU:0" if device == "gpu" else "CPU:0"
    model.train_on_batch(x, y)
    peaks, currents = [], []
    for _ in range(steps):
        if read_memory:
            _reset_peak(dev)
            currents.append(tf.config.experimental.get_memory_info(dev)["current"])
        if around_step is not None:
            around_step(lambda: model.train_on_batch(x, y))
        else:
            model.train_on_batch(x, y)
        if read_memory:
            peaks.append(tf.config.experimental.get_memory_info(dev)["peak"])
    if not read_memory:
        peaks, currents = [0] * steps, [0]
    return {"step_peak_bytes": peaks, "persistent_bytes": min(currents),
            "rss_peak_bytes": peak_rss_bytes()}


def _reset_peak(dev: str) -> None:
    """``reset_memory_stats``, with what to do where the allocator keeps no
    statistics (a CPU's default allocator without the BFC one)."""
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats(dev)
    except ValueError as exc:
        raise RuntimeError(
            f"the allocator of {dev} keeps no memory statistics in this process ({exc}); "
            f"on the CPU set {ENV_BFC}=true before TensorFlow is imported, or call "
            "memscope.measure without in_process=True (it measures in a fresh process "
            "with the BFC allocator on)") from None


def _worker_main() -> None:
    """Entry of the measuring subprocess: a JSON spec on stdin, JSON on stdout."""
    spec = json.load(sys.stdin)
    import importlib

    import keras

    # the caller's import path
    sys.path[:0] = [p for p in spec.get("sys_path", []) if p not in sys.path]
    # the classes of the model defined outside Keras, importable here as they
    # were in the caller: not registered with Keras, they are found by the
    # name they were saved under
    custom = {}
    for module, qualname in spec.get("classes", []):
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        custom[qualname.split(".")[-1]] = found
    if spec.get("builder"):
        module, _, func = spec["builder"].partition(":")
        model = getattr(importlib.import_module(module), func)(**spec.get("builder_kwargs", {}))
    else:
        if spec.get("dtype_policy"):
            keras.config.set_dtype_policy(spec["dtype_policy"])
        if spec.get("saved"):  # a model whose layers keep assets (vocabularies)
            model = keras.saving.load_model(spec["saved"], custom_objects=custom)
        else:
            model = keras.saving.deserialize_keras_object(spec["model"],
                                                          custom_objects=custom)
        if spec.get("input_shape") and not model.built:
            model.build((None, *spec["input_shape"]))
    optimizer = spec.get("optimizer") or "adam"
    if isinstance(optimizer, dict):
        optimizer = keras.optimizers.deserialize(optimizer)
    spec["loss"] = _loss_from_spec(spec.get("loss"))
    result = run_steps(model, spec["batch_size"], optimizer=optimizer, loss=spec.get("loss"),
                       steps=spec["steps"], device=spec["device"],
                       input_shape=spec.get("input_shape"))
    result["model_name"] = model.name
    result["optimizer"] = type(model.optimizer).__name__
    json.dump(result, sys.stdout)


class MeasurementKilled(RuntimeError):
    """The measuring process died by a signal (``signal``): under an
    allocator limit, what oneDNN's kernels do when the allocator refuses
    them (SIGSEGV where TensorFlow's own kernels raise ResourceExhausted)."""

    def __init__(self, message: str, signal: int) -> None:
        super().__init__(message)
        self.signal = signal


def _run_process(args: list[str], *, env: dict[str, str], input: str,
                 timeout: float) -> subprocess.CompletedProcess:
    """``args`` run in a new process, its text output captured (the one place
    this module starts processes; the tests start them faster, forked from
    one that has imported TensorFlow: ``tests/forked.py``)."""
    return subprocess.run(args, input=input, capture_output=True, text=True, env=env,
                          timeout=timeout)


def measure_subprocess(spec: dict[str, Any], *, timeout_s: float = 1800,
                       extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one measurement spec in a fresh process with the BFC allocator on."""
    env = dict(os.environ)
    env.update(extra_env or {})
    env[ENV_BFC] = "true"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.setdefault("KERAS_BACKEND", "tensorflow")
    proc = _run_process(
        [sys.executable, "-c", "from keras_memscope.measure import _worker_main; _worker_main()"],
        env=env, input=json.dumps(spec), timeout=timeout_s)
    if proc.returncode < 0:
        raise MeasurementKilled(
            f"measurement process was killed by signal {-proc.returncode}", -proc.returncode)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        raise RuntimeError("measurement process failed:\n" + "\n".join(tail))
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    return json.loads(lines[-1])


def measure(
    model: Any,
    batch_size: int,
    *,
    optimizer: Any = None,
    steps: int = 5,
    device: str | None = None,
    input_shape: Any = None,
    loss: Any = None,
    in_process: bool | None = None,
) -> Measurement:
    """Measure the allocator peak of real training steps of ``model``.

    In a fresh subprocess (the caller's session is untouched) unless this
    process was started with ``TF_CPU_ALLOCATOR_USE_BFC=true`` or runs on a GPU,
    where it measures in-process on a copy of the model.
    """
    import keras

    from .estimator import _check_batch_size, _check_model

    batch_size = _check_batch_size(batch_size)
    _check_model(model)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if device is None:
        import tensorflow as tf

        device = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    if optimizer is None:
        optimizer = getattr(model, "optimizer", None) or "adam"
    opt_spec = optimizer if isinstance(optimizer, str) else keras.optimizers.serialize(optimizer)
    if in_process is None:
        in_process = device == "gpu" or os.environ.get(ENV_BFC, "").lower() == "true"
    if in_process:
        clone = _copy(model)
        opt = by_name(opt_spec) if isinstance(opt_spec, str) else \
            keras.optimizers.deserialize(opt_spec)
        raw = run_steps(clone, batch_size, optimizer=opt, loss=loss, steps=steps,
                        device=device, input_shape=input_shape)
        raw["model_name"] = model.name
        raw["optimizer"] = type(opt).__name__
    else:
        try:
            config = keras.saving.serialize_keras_object(model)
            json.dumps(config)
        except Exception as exc:
            raise ValueError(
                f"model {model.name!r} cannot travel to the measuring process as a "
                f"config ({exc}); register custom layers with "
                "keras.saving.register_keras_serializable, or start Python with "
                "TF_CPU_ALLOCATOR_USE_BFC=true and pass in_process=True"
            ) from exc
        classes = _custom_classes(model)
        saved = _saved_with_assets(model)
        spec = {"model": config, "saved": saved, "batch_size": batch_size,
                "optimizer": opt_spec, "classes": classes,
                "sys_path": [p or os.getcwd() for p in sys.path],
                "steps": steps, "device": device, "loss": _loss_spec(loss),
                "input_shape": list(input_shape) if input_shape else None,
                "dtype_policy": getattr(getattr(model, "dtype_policy", None), "name", None)}
        try:
            raw = measure_subprocess(spec)
        finally:
            if saved:
                os.remove(saved)
    peaks = raw["step_peak_bytes"]
    return Measurement(
        model_name=raw["model_name"], batch_size=batch_size, device=device,
        optimizer=raw["optimizer"], peak_bytes=max(peaks),
        persistent_bytes=raw["persistent_bytes"], step_peak_bytes=tuple(peaks),
        rss_peak_bytes=raw["rss_peak_bytes"],
        allocator="BFC" if (device == "gpu" or not in_process
                            or os.environ.get(ENV_BFC, "").lower() == "true") else "default",
        in_subprocess=not in_process,
    )


def _model_and_layers(model: Any) -> list[Any]:
    """``model`` and every layer inside it, nested ones included."""
    return [model, *model._flatten_layers(include_self=False)]


def _copy(model: Any) -> Any:
    """A copy of ``model`` to train in this process: a clone, or where a
    layer keeps assets (:func:`_saved_with_assets`) the model saved and
    loaded, its own layer classes at hand."""
    import keras

    saved = _saved_with_assets(model)
    if not saved:
        return keras.models.clone_model(model)
    classes = {type(layer).__name__: type(layer) for layer in _model_and_layers(model)}
    try:
        return keras.saving.load_model(saved, custom_objects=classes)
    finally:
        os.remove(saved)


def _saved_with_assets(model: Any) -> str | None:
    """A ``.keras`` file of ``model`` where a layer of it keeps state its
    config does not hold (a lookup layer's vocabulary: ``TextVectorization``,
    ``StringLookup``, ``IntegerLookup`` save it as an asset, and without it
    their table is empty in the measuring process); None for other models,
    which travel as their config alone."""
    if not any(hasattr(layer, "save_assets") for layer in _model_and_layers(model)):
        return None
    import tempfile

    fd, path = tempfile.mkstemp(prefix="memscope-", suffix=".keras")
    os.close(fd)
    try:
        model.save(path)
    except Exception as exc:
        os.remove(path)
        raise ValueError(
            f"model {model.name!r} keeps assets (a lookup layer's vocabulary) and could "
            f"not be saved to travel to the measuring process ({exc}); start Python "
            "with TF_CPU_ALLOCATOR_USE_BFC=true and pass in_process=True") from exc
    return path


def _loss_name(loss: Any) -> str:
    """What a loss is called: its name, its config's class and name, or its
    class's or function's name."""
    if isinstance(loss, str):
        return loss
    if isinstance(loss, dict):
        return f"{loss.get('class_name', '')} {loss.get('config', {}).get('name', '')}"
    return getattr(loss, "__name__", None) or type(loss).__name__


def _loss_from_spec(spec: Any) -> Any:
    """The loss (or losses per output) that :func:`_loss_spec` sent."""
    import keras

    if isinstance(spec, dict) and "class_name" in spec:
        return keras.losses.get(spec)
    if isinstance(spec, dict):
        return {name: _loss_from_spec(item) for name, item in spec.items()}
    if isinstance(spec, list):
        return [_loss_from_spec(item) for item in spec]
    return spec


def _loss_spec(loss: Any) -> Any:
    """``loss`` as it travels to the measuring process: a name as it is, a
    Keras loss (object or registered function) as its config; a dict or list
    of them (one per output) item by item."""
    if loss is None or isinstance(loss, str):
        return loss
    if isinstance(loss, dict):
        return {name: _loss_spec(item) for name, item in loss.items()}
    if isinstance(loss, (list, tuple)):
        return [_loss_spec(item) for item in loss]
    import keras

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Keras' warning about a lambda)
            spec = keras.losses.serialize(loss)
        json.dumps(spec)
        if not callable(keras.losses.get(spec)):
            raise ValueError
    except Exception:
        raise ValueError(
            f"loss {loss!r} cannot travel to the measuring process: give its name "
            "(e.g. 'mse'), a keras.losses object, or a function registered with "
            "keras.saving.register_keras_serializable; or start Python with "
            "TF_CPU_ALLOCATOR_USE_BFC=true and pass in_process=True") from None
    return spec


def _custom_classes(model: Any) -> list[tuple[str, str]]:
    """The classes of ``model`` and its layers defined outside Keras, as
    (module, qualified name), for the measuring process to import before it
    rebuilds the model."""
    classes = set()
    for layer in _model_and_layers(model):
        module = type(layer).__module__
        if module.split(".")[0] not in ("keras", "tensorflow", "tf_keras", "keras_hub"):
            classes.add((module, type(layer).__qualname__))
    main = sorted(q for m, q in classes if m == "__main__")
    if main:
        raise ValueError(
            f"model {model.name!r} uses class(es) defined in __main__ ({', '.join(main)}), "
            "which the measuring process cannot import: move them into a module, or start "
            "Python with TF_CPU_ALLOCATOR_USE_BFC=true and pass in_process=True")
    return sorted(classes)


def _layer_of(op_name: str, names: dict[str, str]) -> str | None:
    """The layer an op belongs to, from its name scope: the outermost scope
    component that is a layer's name (Keras adds ``_1`` when it re-enters a
    scope, so one numeric suffix is also tried)."""
    import re

    parts = op_name.split("/")
    if parts and parts[0] == "gradient_tape":
        parts = parts[1:]
    for part in parts[1:]:
        if part in names:
            return names[part]
        stripped = re.sub(r"_\d+$", "", part)
        if stripped in names:
            return names[stripped]
    return None


def profile_step(model: Any, batch_size: int, *, optimizer: Any = "adam", loss: Any = None,
                 steps: int = 3, input_shape: Any = None) -> dict[str, Any]:
    """Time real training steps with TensorFlow's profiler, in this process.

    Returns ``{"step_s": median wall time of a step, "ops_s": summed op time
    per step, "by_layer": {layer name: s}, "by_category": {category: s}}``,
    ops attributed to layers through their name scopes; optimizer ops go to
    ``"optimizer"``, the rest (loss, metrics) to ``"other"``.
    """
    import statistics
    import time

    from .graph import concrete_input_shapes
    from .rules import category_of

    specs = concrete_input_shapes(model, batch_size, input_shape)
    xs = [synthetic_tensor(shape, dtype) for _, shape, dtype in specs]
    x = xs[0] if len(xs) == 1 else xs
    out_shape = tuple(model.outputs[0].shape) if getattr(model, "outputs", None) else None
    loss = loss or (_default_loss(out_shape) if out_shape else "mse")
    if isinstance(optimizer, str):
        optimizer = by_name(optimizer)
    model.compile(optimizer=optimizer, loss=loss, jit_compile=False)
    if "sparse" in str(loss):
        y = synthetic_tensor((batch_size, *out_shape[1:-1]), "int32")
    else:
        y = synthetic_tensor((batch_size, *out_shape[1:]), "float32", zeros=True)
    model.train_on_batch(x, y)
    model.train_on_batch(x, y)
    walls = []
    for _ in range(steps):
        t = time.perf_counter()
        model.train_on_batch(x, y)
        walls.append(time.perf_counter() - t)
    ops = _profiled(lambda: [model.train_on_batch(x, y) for _ in range(steps)], _op_durations)
    layers = {layer.name: layer for layer in model._flatten_layers(include_self=False)}
    names = {n: n for n in layers}
    by_layer: dict[str, float] = {}
    by_category: dict[str, float] = {}
    opt_name = type(model.optimizer).__name__.lower()
    for name, seconds in ops.items():
        seconds /= steps
        layer = _layer_of(name, names)
        if layer is not None:
            by_layer[layer] = by_layer.get(layer, 0.0) + seconds
            cat = category_of(layers[layer])
        elif name.split("/")[0].startswith((opt_name, "loss_scale")):
            cat = "optimizer"
        else:
            cat = "other"
        by_category[cat] = by_category.get(cat, 0.0) + seconds
    return {"step_s": statistics.median(walls), "ops_s": sum(by_category.values()),
            "by_layer": by_layer, "by_category": by_category}


def _profiled(run: Callable[[], Any], read: Callable[[str], Any]) -> Any:
    """Run ``run()`` under TensorFlow's profiler and return ``read(path)`` of
    the trace it wrote (an ``.xplane.pb`` file, removed afterwards)."""
    import glob
    import shutil
    import tempfile

    import tensorflow as tf

    logdir = tempfile.mkdtemp(prefix="memscope-prof-")
    try:
        tf.profiler.experimental.start(logdir)
        try:
            run()
        finally:
            tf.profiler.experimental.stop()
        return read(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0])
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def _load_xspace(path: str) -> Any:
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def _xspace_events(path: str, wanted: tuple[str, ...]) -> list[tuple[str, dict]]:
    """The events of a profiler XSpace file named one of ``wanted`` (e.g.
    ``MemoryAllocation``), in time order, each with its stats by name."""
    found = []
    for plane in _load_xspace(path).planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            for ev in line.events:
                name = names.get(ev.metadata_id, "")
                if name not in wanted:
                    continue
                stats = {}
                for st in ev.stats:
                    stats[stat_names.get(st.metadata_id)] = (
                        st.str_value or (stat_names.get(st.ref_value) if st.ref_value else None)
                        or st.int64_value or st.uint64_value or st.double_value)
                found.append((line.timestamp_ns * 1000 + ev.offset_ps, name, stats))
    found.sort(key=lambda e: e[0])
    return [(name, stats) for _, name, stats in found]


def _op_events(path: str) -> list[tuple[int, int, str, str]]:
    """``(start ps, end ps, executor thread, "name:Type")`` of every
    TensorFlow op in a profiler XSpace file, in time order."""
    found = []
    for plane in _load_xspace(path).planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_Compute") and "Executor" not in line.name:
                continue
            for ev in line.events:
                name = names.get(ev.metadata_id, "")
                # ops are "name:Type"; executor bookkeeping is "Class::method"
                if name.count(":") != 1:
                    continue
                start = line.timestamp_ns * 1000 + ev.offset_ps
                found.append((start, start + ev.duration_ps, line.name, name))
    return sorted(found)


def _op_durations(path: str) -> dict[str, float]:
    """Seconds per TensorFlow op name from a profiler XSpace file."""
    out: dict[str, float] = {}
    for start, end, _, name in _op_events(path):
        op = name.rsplit(":", 1)[0]
        out[op] = out.get(op, 0.0) + (end - start) * 1e-12
    return out
