"""Device profiles: what the runtime takes outside the framework allocator.

``overhead_bytes`` is memory a training process uses that TensorFlow's
allocator statistics never show: on a CPU, the TensorFlow runtime itself
(libraries, kernels, thread pools: the resident set right after
``import tensorflow``); on a GPU, the CUDA context with cuDNN and cuBLAS
handles, created before the allocator takes its first byte.
"""

from __future__ import annotations

import dataclasses
import re

MiB = 1024**2


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """A device as the estimator needs it.

    Attributes:
        name: canonical name (``"cpu"``, ``"gpu"``).
        kind: ``"cpu"`` or ``"gpu"``.
        overhead_bytes: runtime memory outside the allocator.
        memory_bytes: memory available to training, when known.
        update_lag: how many finished weight gradients may wait for their
            optimizer update while the backward pass goes on.
        allocator: the allocator model, ``"bfc"`` (TensorFlow's GPU allocator,
            and the CPU's with ``TF_CPU_ALLOCATOR_USE_BFC=true``) or ``"exact"``.
        source: where the figures come from.
    """

    name: str
    kind: str
    overhead_bytes: int
    memory_bytes: int | None = None
    update_lag: int = 1
    allocator: str = "bfc"
    source: str = ""


PROFILES: dict[str, DeviceProfile] = {
    "cpu": DeviceProfile(
        name="cpu",
        kind="cpu",
        overhead_bytes=521 * MiB,
        source=(
            "resident set of a Python process right after `import tensorflow` "
            "(tensorflow-cpu 2.21, Linux x86-64), measured"
        ),
    ),
    "gpu": DeviceProfile(
        name="gpu",
        kind="gpu",
        overhead_bytes=512 * MiB,
        source=(
            "a typical CUDA 12 context with cuDNN and cuBLAS handles loaded "
            "(300-600 MiB depending on GPU and driver); not measured here"
        ),
    ),
}


def _normalise(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


def get_device(device: str | DeviceProfile | None) -> DeviceProfile:
    """A profile by (forgiving) name, or the profile itself."""
    if device is None:
        return PROFILES["gpu"]
    if isinstance(device, DeviceProfile):
        return device
    if not isinstance(device, str):
        raise TypeError(
            f"device must be a name such as 'gpu' or 'cpu', or a DeviceProfile; "
            f"got {type(device).__name__}"
        )
    wanted = _normalise(device)
    for key, profile in PROFILES.items():
        if _normalise(key) == wanted:
            return profile
    raise ValueError(
        f"unknown device {device!r}: use one of {', '.join(sorted(PROFILES))} "
        "or a DeviceProfile"
    )
