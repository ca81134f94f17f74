"""MemScopeCallback: measured memory beside the estimate, while training."""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from .records import MemoryEstimate
from .units import human_bytes

logger = logging.getLogger(__name__)


class TFMemorySource:
    """Reads TensorFlow's allocator statistics for named devices."""

    def devices(self, model: Any) -> list[str]:
        import tensorflow as tf

        strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
        names: list[str] = []
        extended = getattr(strategy, "extended", None)
        try:
            workers = extended.worker_devices if extended is not None else ()
        except (RuntimeError, NotImplementedError, AttributeError):
            workers = ()  # the default strategy (no distribution) has no list
        for d in workers or ():
            names.append(_short_device(d))
        if len(names) > 1 or (names and isinstance(strategy, tf.distribute.MirroredStrategy)):
            return names
        if tf.config.list_logical_devices("GPU"):
            return ["GPU:0"]
        return ["CPU:0"]

    def read(self, device: str) -> tuple[int, int]:
        import tensorflow as tf

        info = tf.config.experimental.get_memory_info(device)
        return int(info["current"]), int(info["peak"])

    def reset(self, device: str) -> None:
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats(device)


def _short_device(name: str) -> str:
    """'/job:localhost/replica:0/task:0/device:GPU:1' -> 'GPU:1'."""
    tail = name.rsplit("device:", 1)[-1]
    return tail.upper().replace("XLA_", "") if tail else name


def _key(device: str) -> str:
    return device.lower().replace(":", "")


