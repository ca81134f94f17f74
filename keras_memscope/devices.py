"""Device profiles: memory, what the runtime takes, and speed.

What a training process can give TensorFlow's allocator on a GPU is less than
the card's memory:

* the CUDA context with cuDNN and cuBLAS loaded lives outside the allocator
  (``overhead_bytes``; a few hundred MiB with CUDA 12's lazy module loading;
  the figure here is an approximation, not a measurement, unless the profile
  says otherwise);
* TensorFlow keeps ``min_system_memory`` away from its allocator
  (``reserved_bytes``; ``MinSystemMemory`` in
  ``tensorflow/core/common_runtime/gpu/gpu_device.cc``: 500 MiB for compute
  capability <= 6, 1050 MiB for 7.x, 1536 MiB for 8.x, 1800 MiB for 9.0 and
  later; 225 MiB on cards under 2 GiB).

On the CPU, ``overhead_bytes`` is TensorFlow's own resident memory (libraries,
kernels, thread pools: the resident set right after ``import tensorflow``,
measured at 521 MiB with tensorflow-cpu 2.21 on Linux x86-64) and the memory is
this machine's available RAM.

Peak FLOP/s are the vendors' datasheet figures for dense math (no
sparsity): float32 on CUDA cores, float16/bfloat16 on tensor cores with
float32 accumulation. Bandwidth is the datasheet memory bandwidth.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MiB = 1024**2
GiB = 1024**3
GB = 10**9
T = 10**12

_CONTEXT_NOTE = "CUDA context with cuDNN/cuBLAS: approximate (300-600 MiB typical), not measured"


def cpu_cache_facts() -> tuple[int, int]:
    """(L2 cache bytes per core, CPU threads) of this machine, which size
    TensorFlow's CPU convolution-gradient buffers (512 KiB and 2 when unknown)."""
    return _sys_cache_bytes(2) or 512 * 1024, os.cpu_count() or 2


@functools.cache
def eigen_l3_bytes() -> int:
    """The L3 cache size Eigen reads on this CPU (``CacheSizes().m_l3``),
    which sizes TensorFlow's CPU Conv3D gradient buffers: on AMD CPUs from
    CPUID leaf 0x80000006 (EDX[27:18] in 512 KiB), the size of the whole
    package's L3 (320 MiB on the AMD EPYC measured here, whose L3 in
    ``/sys`` is 32 MiB); on others from CPUID leaf 4, as ``/sys`` has it;
    2 MiB (x86) or 4 MiB (ARM) where neither is known. CPUID is read with
    py-cpuinfo's CPUID runner; where that fails, ``/sys``."""
    import platform

    arch = platform.machine().lower()
    if arch not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return (4 << 20) if arch.startswith(("arm", "aarch", "ppc")) else (512 << 10)
    if _cpu_vendor() in ("AuthenticAMD", "AMDisbetter!"):
        try:
            from cpuinfo.cpuinfo import CPUID

            # mov eax, 0x80000006; cpuid; mov eax, edx; ret
            edx = CPUID()._run_asm(b"\xB8\x06\x00\x00\x80", b"\x0f\xa2", b"\x89\xD0",
                                   b"\xC3")
            l3 = ((edx & 0xFFFC000) >> 18) * 512 * 1024
            return l3 if l3 > 0 else 2 << 20
        except Exception:  # noqa: BLE001 - no CPUID runner here: /sys
            pass
    return _sys_cache_bytes(3) or 2 << 20


def _cpu_vendor() -> str:
    """``vendor_id`` of ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _sys_cache_bytes(level: int) -> int:
    """Bytes of cpu0's cache of ``level`` in ``/sys`` (0 where unknown)."""
    try:
        for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
            if (index / "level").read_text().strip() == str(level):
                text = (index / "size").read_text().strip().upper()
                scale = {"K": 1024, "M": 1024**2}.get(text[-1:], 1)
                return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return 0


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags of this CPU in ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_float_lanes() -> int:
    """float32 lanes of this CPU's widest vector unit: 16 with AVX-512
    (``avx512f`` among the flags of ``/proc/cpuinfo``), else 8 (AVX2)."""
    return 16 if "avx512f" in cpu_flags() else 8


