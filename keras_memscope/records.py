"""Immutable records of estimates and measurements.

Nothing here imports TensorFlow or Keras, so reports and their tests run
without a framework. Every record converts to and from plain JSON-ready dicts.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

Shape = tuple[int, ...]

SCHEMA_VERSION = 1


def _tuple_shapes(value: Any) -> tuple[Shape, ...]:
    return tuple(tuple(int(d) for d in shape) for shape in value)


@dataclasses.dataclass(frozen=True)
class LayerRecord:
    """One call of one layer (or Keras operation) in a training step.

    ``activation_bytes`` are the bytes this call allocates in the forward pass
    and keeps alive for the backward pass; summed over all records they give the
    saved activations at the end of the forward pass. ``forward_macs`` count the
    whole batch.
    """

    name: str
    class_name: str
    input_shapes: tuple[Shape, ...]
    output_shapes: tuple[Shape, ...]
    output_dtypes: tuple[str, ...]
    params: int
    trainable_params: int
    weights_bytes: int
    activation_bytes: int
    workspace_bytes: int
    forward_macs: int
    shared: bool = False
    rule: str = ""
    category: str = "other"
    forward_flops: int = 0
    backward_input_flops: int = 0
    backward_weight_flops: int = 0
    forward_time_s: float | None = None
    backward_time_s: float | None = None

    @property
    def backward_flops(self) -> int:
        """Gradient FLOPs: with respect to activations plus to weights."""
        return self.backward_input_flops + self.backward_weight_flops

    @property
    def time_s(self) -> float | None:
        """Estimated forward plus backward time (None without a timed device)."""
        if self.forward_time_s is None or self.backward_time_s is None:
            return None
        return self.forward_time_s + self.backward_time_s

    @property
    def output_shape(self) -> Shape | tuple[Shape, ...]:
        """The output shape, or a tuple of shapes for several outputs."""
        if len(self.output_shapes) == 1:
            return self.output_shapes[0]
        return self.output_shapes

    @property
    def non_trainable_params(self) -> int:
        return self.params - self.trainable_params

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["input_shapes"] = [list(s) for s in self.input_shapes]
        data["output_shapes"] = [list(s) for s in self.output_shapes]
        data["output_dtypes"] = list(self.output_dtypes)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerRecord:
        values = dict(data)
        values["input_shapes"] = _tuple_shapes(values["input_shapes"])
        values["output_shapes"] = _tuple_shapes(values["output_shapes"])
        values["output_dtypes"] = tuple(values["output_dtypes"])
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class TimelinePoint:
    """One event of the simulated step: live allocator bytes right after it,
    and the highest they reached while it ran (its temporaries included)."""

    index: int
    phase: str  # "forward", "loss", "backward" or "update"
    layer: str
    event: str
    live_bytes: int
    high_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimelinePoint:
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class Holder:
    """Bytes alive at the peak, grouped by the layer and kind that hold them."""

    layer: str
    kind: str  # "activation", "gradient", "workspace", "optimizer update"
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Holder:
        return cls(**data)


def _freeze_counts(value: Mapping[str, int] | None) -> Mapping[str, int]:
    return MappingProxyType(dict(sorted((value or {}).items())))


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """The predicted memory of one steady-state training step.

    With several devices (``devices`` > 1) every byte figure is per device,
    for its share ``device_batch_size`` of the global ``batch_size``.

    Compute: ``forward_flops`` and ``backward_flops`` (one multiply-accumulate
    is two FLOPs), and with a device that has speeds, ``step_time_s``.

    The parts of the peak add up exactly::

        peak_bytes == weights_bytes + optimizer_bytes + input_bytes
                      + constants_bytes - released_bytes
                      + activations_bytes + gradients_bytes + workspace_bytes
                      + allocator_bytes

    where the first four are the ``persistent_bytes`` held between steps
    (``constants_bytes``: the constants TensorFlow's graph optimizer folds
    the step's constant computations into, such as a loss gradient's zeros,
    made when the step first runs),
    ``released_bytes`` the part of them no longer held at the peak (with
    gradient accumulation, the accumulators an update has already reset to
    zeros; else 0), the next three what the step has alive at its highest
    point, and ``allocator_bytes`` what the allocator counts beyond the bytes
    requested at that moment (chunks it did not split, rounding).
    ``total_bytes`` adds the device runtime's own memory that the framework
    allocator never sees (``overhead_bytes``). ``possible_extra_bytes`` is
    how much higher the peak is where TensorFlow's executor schedules the
    step otherwise than the estimate assumes: the step simulated again with
    every recurrent layer's gradient loop run ahead of its weight-gradient
    sums (the notes say which); 0 where no such case is known.
    ``history_peaks`` are the peaks of the step simulated in other orders of
    a CPU's two gradient streams (``DeviceProfile.order_histories``), the
    nominal order first; the estimate is the highest of them. Empty where
    one order was simulated.
    ``held_bytes`` is what the allocator counts in use between two steps
    (``get_memory_info()["current"]`` before a step): the persistent part in
    the chunks the simulated allocator holds it in, which may be larger than
    the requests (BFC does not split a free chunk under twice a request
    when the rest is under 128 MiB: VGG16's 392 MiB Adam slot in a 512 MiB
    chunk). 0 where no step was simulated.
    ``input_bytes`` is the batch's inputs and labels, ``input_batches``
    of them: 2 where the model is compiled with ``steps_per_execution``
    greater than 1 (``fit`` then runs its steps in a loop that fetches the
    next batch while a step runs), else 1.
    """

    model_name: str
    batch_size: int
    method: str
    device: str
    optimizer: str
    dtype_policy: str
    params: int
    trainable_params: int
    weights_bytes: int
    optimizer_bytes: int
    input_bytes: int
    activations_bytes: int
    gradients_bytes: int
    workspace_bytes: int
    allocator_bytes: int
    overhead_bytes: int
    saved_activations_bytes: int
    forward_macs: int
    peak_phase: str
    layers: tuple[LayerRecord, ...]
    unsupported: Mapping[str, int] = dataclasses.field(default_factory=dict)
    timeline: tuple[TimelinePoint, ...] = ()
    peak_holders: tuple[Holder, ...] = ()
    notes: tuple[str, ...] = ()
    forward_flops: int = 0
    backward_flops: int = 0
    update_time_s: float | None = None
    timing_source: str = ""
    devices: int = 1
    device_batch_size: int = 0
    recompute_flops: int = 0
    remat: str = ""
    step_allocated_bytes: int = 0
    possible_extra_bytes: int = 0
    released_bytes: int = 0
    history_peaks: tuple[int, ...] = ()
    constants_bytes: int = 0
    held_bytes: int = 0
    input_batches: int = 1

    @property
    def no_reuse_bytes(self) -> int:
        """Memory if nothing were ever freed or reused: the persistent part
        plus every tensor one training step allocates."""
        return self.persistent_bytes + self.step_allocated_bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "unsupported", _freeze_counts(self.unsupported))
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "timeline", tuple(self.timeline))
        object.__setattr__(self, "peak_holders", tuple(self.peak_holders))
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "history_peaks", tuple(self.history_peaks))

    @property
    def persistent_bytes(self) -> int:
        """Held between steps: weights, optimizer state, the input batch and
        the step's folded constants."""
        return (self.weights_bytes + self.optimizer_bytes + self.input_bytes
                + self.constants_bytes)

    @property
    def peak_bytes(self) -> int:
        """Predicted framework-allocator peak of a steady-state training step."""
        return (
            self.persistent_bytes
            - self.released_bytes
            + self.activations_bytes
            + self.gradients_bytes
            + self.workspace_bytes
            + self.allocator_bytes
        )

    @property
    def step_time_s(self) -> float | None:
        """Estimated time of one training step (None without a timed device)."""
        times = [r.time_s for r in self.layers]
        if self.update_time_s is None or any(t is None for t in times):
            return None
        return sum(t for t in times if t is not None) + self.update_time_s

    @property
    def total_bytes(self) -> int:
        """Allocator peak plus the runtime memory the allocator does not see."""
        return self.peak_bytes + self.overhead_bytes

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"schema": SCHEMA_VERSION}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in ("layers", "timeline", "peak_holders"):
                value = [item.to_dict() for item in value]
            elif field.name == "unsupported":
                value = dict(value)
            elif field.name in ("notes", "history_peaks"):
                value = list(value)
            data[field.name] = value
        data["persistent_bytes"] = self.persistent_bytes
        data["peak_bytes"] = self.peak_bytes
        data["total_bytes"] = self.total_bytes
        data["step_time_s"] = self.step_time_s
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryEstimate:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["layers"] = tuple(LayerRecord.from_dict(d) for d in values["layers"])
        values["timeline"] = tuple(
            TimelinePoint.from_dict(d) for d in values.get("timeline", ())
        )
        values["peak_holders"] = tuple(
            Holder.from_dict(d) for d in values.get("peak_holders", ())
        )
        values["notes"] = tuple(values.get("notes", ()))
        values["history_peaks"] = tuple(values.get("history_peaks", ()))
        return cls(**values)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> MemoryEstimate:
        return cls.from_dict(json.loads(text))


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Real memory of training steps, as the framework allocator reported it.

    ``peak_bytes`` is the maximum over ``step_peak_bytes`` (the steps after a
    warm-up step); ``persistent_bytes`` is what was allocated before a step.
    ``rss_peak_bytes`` is the peak resident set size of the measuring process.
    """

    model_name: str
    batch_size: int
    device: str
    optimizer: str
    peak_bytes: int
    persistent_bytes: int
    step_peak_bytes: tuple[int, ...]
    rss_peak_bytes: int
    allocator: str
    in_subprocess: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "step_peak_bytes", tuple(self.step_peak_bytes))

    @property
    def spread(self) -> float:
        """(max - min) / max of the step peaks: how much steps differ."""
        if not self.step_peak_bytes or max(self.step_peak_bytes) == 0:
            return 0.0
        hi, lo = max(self.step_peak_bytes), min(self.step_peak_bytes)
        return (hi - lo) / hi

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["step_peak_bytes"] = list(self.step_peak_bytes)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        return cls(**dict(data))