class MemScopeCallback(keras.callbacks.Callback):
    """Log measured allocator memory next to keras_memscope's estimate.

    On ``on_train_begin`` it estimates the training step for the batch size
    ``fit`` uses (read from ``fit``, or given as ``batch_size``) and logs one
    line. At the end of each epoch (or batch, with ``log_every="batch"``) it
    reads the current and peak memory of every device the model trains on,
    resets the peak, and writes into ``logs``: ``memscope_peak_bytes`` (the
    highest over the devices), ``memscope_estimate_bytes``, ``memscope_ratio``
    (measured / estimate) and, with several devices, ``memscope_peak_bytes_gpu0``
    and so on. Place it before ``CSVLogger`` and ``TensorBoard`` so that they
    record these keys.

    It never stops training because of its own trouble: a failing estimate or
    unreadable statistics give one warning and it carries on.

    Args:
        batch_size: the batch size, when ``fit`` cannot tell it (datasets of
            unknown batch size, generators).
        device: the estimate's device profile (default: ``"gpu"`` when a GPU
            is visible, else ``"cpu"``).
        log_every: ``"epoch"`` or ``"batch"``.
        tolerance: how far measured may exceed the estimate before warning.
        on_exceed: ``"warn"`` or ``"stop"`` (set ``model.stop_training``).
        estimate_options: more keyword arguments for ``memscope.estimate``.
        memory_source: where readings come from (tests pass a fake).
        print_fn: receives the one-line estimate (default: the logger).

    Example:
        >>> import numpy as np, keras
        >>> import keras_memscope as memscope
        >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> cb = memscope.MemScopeCallback(print_fn=lambda line: None)
        >>> history = model.fit(np.zeros((64, 8)), np.zeros((64, 1)), batch_size=16,
        ...                     epochs=1, verbose=0, callbacks=[cb])
        >>> cb.batch_size, "memscope_ratio" in history.history
        (16, True)
    """

    def __init__(
        self,
        batch_size: int | None = None,
        *,
        device: str | None = None,
        log_every: str = "epoch",
        tolerance: float = 0.25,
        on_exceed: str = "warn",
        estimate_options: dict[str, Any] | None = None,
        memory_source: Any = None,
        print_fn: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        if log_every not in ("epoch", "batch"):
            raise ValueError(f"log_every must be 'epoch' or 'batch', got {log_every!r}")
        if on_exceed not in ("warn", "stop"):
            raise ValueError(f"on_exceed must be 'warn' or 'stop', got {on_exceed!r}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
                batch_size, int) or batch_size <= 0):
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not tolerance >= 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
        self.requested_batch_size = batch_size
        self.device = device
        self.log_every = log_every
        self.tolerance = float(tolerance)
        self.on_exceed = on_exceed
        self.estimate_options = dict(estimate_options or {})
        self.memory_source = memory_source or TFMemorySource()
        self.print_fn = print_fn
        if log_every == "batch":
            # Only then: overriding on_train_batch_end turns off Keras' async dispatch.
            self.on_train_batch_end = self._on_train_batch_end  # type: ignore[method-assign]
        self._reset_state()

    def _reset_state(self) -> None:
        self.batch_size: int | None = self.requested_batch_size
        self.estimate: MemoryEstimate | None = None
        self.devices: list[str] = []
        self.history: list[dict[str, float]] = []
        self._warned: set[str] = set()
        self._readable = True
        self._estimate_pending = False
        self.data_bytes = 0
        self.data_source = ""

    # -- helpers ---------------------------------------------------------------

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)

    @staticmethod
    def _fit_locals() -> dict[str, Any]:
        """The local variables of the ``fit`` call that runs this callback
        (empty where none is found)."""
        frame = inspect.currentframe()
        try:
            while frame is not None:
                if frame.f_code.co_name == "fit" and "epoch_iterator" in frame.f_locals:
                    return dict(frame.f_locals)
                frame = frame.f_back
        finally:
            del frame
        return {}

    def _infer_batch_size(self, found: dict[str, Any]) -> int | None:
        if not found:
            return None
        it = found["epoch_iterator"]
        size = getattr(getattr(it, "data_adapter", None), "batch_size", None)
        if isinstance(size, int) and size > 0:
            return size
        given = found.get("batch_size")
        if isinstance(given, int) and given > 0:
            return given
        return None

    @staticmethod
    def _array_bytes(found: dict[str, Any]) -> int:
        """The bytes of the arrays ``fit`` was given as ``x``, ``y`` and
        ``sample_weight`` (NumPy's, or any with an integer ``nbytes``), which
        it holds as tensors in the allocator the step uses."""
        total = 0
        for name in ("x", "y", "sample_weight"):
            try:
                items = keras.tree.flatten(found.get(name))
            except Exception:
                continue
            for item in items:
                nbytes = getattr(item, "nbytes", None)
                if isinstance(nbytes, (int, np.integer)) and not isinstance(nbytes, bool):
                    total += int(nbytes)
        return total

    @staticmethod
    def _pipeline(found: dict[str, Any]) -> str:
        """What feeds ``fit`` where it is an input pipeline that makes batches
        as it goes (a ``tf.data.Dataset``, a generator, a ``PyDataset``,
        ...), by its Keras data adapter; "" for arrays, or where it is not
        known."""
        adapter = getattr(found.get("epoch_iterator"), "data_adapter", None)
        name = type(adapter).__name__ if adapter is not None else ""
        kinds = {"TFDatasetAdapter": "a tf.data.Dataset", "GeneratorDataAdapter": "a generator",
                 "PyDatasetAdapter": "a keras.utils.PyDataset",
                 "TorchDataLoaderAdapter": "a torch DataLoader",
                 "GrainDatasetAdapter": "a Grain dataset"}
        return kinds.get(name, "")

    def _device_profile(self) -> str:
        if self.device:
            return self.device
        return "gpu" if any(d.startswith("GPU") for d in self.devices) else "cpu"

    # -- training hooks ----------------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._reset_state()
        try:
            self.devices = list(self.memory_source.devices(self.model))
        except Exception as exc:  # never break training
            self._warn_once("devices", f"MemScopeCallback cannot list devices ({exc}); "
                            "measuring CPU:0")
            self.devices = ["CPU:0"]
        found = self._fit_locals()
        self.data_bytes = self._array_bytes(found)
        self.data_source = self._pipeline(found)
        if self.batch_size is None:
            self.batch_size = self._infer_batch_size(found)
        if self.batch_size is None:
            self._warn_once("batch", "MemScopeCallback cannot tell the batch size fit() uses; "
                            "pass MemScopeCallback(batch_size=...) to compare with an estimate")
        elif getattr(self.model, "built", True):
            self._make_estimate()
        else:
            # a model without an Input is built by its first batch: estimate then
            self._estimate_pending = True
        if any(d.startswith("CPU") for d in self.devices):
            import os

            if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() != "true":
                self._warn_once("cpu-stats", "MemScopeCallback on the CPU: without "
                                "TF_CPU_ALLOCATOR_USE_BFC=true set before importing TensorFlow, "
                                "tensors under 256 KiB are not counted (readings are lower "
                                "bounds)")
        self._reset_peaks()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.log_every == "epoch":
            self._record(logs if logs is not None else {}, epoch=epoch)

    def _make_estimate(self) -> None:
        self._estimate_pending = False
        try:
            from .estimator import estimate

            options = {"device": self._device_profile(), **self.estimate_options}
            per_replica = max(1, (self.batch_size or 1) // max(1, len(self.devices)))
            self.estimate = estimate(self.model, per_replica, **options)
        except Exception as exc:
            self._warn_once("estimate", f"MemScopeCallback could not estimate this model "
                            f"({type(exc).__name__}: {exc}); logging measurements only")
            return
        est = self.estimate
        line = (f"memscope: estimated training-step peak {human_bytes(est.peak_bytes)}"
                f" per device at batch {est.batch_size} ({est.optimizer}, {est.device};"
                f" persistent {human_bytes(est.persistent_bytes)}, held between steps"
                f" {human_bytes(est.held_bytes or est.persistent_bytes)})")
        (self.print_fn or logger.info)(line)

    def _on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._record(logs if logs is not None else {}, batch=batch)

    # -- readings ---------------------------------------------------------------

    def _reset_peaks(self) -> None:
        for device in self.devices:
            try:
                self.memory_source.reset(device)
            except Exception as exc:
                self._warn_once(f"reset-{device}", f"MemScopeCallback cannot reset the peak of "
                                f"{device} ({exc}); peaks are since the process started")

    def _record(self, logs: dict, **where: int) -> None:
        # The same keys every time (NaN where a device could not be read), so
        # that CSVLogger's columns, fixed at the first epoch, always match.
        nan = float("nan")
        if self._estimate_pending and getattr(self.model, "built", True):
            self._make_estimate()
        readings: dict[str, tuple[float, float]] = {}
        for device in self.devices:
            try:
                cur, pk = self.memory_source.read(device)
                readings[device] = (float(cur), float(pk))
            except Exception as exc:
                self._warn_once(f"read-{device}", f"MemScopeCallback cannot read memory of "
                                f"{device} ({type(exc).__name__}: {exc}); logging NaN for it")
                readings[device] = (nan, nan)
        self._reset_peaks()
        valid = [r for r in readings.values() if r[1] == r[1]]
        peak = max((p for _, p in valid), default=nan)
        current = max((c for c, _ in valid), default=nan)
        entry: dict[str, float] = {"memscope_peak_bytes": peak,
                                   "memscope_current_bytes": current}
        if len(readings) > 1:
            for device, (cur, pk) in readings.items():
                entry[f"memscope_peak_bytes_{_key(device)}"] = pk
                entry[f"memscope_current_bytes_{_key(device)}"] = cur
        if self.estimate is not None:
            est = self.estimate.peak_bytes
            entry["memscope_estimate_bytes"] = float(est)
            entry["memscope_ratio"] = peak / est if est else nan
            if valid:
                self._check_exceed(int(peak), int(current))
        logs.update(entry)
        self.history.append({**entry, **{k: float(v) for k, v in where.items()}})

    def _check_exceed(self, peak: int, current: int) -> None:
        est = self.estimate
        assert est is not None
        if peak <= est.peak_bytes * (1 + self.tolerance):
            return
        over = peak / est.peak_bytes - 1
        # (the allocator counts the persistent tensors in its chunks)
        held = est.held_bytes or est.persistent_bytes
        if current > held * (1 + self.tolerance):
            cause = (f"memory held between steps is {human_bytes(current)} against "
                     f"{human_bytes(held)} estimated (weights, optimizer state, batch, "
                     "in the allocator's chunks): other tensors or models are alive in "
                     "this process")
            if self.data_bytes:
                cause += (f", among them the arrays fit() was given ({human_bytes(self.data_bytes)}"
                          " of x, y and sample_weight), which it holds as tensors in the same "
                          "allocator (a tf.data pipeline that makes its batches as it goes "
                          "holds only those it prefetches)")
            elif self.data_source:
                batch = est.input_bytes // max(1, est.input_batches)
                batches = (current - held) / batch if batch else 0.0
                cause += (f", among them the batches of fit()'s input pipeline "
                          f"({self.data_source}): it holds those it has made and not yet "
                          "handed over (prefetch buffers, a map's outputs) and the tensors "
                          f"it was made from; the excess is about {batches:.1f} batches of "
                          f"{human_bytes(batch)} (inputs and labels at batch "
                          f"{est.device_batch_size or est.batch_size})")
        else:
            holder = est.peak_holders[0] if est.peak_holders else None
            biggest = (f"; the largest estimated holder is {holder.kind} of {holder.layer}"
                       if holder else "")
            cause = ("the step's transient memory (activations, gradients, workspace) is "
                     f"higher than estimated{biggest}")
        message = (f"measured peak {human_bytes(peak)} exceeds the estimate "
                   f"{human_bytes(est.peak_bytes)} by {over:.0%}: {cause}")
        if self.on_exceed == "stop":
            self._warn_once("exceed", message + "; stopping training (on_exceed='stop')")
            self.model.stop_training = True
        else:
            self._warn_once("exceed", message)


__all__: Sequence[str] = ["MemScopeCallback", "TFMemorySource"]