def cpu_native_bfloat16() -> bool:
    """Whether TensorFlow multiplies bfloat16 matrices natively on this CPU:
    with oneDNN's kernels on a CPU with bfloat16 instructions (AVX512_BF16
    or AMX). An allocator trace here (AMD EPYC, AVX512_BF16, oneDNN) shows
    no float32 copies of a bfloat16 MatMul's operands, where TensorFlow's
    own kernels (``TF_ENABLE_ONEDNN_OPTS=0``) make them; float16 is copied
    with both."""
    return cpu_uses_onednn() and bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def cpu_amx_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 with AMX tiles (``amx_bf16``
    among its flags): oneDNN's bfloat16 weight gradients there hold no
    float32 buffer of the gradient (``benchmarks/matmul_scratch.py`` on an
    Intel Xeon with AMX-BF16), where its AVX512_BF16 kernels hold one."""
    return "amx_bf16" in cpu_flags()


def cpu_onednn_runs(dtype: str = "float32") -> bool:
    """Whether TensorFlow runs oneDNN's kernels on this CPU for tensors of
    ``dtype``: float32 wherever it uses oneDNN, bfloat16 where the CPU has
    bfloat16 instructions (:func:`cpu_native_bfloat16`), float16 where it
    has float16 ones (AVX512_FP16 or AMX-FP16; TensorFlow's
    ``IsDataTypeSupportedByOneDNNOnThisCPU``); elsewhere its own kernels.
    An allocator trace here (AMD EPYC with AVX512_BF16, no AVX512_FP16) of
    a CNN computing in float16: Eigen's column buffers in the convolutions'
    filter gradients (23.625 MiB for a 3 x 3 x 32 x 64 kernel over 32 x 32
    maps at batch 32, ``rules.conv.col_buffers`` to the byte), none in
    float32."""
    if not cpu_uses_onednn():
        return False
    if dtype == "float32":
        return True
    if dtype == "bfloat16":
        return cpu_native_bfloat16()
    if dtype == "float16":
        return bool({"avx512_fp16", "amx_fp16"} & cpu_flags())
    return False


def cpu_reference_kernels() -> tuple[str, ...]:
    """The kernel families (``"family:dtype"``) that oneDNN runs on this CPU
    with its reference implementation, scalar loops far slower than its
    other kernels: the convolution filter gradient (regular and depthwise)
    in float16 where oneDNN runs float16 (:func:`cpu_onednn_runs`) on a CPU
    without AMX-FP16. ``ONEDNN_VERBOSE=1`` on an Intel Xeon with
    AVX512_FP16 and AMX-BF16, no AMX-FP16, names ``ref:any`` for them
    (``brgconv_bwd_w`` with AMX for bfloat16, ``jit:avx512_core`` for
    float32); in a training step of ``benchmarks.zoo.fp16cnn`` at batch 8
    a 3 x 3 x 32 -> 64 filter gradient over 32 x 32 maps takes 1.8 s where
    its forward convolution takes 1.9 ms. Whether oneDNN has a faster
    kernel with AMX-FP16 is not measured; none is assumed there."""
    if cpu_onednn_runs("float16") and "amx_fp16" not in cpu_flags():
        return ("conv_filter_grad:float16",)
    return ()


@functools.cache
def cpu_uses_onednn() -> bool:
    """Whether TensorFlow runs its oneDNN kernels on this machine's CPU.

    TensorFlow turns them on by itself on some CPUs (here: an AMD EPYC with
    AVX512_VNNI and AVX512_BF16) and not on others, and
    ``TF_ENABLE_ONEDNN_OPTS`` overrides either. The kernels differ in what
    they allocate: a oneDNN convolution gradient has no column buffer (an
    allocator trace of a small CNN: none, against 14 and 19 MiB with
    ``TF_ENABLE_ONEDNN_OPTS=0``), and oneDNN max pooling keeps a workspace
    of one byte per output element for its gradient, which allocates no
    temporary of its own."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return False
    return bool(getattr(_pywrap_util_port, "IsMklEnabled", lambda: False)())


