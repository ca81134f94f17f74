"""Will it fit? ``fits``, ``max_batch_size`` and ranked suggestions.

Memory grows with the batch: ``max_batch_size`` fits a line through two
estimates, then checks the estimate itself around the predicted answer (the
allocator makes the curve slightly irregular), a handful of estimates in all.
``verify=True`` confirms on this machine with real training steps near the
predicted batch, in fresh processes with the allocator limited to the memory
given, catching out-of-memory errors.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .devices import DeviceProfile, get_device
from .records import MemoryEstimate
from .units import human_bytes


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """One way to make training fit, with its predicted allocator peak."""

    title: str
    change: dict[str, Any]
    required_bytes: int
    fits: bool
    cost: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class FitReport:
    """Whether one training configuration fits a device."""

    fits: bool
    batch_size: int
    device: str
    required_bytes: int
    available_bytes: int
    safety_margin: float
    estimate: MemoryEstimate
    suggestions: tuple[Suggestion, ...] = ()

    @property
    def headroom_bytes(self) -> int:
        """Available minus required (negative when it does not fit)."""
        return self.available_bytes - self.required_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"fits": self.fits, "batch_size": self.batch_size, "device": self.device,
                "required_bytes": self.required_bytes, "available_bytes": self.available_bytes,
                "headroom_bytes": self.headroom_bytes, "safety_margin": self.safety_margin,
                "suggestions": [s.to_dict() for s in self.suggestions],
                "estimate": self.estimate.to_dict()}


def _available(profile: DeviceProfile, memory_bytes: int | None) -> int:
    if memory_bytes is not None:
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or \
                memory_bytes <= 0:
            raise ValueError(f"memory_bytes must be a positive integer, got {memory_bytes!r}")
        return memory_bytes
    available = profile.available_bytes
    if available is None:
        raise ValueError(
            f"device {profile.name!r} has no known memory size: name a device "
            "(e.g. device='a100-40gb') or pass memory_bytes=..."
        )
    return available


def _check_margin(margin: float) -> float:
    if not 0 <= margin < 1:
        raise ValueError(f"safety_margin must be in [0, 1), got {margin!r}")
    return float(margin)


def fits(
    model: Any,
    batch_size: int,
    *,
    device: str | DeviceProfile | None = "gpu",
    memory_bytes: int | None = None,
    safety_margin: float = 0.05,
    suggest: bool = True,
    **options: Any,
) -> FitReport:
    """Does a training step at ``batch_size`` fit the device?

    ``memory_bytes`` overrides what the device's allocator may use (by default
    the device's memory minus the runtime's overhead and TensorFlow's
    reservation). It fits when the estimated allocator peak is at most
    ``(1 - safety_margin)`` of that. When it does not, ``suggestions`` lists
    the applicable remedies, each with its predicted peak, smallest first.
    """
    from .estimator import estimate
    from .transform import resolve_model

    model = resolve_model(model)
    profile = get_device(device)
    available = _available(profile, memory_bytes)
    margin = _check_margin(safety_margin)
    est = estimate(model, batch_size, device=profile, **options)
    ok = est.peak_bytes <= available * (1 - margin)
    suggestions: tuple[Suggestion, ...] = ()
    if not ok and suggest:
        suggestions = tuple(suggest_remedies(model, est, profile, available, margin, options))
    return FitReport(fits=ok, batch_size=est.batch_size, device=profile.name,
                     required_bytes=est.peak_bytes, available_bytes=available,
                     safety_margin=margin, estimate=est, suggestions=suggestions)


def max_batch_size(
    model: Any,
    *,
    device: str | DeviceProfile | None = "gpu",
    memory_bytes: int | None = None,
    safety_margin: float = 0.05,
    verify: bool = False,
    upper: int = 1 << 16,
    **options: Any,
) -> int | BatchSearch:
    """The largest batch whose estimated peak fits (0 if not even batch 1).

    With ``verify=True`` returns a :class:`BatchSearch` with the predicted and
    the verified batch and the number of real trial steps.
    """
    from .estimator import _check_model
    from .transform import resolve_model

    model = resolve_model(model)
    _check_model(model)
    profile = get_device(device)
    available = _available(profile, memory_bytes)
    limit = int(available * (1 - _check_margin(safety_margin)))
    if not isinstance(upper, int) or upper < 1:
        raise ValueError(f"upper must be a positive integer, got {upper!r}")
    options = _with_scaler(model, options)
    search = _solve(model, profile, limit, upper, options)
    if not verify:
        return search.predicted
    return verify_batch(model, search, limit, profile, options)


@dataclasses.dataclass(frozen=True)
class BatchSearch:
    """How the largest batch was found."""

    predicted: int
    predicted_bytes: int
    estimates: int
    verified: int | None = None
    trials: tuple[tuple[int, str], ...] = ()
    halving_trials: int | None = None

    def __int__(self) -> int:
        return self.verified if self.verified is not None else self.predicted

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["trials"] = [list(t) for t in self.trials]
        return data


def _with_scaler(model: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Options plus traces from which every batch size of this model follows."""
    if "_graphs" in options or options.get("dtype_policy") or options.get("rules"):
        return options
    from .estimator import batch_scaler

    return {**options, "_graphs": batch_scaler(model, input_shape=options.get("input_shape"))}


