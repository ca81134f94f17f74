"""keras_memscope: how much memory and time training a Keras model takes, whether
it fits, and what to change when it does not.

The records, reports and device profiles import without TensorFlow; the
functions that need Keras import it on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .devices import DeviceProfile, get_device

# bound now, not lazily: importing the submodule ``keras_memscope.measure``
# (as ``max_batch_size(verify=True)`` does) would otherwise make the package's
# ``measure`` that module instead of the function (it imports no TensorFlow)
from .measure import measure
from .records import Holder, LayerRecord, Measurement, MemoryEstimate, TimelinePoint

__version__ = "0.1.0"

_LAZY = {
    "estimate": "keras_memscope.estimator",
    "summary": "keras_memscope.estimator",
    "MemScopeCallback": "keras_memscope.callback",
    "fits": "keras_memscope.planning",
    "max_batch_size": "keras_memscope.planning",
    "FitReport": "keras_memscope.planning",
    "Suggestion": "keras_memscope.planning",
    "BatchSearch": "keras_memscope.planning",
    "plot_memory_vs_batch": "keras_memscope.plot",
    "detect_devices": "keras_memscope.devices",
    "calibrate": "keras_memscope.timing",
    "whatif": "keras_memscope.changes",
    "apply": "keras_memscope.changes",
    "plot_timeline": "keras_memscope.plot",
}

__all__ = [
    "BatchSearch",
    "DeviceProfile",
    "FitReport",
    "Suggestion",
    "apply",
    "calibrate",
    "detect_devices",
    "fits",
    "max_batch_size",
    "plot_memory_vs_batch",
    "plot_timeline",
    "Holder",
    "LayerRecord",
    "MemScopeCallback",
    "Measurement",
    "MemoryEstimate",
    "TimelinePoint",
    "estimate",
    "get_device",
    "measure",
    "summary",
    "whatif",
    "__version__",
]


_RENAMED = {"plot_memory_vs_batch": "memory_vs_batch"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), _RENAMED.get(name, name))
        globals()[name] = value
        return value
    raise AttributeError(f"module 'keras_memscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