def tf_reserved_bytes(memory_bytes: int, compute_capability: tuple[int, int] | None) -> int:
    """TensorFlow's ``MinSystemMemory`` for a GPU (see the module docstring)."""
    if memory_bytes < 2 * GiB:
        return 225 * MiB
    major = compute_capability[0] if compute_capability else 8
    if major <= 6:
        return 500 * MiB
    if major <= 7:
        return 1050 * MiB
    if major <= 8:
        return 1536 * MiB
    return 1800 * MiB


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """A device as the estimator needs it.

    Attributes:
        name: canonical name (``"a100-40gb"``, ``"cpu"``).
        kind: ``"cpu"`` or ``"gpu"``.
        overhead_bytes: runtime memory outside the allocator.
        memory_bytes: the device's memory (None: unknown).
        reserved_bytes: memory TensorFlow keeps from its allocator.
        compute_capability: CUDA compute capability of a GPU.
        peak_flops: datasheet FLOP/s by dtype (``"float32"``, ``"float16"``,
            ``"bfloat16"``); missing where the device has no fast path.
        bandwidth_bytes_s: memory bandwidth in bytes per second.
        op_overhead_s: fixed time per op (dispatch, launch); None: the default
            of the kind (see ``timing``).
        cache_bytes, cache_bandwidth_bytes_s: the data one kernel may move at
            the speed of a CPU's last-level cache, and that speed (calibrated
            with arrays taking three sixteenths of the cache).
        reference_kernels: the kernel families (``"family:dtype"``) the
            device runs with a library's reference implementation, at
            ``rates[family:dtype]`` where calibrated, else
            ``timing.REFERENCE_KERNEL_FLOPS`` (oneDNN's float16 filter
            gradients on a CPU without AMX-FP16:
            :func:`cpu_reference_kernels`).
        rates: calibrated throughput of kernel families: ``"matmul"``,
            ``"conv"``, ``"conv_filter_grad"``, ``"conv_input_grad"`` (FLOP/s)
            and ``"reduce"`` (bytes/s); a family without a rate uses the peak.
        update_lag: how many finished weight gradients may wait for their
            optimizer update while the backward pass goes on.
        weight_grad_lag: > 0 where weight gradients run beside the input
            gradients (TensorFlow's CPU executor runs two ops at once on two
            cores: 1; a GPU runs one stream: 0). The estimate times both
            streams (``timing.backward_seconds``, at this profile's speeds or,
            uncalibrated, ``timing.NOMINAL_CPU_SPEEDS``), so a slow filter
            gradient outlasts as many later input gradients as its time
            covers; the number is how many gradient ops a weight gradient
            overlaps with where no times are given.
        op_time_sigma, order_histories: with two streams, which ops run
            beside which varies from step to step and process to process, and
            with it which freed chunk a request gets. ``op_time_sigma`` is the
            log-normal spread of one op's duration between steps (0.32-0.34
            measured on a 2-core x86-64 CPU, ``benchmarks/op_time_spread.py``);
            the estimate simulates the nominal order and ``order_histories``
            more, each with every op's forward and gradient times scaled by
            independent factors of that spread (fixed seeds; the forward
            pass's independent branches then start in other orders too, as a
            shared encoder's towers ran one after the other in one of nine
            profiled processes), and reports the highest peak
            (``MemoryEstimate.history_peaks`` holds them all). 0: the nominal
            order only.
        simulated_steps: how many steps each simulated order runs after its
            warm-up step; the order's peak is their highest (1: the first
            step after the warm-up). Later steps differ where updates move
            weights within the allocator's regions (``schedule.simulate``):
            ResNet-50 b16 Adam on a 2-core CPU peaked at 1763-1768 MiB in
            its first measured step and up to 1871 MiB in the next seven
            (three processes); the simulated orders peak at 1771-1878 MiB
            in one step and 1917-1992 in six, where every update whose
            weight an input gradient reads writes a copy (benchmarks/
            RESULTS.md, "Weight copies, the weight gradient first and six
            simulated steps").
        fresh_pages_above, first_touch_bytes_s: allocations larger than
            ``fresh_pages_above`` bytes get new pages from the operating system
            at every step, and the kernel writing them pays for first touching
            them at ``first_touch_bytes_s`` (TensorFlow's default CPU allocator
            is malloc, which maps requests above glibc's mmap threshold afresh
            each time: at most 32 MiB, lower after some allocation histories,
            which ``calibrate`` detects at 16 MiB; with
            ``TF_CPU_ALLOCATOR_USE_BFC=true``, and on a GPU, memory is reused:
            None).
        upcast_dtypes: the low-precision types whose matrix products the
            device computes in float32 through float32 copies of operands and
            result (TensorFlow's own CPU kernels for float16 and bfloat16
            MatMul and BatchMatMul, measured with the allocator trace on an
            x86-64 CPU without AVX512-BF16, and for float16 where oneDNN
            has no float16 kernels; oneDNN multiplies float16 natively on a
            CPU with AVX512_FP16, an allocator trace of a float16 MLP on an
            Intel Xeon shows no copies; a GPU multiplies them natively:
            none).
        accumulate_dtypes: the low-precision types whose matrix products the
            device computes natively into a float32 buffer of the result
            (oneDNN's bfloat16 MatMul on a CPU with AVX512_BF16: the matmul
            fused with a bias add and, for the types also in
            ``gradient_buffer_dtypes``, the weight gradient;
            :func:`keras_memscope.ir.matmul_upcast`).
        gradient_buffer_dtypes: the types of ``accumulate_dtypes`` whose
            weight gradients also hold a float32 buffer of the gradient
            (oneDNN's bfloat16 kernels on a CPU with AVX512_BF16 and no
            AMX; with AMX-BF16 none: ``benchmarks/matmul_scratch.py``, an
            Intel Xeon with AMX: 0.2-5.3 MiB beyond the output for eight
            shapes, none of them a float32 buffer of the output).
        allocator: the allocator model, ``"bfc"`` (TensorFlow's GPU allocator,
            and the CPU's with ``TF_CPU_ALLOCATOR_USE_BFC=true``) or ``"exact"``.
        source: where the figures come from.
    """

    name: str
    kind: str
    overhead_bytes: int
    memory_bytes: int | None = None
    reserved_bytes: int = 0
    compute_capability: tuple[int, int] | None = None
    peak_flops: Mapping[str, float] = dataclasses.field(default_factory=dict)
    bandwidth_bytes_s: float | None = None
    op_overhead_s: float | None = None
    cache_bytes: int | None = None
    cache_bandwidth_bytes_s: float | None = None
    rates: Mapping[str, float] = dataclasses.field(default_factory=dict)
    reference_kernels: tuple[str, ...] = ()
    update_lag: int = 1
    weight_grad_lag: int = 0
    op_time_sigma: float = 0.0
    order_histories: int = 0
    simulated_steps: int = 1
    upcast_dtypes: tuple[str, ...] = ()
    accumulate_dtypes: tuple[str, ...] = ()
    gradient_buffer_dtypes: tuple[str, ...] = ()
    fresh_pages_above: int | None = None
    first_touch_bytes_s: float | None = None
    allocator: str = "bfc"
    source: str = ""

    @property
    def available_bytes(self) -> int | None:
        """What TensorFlow's allocator can use: memory - overhead - reserved."""
        if self.memory_bytes is None:
            return None
        return self.memory_bytes - self.overhead_bytes - self.reserved_bytes

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["peak_flops"] = dict(self.peak_flops)
        data["rates"] = dict(self.rates)
        data["compute_capability"] = (list(self.compute_capability)
                                      if self.compute_capability else None)
        data["available_bytes"] = self.available_bytes
        return data


