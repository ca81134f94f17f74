"""Dtype sizes, byte arithmetic and human-readable units.

One multiply-accumulate (MAC) is two floating-point operations (FLOPs); this is
the only place that conversion is stated.
"""

from __future__ import annotations

import math

FLOPS_PER_MAC = 2

#: Bytes per element for the dtypes Keras and TensorFlow use.
DTYPE_BYTES: dict[str, int] = {
    "bool": 1,
    "int4": 1,  # stored packed two per byte by Keras, but tensors hold one per byte
    "uint4": 1,
    "int8": 1,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "complex64": 8,
    "complex128": 16,
    "string": 8,
    "resource": 8,
    "variant": 8,
}

#: The BFC allocator hands out memory in multiples of this many bytes.
ALLOCATOR_GRANULE_BYTES = 256

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (a name such as ``"float32"``)."""
    name = str(dtype)
    if name.startswith("<dtype: '"):  # tf.DType repr
        name = name[len("<dtype: '") : -2]
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(
            f"unknown dtype {dtype!r}: expected one of {sorted(DTYPE_BYTES)}"
        ) from None


def num_elements(shape: tuple[int, ...] | list[int]) -> int:
    """Number of elements of a fully known shape."""
    return math.prod(int(d) for d in shape)


def tensor_bytes(shape: tuple[int, ...] | list[int], dtype: str) -> int:
    """Exact bytes of a dense tensor."""
    return num_elements(shape) * dtype_bytes(dtype)


def round_up(n_bytes: int, granule: int = ALLOCATOR_GRANULE_BYTES) -> int:
    """``n_bytes`` rounded up to the allocator granule (0 stays 0)."""
    if n_bytes <= 0:
        return 0
    return -(-n_bytes // granule) * granule


def human_bytes(n_bytes: float, precision: int = 1) -> str:
    """``1536`` -> ``"1.5 KiB"``; binary units, as allocators report them."""
    value = float(n_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.{precision}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_count(n: float, precision: int = 2) -> str:
    """``86_704_128`` -> ``"86.70 M"``; decimal units for counts and FLOPs."""
    value = float(n)
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(value) < 1000 or unit == "P":
            return f"{value:.{precision}f} {unit}".rstrip() if unit else f"{int(value)}"
        value /= 1000
    raise AssertionError("unreachable")
