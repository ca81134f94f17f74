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
from typing import Any

from .devices import DeviceProfile, get_device
from .records import MemoryEstimate


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """One way to make training fit, with its predicted allocator peak."""

    title: str
    change: dict[str, Any]
    required_bytes: int
    fits: bool
    cost: str
    #: compute added per effective batch, as a fraction (0.33: a third more)
    extra_compute: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["change"] = {k: _plain(v) for k, v in self.change.items()}
        return data


def _plain(value: Any) -> Any:
    """A JSON-ready form of a change (an optimizer becomes its class and config)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "get_config"):
        config = value.get_config()
        keep = {k: config[k] for k in ("momentum", "nesterov", "learning_rate",
                                       "gradient_accumulation_steps") if k in config}
        return {"class": type(value).__name__, **keep}
    return repr(value)


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

    @property
    def worst_case_bytes(self) -> int:
        """Required plus what the executor's scheduling may add
        (``MemoryEstimate.possible_extra_bytes``)."""
        return self.required_bytes + self.estimate.possible_extra_bytes

    @property
    def worst_case_fits(self) -> bool:
        """Whether ``worst_case_bytes`` fits, by the same margin as ``fits``."""
        return self.worst_case_bytes <= _usable(self.available_bytes, self.safety_margin)

    def to_dict(self) -> dict[str, Any]:
        return {"fits": self.fits, "batch_size": self.batch_size, "device": self.device,
                "required_bytes": self.required_bytes, "available_bytes": self.available_bytes,
                "headroom_bytes": self.headroom_bytes, "safety_margin": self.safety_margin,
                "worst_case_bytes": self.worst_case_bytes,
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


def _usable(available: int, margin: float) -> float:
    """What an estimate may reach to fit: ``available`` less the margin."""
    return available * (1 - margin)


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
    from .estimator import check_options, estimate
    from .transform import resolve_model

    check_options("fits", options, "memory_bytes", "safety_margin", "suggest")
    model = resolve_model(model)
    profile = get_device(device)
    available = _available(profile, memory_bytes)
    margin = _check_margin(safety_margin)
    est = estimate(model, batch_size, device=profile, **options)
    ok = est.peak_bytes <= _usable(available, margin)
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
    from .estimator import _check_model, check_options
    from .transform import resolve_model

    check_options("max_batch_size", options, "memory_bytes", "safety_margin", "upper",
                  "verify")
    model = resolve_model(model)
    _check_model(model)
    profile = get_device(device)
    available = _available(profile, memory_bytes)
    limit = int(_usable(available, _check_margin(safety_margin)))
    if not isinstance(upper, int) or upper < 1:
        raise ValueError(f"upper must be a positive integer, got {upper!r}")
    from .estimator import resolve_method

    method = resolve_method(options.pop("method", "auto"))
    # the rule engine finds the boundary quickly; the graph method decides it
    options = _with_scaler(model, {**options, "method": "rules"})
    search = _solve(model, profile, limit, upper, options)
    if method == "graph" and search.predicted > 0:
        search = _refine_with_graph(model, profile, limit, search, options, upper)
    options = _without(options, "_graphs") | {"method": method}
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
    """Options for a sweep over batch sizes: the rule engine (unless a method
    is asked for) with traces from which every batch size follows."""
    options = {**options}
    options.setdefault("method", "rules")
    if "_graphs" in options or options.get("dtype_policy") or options.get("rules") \
            or options["method"] != "rules":
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


def _refine_with_graph(model: Any, profile: DeviceProfile, limit: int, search: BatchSearch,
                       options: dict[str, Any], upper: int) -> BatchSearch:
    """The rule engine found the boundary quickly; the graph method (the
    default estimate) decides it: from the rules' answer, steps growing
    twofold bracket the graph method's boundary, and bisection closes it."""
    from .estimator import estimate

    opts = _without(options, "_graphs", "method")
    cache: dict[int, int] = {}

    def peak(b: int) -> int:
        if b not in cache:
            cache[b] = estimate(model, b, device=profile, method="graph", **opts).peak_bytes
        return cache[b]

    b0 = search.predicted
    step = max(1, b0 // 64)
    if peak(b0) <= limit:
        lo, hi = b0, upper + 1
        while lo + step <= upper:
            if peak(lo + step) > limit:
                hi = lo + step
                break
            lo += step
            step *= 2
    else:
        lo, hi = 0, b0
        while hi - step >= 1:
            if peak(hi - step) <= limit:
                lo = hi - step
                break
            hi -= step
            step *= 2
        if lo == 0 and hi > 1 and peak(1) <= limit:
            lo = 1
    while hi - lo > 1 and lo >= 1:
        mid = (lo + hi) // 2
        if peak(mid) <= limit:
            lo = mid
        else:
            hi = mid
    n = search.estimates + len(cache)
    if lo < 1:
        return dataclasses.replace(search, predicted=0, predicted_bytes=peak(1), estimates=n)
    return dataclasses.replace(search, predicted=lo, predicted_bytes=peak(lo), estimates=n)


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

    from .measure import MeasurementKilled, measure_subprocess

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
    except MeasurementKilled:
        # oneDNN's kernels crash (SIGSEGV) when the allocator refuses them
        # under the limit, where TensorFlow's own raise ResourceExhausted
        # (the zoo's CNN at batch 400 under 128 MiB: killed by SIGSEGV; with
        # TF_ENABLE_ONEDNN_OPTS=0 ResourceExhausted; without the limit it runs)
        return "out of memory"
    except RuntimeError as exc:
        text = str(exc)
        if "ResourceExhausted" in text or "OOM" in text or "out of memory" in text.lower():
            return "out of memory"
        raise
    return "fits"


def _remedy_candidates(model: Any, est: MemoryEstimate, profile: DeviceProfile,
                       options: dict[str, Any], micro: int) -> list[tuple[str, dict, str]]:
    """(title, whatif changes, what it costs) for each remedy that applies."""
    from .optimizers import accumulation_steps, resolve

    out: list[tuple[str, dict, str]] = []
    batch = est.batch_size
    # an optimizer that already accumulates is not offered more accumulation,
    # and keeps accumulating under another optimizer
    steps_now = accumulation_steps(resolve(options.get("optimizer"), model)[0])
    if 0 < micro < batch and not steps_now:
        # the fewest steps whose equal micro-batches fit (the effective batch
        # stays the same only when the steps divide it)
        steps = min(k for k in range(2, batch + 1) if batch % k == 0 and batch // k <= micro)
        out.append(_accumulation(batch, steps))
    if est.dtype_policy == "float32" and _rebuildable(model):
        half = "mixed_bfloat16" if "bfloat16" in profile.peak_flops or profile.kind == "cpu" \
            else "mixed_float16"
        out.append((f"mixed precision ({half})", {"dtype_policy": half},
                    "faster on tensor cores; float32 weights and optimizer state remain"))
    if est.optimizer_bytes > 1024 and not est.optimizer.startswith("SGD"):
        import keras

        out.append(("SGD with momentum instead of " + est.optimizer.split("(")[0],
                    {"optimizer": keras.optimizers.SGD(
                        momentum=0.9, gradient_accumulation_steps=steps_now or None)},
                    "one slot per weight; may need learning-rate tuning"))
    from .remat import activation_blockers

    if not activation_blockers(model):
        out.append(("recompute activation functions (RematScope 'activations')",
                    {"remat": "activations"}, "recomputes activations in the backward pass"))
    out.append(("checkpoint about sqrt(n) segments, recompute the rest",
                {"remat": "checkpoints"},
                "about one more forward pass; Keras has no built-in segment checkpointing"))
    from .changes import weighted_layers

    with_weights = [layer.name for layer in weighted_layers(model)]
    half = with_weights[: len(with_weights) // 2]
    if half:
        out.append((f"freeze the first {len(half)} of {len(with_weights)} layers with weights "
                    f"({half[0]} ... {half[-1]})", {"freeze": half},
                    "fine-tuning instead of full training; fewer FLOPs"))
    return out


def _accumulation(batch: int, steps: int) -> tuple[str, dict, str]:
    return (f"batch {batch // steps} x {steps} accumulation steps "
            f"(same effective batch {batch})", {"accumulation_steps": steps},
            f"{steps} smaller steps per update; gradient accumulators the size of "
            "the weights, held between steps")


def suggest_remedies(model: Any, est: MemoryEstimate, profile: DeviceProfile, available: int,
                     margin: float, options: dict[str, Any]) -> list[Suggestion]:
    """Remedies ranked by memory saved per compute added, then, until one fits,
    the best ones combined (each step estimated)."""
    limit = _usable(available, margin)
    # the what-ifs use the method of the estimate they improve on
    options = _with_scaler(model, {**options, "method": est.method})
    micro = max_batch_size(model, device=profile, memory_bytes=available,
                           safety_margin=margin, **options)
    base_flops = est.forward_flops + est.backward_flops or 1
    scored = []
    for title, change, cost in _remedy_candidates(model, est, profile, options,
                                                  micro if isinstance(micro, int) else 0):
        e = _whatif_or_none(model, est.batch_size, profile, options, change)
        # the largest micro-batch that fits alone may not fit beside the
        # accumulators: then the next number of steps that divides the batch
        more = [k for k in range(change.get("accumulation_steps", 0) + 1, est.batch_size + 1)
                if est.batch_size % k == 0][:6] if "accumulation_steps" in change else []
        while e is not None and e.peak_bytes > limit and more:
            title, change, cost = _accumulation(est.batch_size, more.pop(0))
            e = _whatif_or_none(model, est.batch_size, profile, options, change)
        if e is None:
            continue
        saved = est.peak_bytes - e.peak_bytes
        if saved < est.peak_bytes * 0.01:
            continue
        steps = change.get("accumulation_steps", 1)  # per effective batch
        work = (e.forward_flops + e.backward_flops + e.recompute_flops) * steps
        extra = (work - base_flops) / base_flops
        extra_text = f"{extra:+.0%} compute"
        scored.append((saved / (1 + max(extra, 0.0)), Suggestion(
            title, change, e.peak_bytes, e.peak_bytes <= limit, f"{cost}; {extra_text}",
            extra_compute=extra)))
    scored.sort(key=lambda t: -t[0])
    out = [s for _, s in scored]
    if out and not any(s.fits for s in out):
        combined: dict[str, Any] = {}
        titles: list[str] = []
        for s in out:
            if set(s.change) & set(combined):
                continue  # one choice per kind of change
            combined.update(s.change)
            titles.append(s.title.split(" (")[0])
            if len(titles) < 2:
                continue
            e = _whatif_or_none(model, est.batch_size, profile, options, combined)
            if e is None:
                break
            out.append(Suggestion(" + ".join(titles), dict(combined), e.peak_bytes,
                                  e.peak_bytes <= limit, "combined"))
            if e.peak_bytes <= limit:
                break
    return out


def _whatif_or_none(model: Any, batch_size: int, profile: DeviceProfile,
                    options: dict[str, Any], change: dict[str, Any]) -> MemoryEstimate | None:
    """The what-if estimate of ``change``, or None when it does not apply."""
    from .changes import whatif

    # traces scaled from the unchanged model do not hold under these changes
    drop = ["_graphs"] if {"dtype_policy", "remat", "freeze"} & set(change) else []
    if "optimizer" in change:
        drop.append("optimizer")
    try:
        return whatif(model, batch_size, device=profile,
                      **{**_without(options, *drop), **change})
    except (ValueError, TypeError):
        return None


def _without(options: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k not in keys}


def _rebuildable(model: Any) -> bool:
    import keras
    from keras.src.models.functional import Functional

    return isinstance(model, (Functional, keras.Sequential))