def _gpu(name: str, memory_gib: float, cc: tuple[int, int], fp32_tflops: float,
         half_tflops: float | None, bf16_tflops: float | None, bandwidth_gbs: float,
         source: str, overhead_mib: int = 400) -> DeviceProfile:
    memory = int(memory_gib * GiB)
    flops = {"float32": fp32_tflops * T}
    if half_tflops:
        flops["float16"] = half_tflops * T
    if bf16_tflops:
        flops["bfloat16"] = bf16_tflops * T
    return DeviceProfile(
        name=name, kind="gpu", overhead_bytes=overhead_mib * MiB, memory_bytes=memory,
        reserved_bytes=tf_reserved_bytes(memory, cc), compute_capability=cc,
        peak_flops=flops, bandwidth_bytes_s=bandwidth_gbs * GB,
        source=f"{source}; {_CONTEXT_NOTE}; reserved: TensorFlow MinSystemMemory",
    )


# name, memory (GiB as the driver reports the card), compute capability,
# FP32 / FP16 tensor / BF16 tensor TFLOP/s (dense), bandwidth GB/s.
_CATALOGUE = [
    _gpu("t4", 15.0, (7, 5), 8.1, 65, None, 320, "NVIDIA T4 datasheet"),
    _gpu("v100-16gb", 16.0, (7, 0), 15.7, 125, None, 900, "NVIDIA V100 SXM2 datasheet"),
    _gpu("v100-32gb", 32.0, (7, 0), 15.7, 125, None, 900, "NVIDIA V100 SXM2 datasheet"),
    _gpu("a10", 24.0, (8, 6), 31.2, 125, 125, 600, "NVIDIA A10 datasheet"),
    _gpu("a100-40gb", 40.0, (8, 0), 19.5, 312, 312, 1555, "NVIDIA A100 SXM4 datasheet"),
    _gpu("a100-80gb", 80.0, (8, 0), 19.5, 312, 312, 2039, "NVIDIA A100 SXM4 datasheet"),
    _gpu("l4", 24.0, (8, 9), 30.3, 121, 121, 300, "NVIDIA L4 datasheet"),
    _gpu("l40s", 48.0, (8, 9), 91.6, 362, 362, 864, "NVIDIA L40S datasheet"),
    _gpu("rtx-3090", 24.0, (8, 6), 35.6, 71, 71, 936,
         "NVIDIA GA102 whitepaper (FP16 tensor with FP32 accumulate)"),
    _gpu("rtx-4090", 24.0, (8, 9), 82.6, 165, 165, 1008,
         "NVIDIA AD102 whitepaper (FP16 tensor with FP32 accumulate)"),
    _gpu("h100-80gb", 80.0, (9, 0), 67, 989, 989, 3350, "NVIDIA H100 SXM5 datasheet"),
    _gpu("h200", 141.0, (9, 0), 67, 989, 989, 4800, "NVIDIA H200 SXM datasheet"),
]