def _solve(model: Any, profile: DeviceProfile, limit: int, upper: int,
           options: dict[str, Any]) -> BatchSearch:
    """The largest batch in [1, upper] whose estimated peak is within ``limit``."""
    from .estimator import estimate

    cache: dict[int, int] = {}

    def peak(b: int) -> int:
        if b not in cache:
            cache[b] = estimate(model, b, device=profile, **options).peak_bytes
        return cache[b]

    if peak(1) > limit:
        return BatchSearch(0, peak(1), len(cache))
    lo, hi = 1, None  # peak(lo) fits; peak(hi) does not
    probe = min(32, upper)
    if probe > 1:
        if peak(probe) <= limit:
            lo = probe
        else:
            hi = probe
    if lo == upper:
        return BatchSearch(lo, peak(lo), len(cache))
    # A line through the two estimates predicts the answer ...
    slope = max((peak(probe) - peak(1)) / max(probe - 1, 1), 1.0)
    b = int(1 + (limit - peak(1)) / slope)
    # ... then small steps from there find the bracket, and bisection closes it.
    step = max(1, b // 32)
    while hi is None or hi - lo > 1:
        top = upper if hi is None else hi - 1
        b = min(max(b, lo + 1), top)
        if peak(b) <= limit:
            lo = b
            if lo == upper:
                break
            b = b + step if hi is None else (lo + hi) // 2
        else:
            hi = b
            b = max(lo + 1, b - step) if b - step > lo else (lo + hi) // 2
        step *= 2
    return BatchSearch(lo, peak(lo), len(cache))


def verify_batch(model: Any, search: BatchSearch, limit: int, profile: DeviceProfile,
                 options: dict[str, Any]) -> BatchSearch:
    """Real training steps near the predicted batch, each in a fresh process
    with the allocator limited to ``limit`` bytes; out-of-memory is a failure."""
    trials: list[tuple[int, str]] = []

    def ok(b: int) -> bool:
        result = trial_step(model, b, limit, profile, options)
        trials.append((b, result))
        return result == "fits"

    b = max(search.predicted, 1)
    if ok(b):
        good, bad = b, None
        step = max(1, b // 20)
        while bad is None and len(trials) < 6:
            if ok(good + step):
                good += step
                step *= 2
            else:
                bad = good + step
    else:
        bad, good = b, 0
        step = max(1, b // 20)
        while good == 0 and len(trials) < 6 and bad > 1:
            cand = max(1, bad - step)
            if ok(cand):
                good = cand
            else:
                bad = cand
                step *= 2
    # refine between good and bad with at most two more trials
    while bad is not None and bad - good > 1 and len(trials) < 8:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return dataclasses.replace(search, verified=good, trials=tuple(trials),
                               halving_trials=binsearch_trials(good))


def binsearch_trials(largest: int) -> int:
    """Trials of a search that does not predict: double from batch 2 until a
    step fails, then bisect between the last success and the failure (the
    'binsearch' mode of Lightning's batch-size finder), when every batch up to
    ``largest`` fits and none above does."""
    n, low, b = 0, 1, 2
    while True:
        n += 1
        if b <= largest:
            low, b = b, b * 2
        else:
            high = b
            break
    while high - low > 1:
        n += 1
        mid = (low + high) // 2
        if mid <= largest:
            low = mid
        else:
            high = mid
    return n


def trial_step(model: Any, batch_size: int, limit: int, profile: DeviceProfile,
               options: dict[str, Any]) -> str:
    """Run real training steps at ``batch_size`` under an allocator limit:
    ``"fits"`` or ``"out of memory"``."""
    import keras

    from .measure import measure_subprocess

    if profile.kind != "cpu":
        raise ValueError("verify=True runs real training steps on this machine's CPU with "
                         "the allocator limited to the memory given: use device='cpu' "
                         "(and memory_bytes=...)")
    optimizer = options.get("optimizer") or getattr(model, "optimizer", None) or "adam"
    spec = {"model": keras.saving.serialize_keras_object(model), "batch_size": batch_size,
            "optimizer": optimizer if isinstance(optimizer, str)
            else keras.optimizers.serialize(optimizer),
            "steps": 2, "device": "cpu", "loss": None,
            "input_shape": list(options["input_shape"]) if options.get("input_shape") else None,
            "dtype_policy": None}
    env = {"TF_CPU_BFC_MEM_LIMIT_IN_MB": str(max(1, limit // (1 << 20)))}
    try:
        measure_subprocess(spec, extra_env=env)
    except RuntimeError as exc:
        text = str(exc)
        if "ResourceExhausted" in text or "OOM" in text or "out of memory" in text.lower():
            return "out of memory"
        raise
    return "fits"


def suggest_remedies(model: Any, est: MemoryEstimate, profile: DeviceProfile, available: int,
                     margin: float, options: dict[str, Any]) -> list[Suggestion]:
    """Remedies that apply to this model, each estimated; smallest peak first."""
    from .estimator import estimate

    limit = available * (1 - margin)
    out: list[Suggestion] = []
    batch = est.batch_size
    options = _with_scaler(model, options)
    base = {k: v for k, v in options.items() if k not in ("optimizer", "dtype_policy")}
    plain = {k: v for k, v in options.items() if k != "_graphs"}

    def add(title: str, change: dict[str, Any], cost: str, **kwargs: Any) -> None:
        merged = {**options, **kwargs}
        if "dtype_policy" in kwargs:
            merged.pop("_graphs", None)
        try:
            e = estimate(model, merged.pop("batch_size", batch), device=profile, **merged)
        except (ValueError, TypeError):
            return
        out.append(Suggestion(title, change, e.peak_bytes, e.peak_bytes <= limit, cost))

    # 1. a smaller micro-batch with gradient accumulation keeps the effective batch
    micro = max_batch_size(model, device=profile, memory_bytes=available,
                           safety_margin=margin, **options)
    if isinstance(micro, int) and 0 < micro < batch:
        steps = math.ceil(batch / micro)
        micro_b = math.ceil(batch / steps)
        import keras

        from .optimizers import resolve

        opt, _ = resolve(options.get("optimizer"), model)
        config = opt.get_config()
        config["gradient_accumulation_steps"] = steps
        acc = type(opt).from_config(config)
        add(f"batch {micro_b} x {steps} accumulation steps (same effective batch {batch})",
            {"batch_size": micro_b, "accumulation_steps": steps},
            f"{steps} smaller steps per update; one extra gradient-sized buffer",
            batch_size=micro_b, optimizer=acc)
        del keras
    # 2. lower precision
    if est.dtype_policy == "float32" and _rebuildable(model):
        half = "mixed_bfloat16" if "bfloat16" in profile.peak_flops or profile.kind == "cpu" \
            else "mixed_float16"
        add(f"mixed precision ({half})", {"dtype_policy": half},
            "usually faster on tensor cores; float32 weights and optimizer state remain",
            dtype_policy=half)
    # 3. an optimizer with less state
    if est.optimizer_bytes > 1024 and not est.optimizer.startswith("SGD"):
        import keras

        add("SGD with momentum instead of " + est.optimizer.split("(")[0],
            {"optimizer": "SGD(momentum=0.9)"}, "one slot per weight instead of "
            f"{human_bytes(est.optimizer_bytes)} of state; may need learning-rate tuning",
            optimizer=keras.optimizers.SGD(momentum=0.9), **_without(base, "optimizer"))
    # 4. freezing the first half of the layers with weights
    if _rebuildable(model):
        from .transform import rebuild

        with_weights = [layer.name for layer in model._flatten_layers(include_self=False)
                        if layer.trainable_weights and not layer._flatten_layers(
                            include_self=False, recursive=False)]
        half = with_weights[: len(with_weights) // 2]
        if half:
            frozen = rebuild(model, freeze=half)
            try:
                e = estimate(frozen, batch, device=profile, **plain)
                out.append(Suggestion(
                    f"freeze the first {len(half)} of {len(with_weights)} layers with weights "
                    f"({half[0]} ... {half[-1]})", {"freeze": half}, e.peak_bytes,
                    e.peak_bytes <= limit, "fine-tuning instead of full training"))
            except (ValueError, TypeError):
                pass
    # keep what saves at least 1% of the current peak, smallest peak first
    out = [s for s in out if s.required_bytes < est.peak_bytes * 0.99]
    out.sort(key=lambda s: s.required_bytes)
    return out


def _without(options: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k != key}


def _rebuildable(model: Any) -> bool:
    import keras
    from keras.src.models.functional import Functional

    return isinstance(model, (Functional, keras.Sequential))
