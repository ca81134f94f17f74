"""Memory per device under data and model parallelism.

* ``tf.distribute.MirroredStrategy`` (or ``device_count=n``): every replica
  holds all weights and optimizer state and trains on its share of the global
  batch; gradients are all-reduced, which packs them into one buffer, so the
  update waits for every gradient.
* ``keras.distribution.DataParallel``: the batch is split over the mesh;
  variables are replicated.
* ``keras.distribution.ModelParallel`` with a ``LayoutMap``: each variable's
  bytes are divided by the mesh axes its layout shards it over (its local
  shard has ``ceil(dim / axis size)`` along each sharded dimension); optimizer
  slots follow their variable; activations are split along the batch axis.

Everything here reads shapes and layouts only: it works without the backend
the distribution is meant for, and it creates no device.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class Sharding:
    """How one device's share of a training step is found."""

    kind: str  # "single", "mirrored", "data_parallel", "model_parallel"
    devices: int
    batch_split: int
    local_shapes: dict[str, tuple[int, ...]]  # variable path -> its shard's shape
    all_reduce: bool

    def local_shape(self, path: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        return self.local_shapes.get(path, shape)


SINGLE = Sharding("single", 1, 1, {}, False)


def sharding_of(model: Any, *, distribution: Any = None, device_count: int | None = None
                ) -> Sharding:
    """The sharding that ``distribution`` (a ``tf.distribute`` strategy or a
    ``keras.distribution`` object) or ``device_count`` replicas implies."""
    if distribution is None and device_count is None:
        return SINGLE
    if distribution is not None and device_count is not None:
        raise ValueError("give distribution= or device_count=, not both")
    if device_count is not None:
        if isinstance(device_count, bool) or not isinstance(device_count, int) \
                or device_count < 1:
            raise ValueError(f"device_count must be a positive integer, got {device_count!r}")
        return Sharding("mirrored", device_count, device_count, {}, device_count > 1)
    replicas = getattr(distribution, "num_replicas_in_sync", None)
    if replicas is not None:  # a tf.distribute strategy
        return Sharding("mirrored", int(replicas), int(replicas), {}, replicas > 1)
    mesh = getattr(distribution, "device_mesh", None)
    if mesh is None:
        raise TypeError(
            f"distribution must be a tf.distribute strategy or a keras.distribution "
            f"DataParallel/ModelParallel; got {type(distribution).__name__}"
        )
    axis_names = list(mesh.axis_names)
    sizes = dict(zip(axis_names, mesh.shape))
    batch_axis = getattr(distribution, "batch_dim_name", None) or axis_names[0]
    batch_split = int(sizes.get(batch_axis, 1))
    devices = math.prod(int(s) for s in mesh.shape)
    layout_map = getattr(distribution, "_layout_map", None)
    if layout_map is None:
        return Sharding("data_parallel", devices, batch_split, {}, False)
    local: dict[str, tuple[int, ...]] = {}
    for v in model.weights:
        path = getattr(v, "path", v.name)
        layout = layout_map[path]
        if layout is None:
            continue
        axes = tuple(layout.axes)
        shape = tuple(int(d) for d in v.shape)
        if len(axes) != len(shape):
            raise ValueError(f"layout {axes} for {path} does not match its shape {shape}")
        local[path] = tuple(
            -(-d // int(sizes[a])) if a is not None else d for d, a in zip(shape, axes))
    return Sharding("model_parallel", devices, batch_split, local, False)


def per_device_variable_bytes(model: Any, sharding: Sharding) -> dict[str, int]:
    """Bytes each device holds of each of the model's variables."""
    import keras

    from .units import dtype_bytes

    out = {}
    for v in model.weights:
        path = getattr(v, "path", v.name)
        shape = sharding.local_shape(path, tuple(int(d) for d in v.shape))
        out[path] = math.prod(shape) * dtype_bytes(keras.backend.standardize_dtype(v.dtype))
    return out