_ALIASES = {
    "a100": "a100-40gb",
    "v100": "v100-16gb",
    "h100": "h100-80gb",
    "3090": "rtx-3090",
    "4090": "rtx-4090",
    "geforcertx3090": "rtx-3090",
    "geforcertx4090": "rtx-4090",
    "teslat4": "t4",
    "h200141gb": "h200",
}


def _cpu_available_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


_CALIBRATED: dict[str, DeviceProfile] = {}


def register_calibration(profile: DeviceProfile) -> None:
    """Later look-ups of this kind of device return the calibrated profile."""
    _CALIBRATED[profile.name] = profile


def _cpu_bfc() -> bool:
    """Whether this process's TensorFlow CPU allocator is BFC (it reuses memory)."""
    return os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() == "true"


def _cpu_profile() -> DeviceProfile:
    if "cpu" in _CALIBRATED:
        return dataclasses.replace(_CALIBRATED["cpu"], memory_bytes=_cpu_available_bytes())
    native_bf16 = cpu_native_bfloat16()
    return DeviceProfile(
        name="cpu", kind="cpu", overhead_bytes=521 * MiB, memory_bytes=_cpu_available_bytes(),
        weight_grad_lag=1, op_time_sigma=0.33, order_histories=10,
        upcast_dtypes=tuple(dt for dt in ("float16", "bfloat16") if not cpu_onednn_runs(dt)),
        accumulate_dtypes=("bfloat16",) if native_bf16 else (),
        gradient_buffer_dtypes=("bfloat16",) if native_bf16 and not cpu_amx_bfloat16() else (),
        reference_kernels=cpu_reference_kernels(),
        fresh_pages_above=None if _cpu_bfc() else 32 * MiB,
        source=("this machine's available RAM; overhead: resident set right after "
                "`import tensorflow` (tensorflow-cpu 2.21, Linux x86-64), measured"),
    )


#: A GPU whose model is not known: the overhead, and no memory size.
GENERIC_GPU = DeviceProfile(
    name="gpu", kind="gpu", overhead_bytes=400 * MiB, reserved_bytes=1536 * MiB,
    source=f"{_CONTEXT_NOTE}; reserved: TensorFlow MinSystemMemory for compute capability 8.x",
)

PROFILES: dict[str, DeviceProfile] = {p.name: p for p in _CATALOGUE}
PROFILES["gpu"] = GENERIC_GPU


def _normalise(name: str) -> str:
    cleaned = re.sub(r"[\s_\-]+", "", name.strip().lower())
    for prefix in ("nvidia", "tesla"):
        if cleaned.startswith(prefix) and cleaned != prefix:
            cleaned = cleaned[len(prefix):]
    cleaned = cleaned.replace("geforce", "")
    # form factors and memory kinds in the names drivers report
    # ("NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3")
    return re.sub(r"sxm\d?|pcie|nvl|hbm\d?e?", "", cleaned)


def known_devices() -> list[str]:
    return sorted([*PROFILES, "cpu"])


def get_device(device: str | DeviceProfile | Mapping[str, Any] | os.PathLike | None
               ) -> DeviceProfile:
    """A profile by forgiving name (``"A100 40GB"``, ``"a100-40gb"``), a
    profile, a dict of profile fields, or a JSON file of them."""
    if device is None:
        return GENERIC_GPU
    if isinstance(device, DeviceProfile):
        return device
    if isinstance(device, Mapping):
        return profile_from_dict(device)
    if isinstance(device, os.PathLike) or (isinstance(device, str) and device.endswith(".json")):
        path = Path(device)
        if not path.exists():
            raise ValueError(f"no device profile file {str(path)!r}")
        try:
            return profile_from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as exc:
            raise ValueError(f"device profile {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(device, str):
        raise TypeError(
            f"device must be a name such as 'a100-40gb' or 'cpu', a DeviceProfile or a "
            f"dict; got {type(device).__name__}"
        )
    wanted = _normalise(device)
    if wanted == "cpu":
        return _cpu_profile()
    wanted = _normalise(_ALIASES.get(wanted, wanted))
    for key, profile in PROFILES.items():
        if _normalise(key) == wanted:
            return _CALIBRATED.get(key, profile)
    raise ValueError(
        f"unknown device {device!r}: use one of {', '.join(known_devices())}, "
        "a DeviceProfile, or a dict/JSON file with name, kind and memory_bytes"
    )


_FIELDS = {f.name for f in dataclasses.fields(DeviceProfile)}


def profile_from_dict(data: Mapping[str, Any]) -> DeviceProfile:
    """A user's profile: ``name`` and ``memory_bytes`` (or ``memory_gib``) at
    least; ``kind`` defaults to gpu; missing overheads come from the generic
    profile of that kind."""
    values = dict(data)
    if "memory_gib" in values:
        values["memory_bytes"] = int(float(values.pop("memory_gib")) * GiB)
    unknown = set(values) - _FIELDS - {"available_bytes"}
    if unknown:
        raise ValueError(f"unknown device profile field(s) {sorted(unknown)}; "
                         f"known: {sorted(_FIELDS)}")
    values.pop("available_bytes", None)
    if "name" not in values:
        raise ValueError("a device profile needs a 'name'")
    kind = values.setdefault("kind", "gpu")
    if kind not in ("cpu", "gpu"):
        raise ValueError(f"device kind must be 'cpu' or 'gpu', got {kind!r}")
    base = _cpu_profile() if kind == "cpu" else GENERIC_GPU
    values.setdefault("overhead_bytes", base.overhead_bytes)
    for key in ("upcast_dtypes", "accumulate_dtypes", "gradient_buffer_dtypes",
                "reference_kernels"):
        values[key] = tuple(values.get(key, getattr(base, key)))
    for key in ("weight_grad_lag", "op_time_sigma", "order_histories", "simulated_steps"):
        values.setdefault(key, getattr(base, key))
    if "compute_capability" in values and values["compute_capability"] is not None:
        values["compute_capability"] = tuple(values["compute_capability"])
    if "reserved_bytes" not in values:
        mem = values.get("memory_bytes")
        values["reserved_bytes"] = (tf_reserved_bytes(mem, values.get("compute_capability"))
                                    if kind == "gpu" and mem else 0)
    values.setdefault("source", "user profile")
    return DeviceProfile(**values)


def detect_devices() -> list[DeviceProfile]:
    """Profiles of this machine's devices: TensorFlow's GPUs (matched to the
    catalogue by name, with total memory from NVML when ``nvidia-ml-py`` is
    installed), and the CPU."""
    found: list[DeviceProfile] = []
    try:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
    except Exception:
        gpus = []
    nvml_memory = _nvml_memory()
    for i, gpu in enumerate(gpus):
        details: dict[str, Any] = {}
        try:
            details = tf.config.experimental.get_device_details(gpu)
        except Exception:
            pass
        name = str(details.get("device_name", f"GPU {i}"))
        cc = details.get("compute_capability")
        profile: DeviceProfile | None = None
        try:
            profile = get_device(name)
        except ValueError:
            for key in sorted(PROFILES, key=len, reverse=True):
                if key != "gpu" and _normalise(key).split("gb")[0] in _normalise(name):
                    profile = PROFILES[key]
                    break
        memory = nvml_memory[i][0] if i < len(nvml_memory) else None
        base = profile or GENERIC_GPU
        memory = memory or base.memory_bytes
        found.append(dataclasses.replace(
            base, name=f"{base.name}" if profile else f"gpu:{i}", memory_bytes=memory,
            compute_capability=tuple(cc) if cc else base.compute_capability,
            reserved_bytes=tf_reserved_bytes(memory, tuple(cc) if cc else None)
            if memory else base.reserved_bytes,
            source=f"detected: {name}" + (" (memory from NVML)" if i < len(nvml_memory)
                                          else "") + f"; {base.source}",
        ))
    found.append(_cpu_profile())
    return found


def _nvml_memory() -> list[tuple[int, int]]:
    """(total, free) bytes per GPU from NVML, or [] without nvidia-ml-py."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
                out.append((int(info.total), int(info.free)))
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return []
