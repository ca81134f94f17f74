"""Figures (matplotlib, the ``plot`` extra): memory against batch size.

The core package imports without matplotlib; these functions import it when
called and say how to install it when it is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .devices import DeviceProfile, get_device
from .records import MemoryEstimate

GiB = 1024**3

# each part of the peak; the optimizer's state less the accumulators an update
# has reset before the peak
_COMPONENTS = [
    ("runtime (outside the allocator)", lambda e: e.overhead_bytes, "#b0b0b0"),
    ("weights", lambda e: e.weights_bytes, "#4c72b0"),
    ("optimizer state", lambda e: e.optimizer_bytes - e.released_bytes, "#55a868"),
    ("input batch and constants", lambda e: e.input_bytes + e.constants_bytes, "#8172b2"),
    ("activations", lambda e: e.activations_bytes, "#dd8452"),
    ("gradients", lambda e: e.gradients_bytes, "#c44e52"),
    ("workspace + allocator chunks", lambda e: e.workspace_bytes + e.allocator_bytes, "#937860"),
]


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "plots need matplotlib: pip install 'keras-memscope[plot]'"
        ) from None
    return plt


def memory_vs_batch(
    model: Any,
    path: str,
    *,
    device: str | DeviceProfile | None = "gpu",
    batch_sizes: Sequence[int] | None = None,
    memory_bytes: int | None = None,
    safety_margin: float = 0.05,
    **options: Any,
) -> list[MemoryEstimate]:
    """Write a PNG of the training-step memory against batch size, stacked by
    component, with the device's limit and the largest batch that fits.

    Returns the estimates plotted.
    """
    from .estimator import estimate
    from .planning import _with_scaler, max_batch_size

    plt = _pyplot()
    profile = get_device(device)
    usable = None
    if memory_bytes is not None:
        usable = memory_bytes + profile.overhead_bytes
    elif profile.memory_bytes is not None:
        usable = profile.memory_bytes - profile.reserved_bytes
    opts = _with_scaler(model, options)
    best = None
    if usable is not None:
        best = max_batch_size(model, device=profile, memory_bytes=usable - profile.overhead_bytes,
                              safety_margin=safety_margin, **opts)
    if batch_sizes is None:
        top = max(8, int((best or 64) * 1.6))
        step = max(1, top // 24)
        batch_sizes = sorted({1, *range(step, top + 1, step), *([best] if best else [])})
    ests = [estimate(model, b, device=profile, **opts) for b in batch_sizes]

    fig, ax = plt.subplots(figsize=(9, 5.2), dpi=130)
    xs = list(batch_sizes)
    stacks = []
    for label, part, color in _COMPONENTS:
        stacks.append((label, [part(e) / GiB for e in ests], color))
    ax.stackplot(xs, *[ys for _, ys, _ in stacks], labels=[lab for lab, _, _ in stacks],
                 colors=[c for _, _, c in stacks], alpha=0.9, linewidth=0)
    if usable is not None:
        ax.axhline(usable / GiB, color="black", linewidth=1.6)
        ax.text(xs[0], usable / GiB, f"  {profile.name}: {usable / GiB:.1f} GiB usable by "
                "TensorFlow", va="bottom", ha="left", fontsize=9)
        if safety_margin:
            margin_line = (profile.overhead_bytes
                           + (usable - profile.overhead_bytes) * (1 - safety_margin)) / GiB
            ax.axhline(margin_line, color="black", linewidth=0.8, linestyle=":")
            ax.text(xs[-1], margin_line, f"{safety_margin:.0%} safety margin  ", va="top",
                    ha="right", fontsize=8)
    if best:
        ax.axvline(best, color="black", linestyle="--", linewidth=1.2)
        ax.annotate(f"largest batch that fits: {best}", xy=(best, 0), xytext=(6, 18),
                    textcoords="offset points", fontsize=10, fontweight="bold")
    e0 = ests[0]
    ax.set_title(f"{e0.model_name}: training-step memory by batch size\n"
                 f"{e0.optimizer}, {e0.dtype_policy}, estimated by keras_memscope",
                 fontsize=11)
    ax.set_xlabel("batch size")
    ax.set_ylabel("memory (GiB)")
    ax.set_xlim(xs[0], xs[-1])
    ax.set_ylim(0, max(max(e.total_bytes for e in ests), usable or 0) / GiB * 1.08)
    ax.grid(axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", fontsize=8.5, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return ests


_PHASE_COLORS = {"forward pass": "#dbe9f6", "backward pass and updates": "#fde8e4"}


def timeline(
    estimates: MemoryEstimate | Sequence[MemoryEstimate],
    path: str,
    *,
    labels: Sequence[str] | None = None,
) -> None:
    """Write a PNG of live memory over the events of a training step.

    Several estimates (before and after a remedy) share the axes; the
    background shows the first one's phases (forward, backward, updates,
    recomputation), and each curve's peak is marked with what holds most
    memory there.
    """
    plt = _pyplot()
    ests = [estimates] if isinstance(estimates, MemoryEstimate) else list(estimates)
    if not ests:
        raise ValueError("timeline needs at least one estimate")
    labels = list(labels) if labels else [
        (e.remat and f"recompute {e.remat}") or f"{e.optimizer}, {e.dtype_policy}" for e in ests]
    fig, ax = plt.subplots(figsize=(10, 5), dpi=130)
    first = ests[0].timeline
    n0 = max(len(first), 1)
    split = next((i for i, p in enumerate(first) if p.phase not in ("forward", "loss")), n0)
    ax.axvspan(0, split / n0, color=_PHASE_COLORS["forward pass"], lw=0)
    ax.axvspan(split / n0, 1, color=_PHASE_COLORS["backward pass and updates"], lw=0)
    colors = ["#1f4e79", "#c0504d", "#4f8a3c", "#7f6084"]
    unit = GiB if max(e.peak_bytes for e in ests) > GiB else 2**20
    unit_name = "GiB" if unit == GiB else "MiB"
    for k, (e, label) in enumerate(zip(ests, labels)):
        color = colors[k % len(colors)]
        n = max(len(e.timeline), 1)
        xs = [p.index / n for p in e.timeline]
        ys = [p.high_bytes / unit for p in e.timeline]
        ax.plot(xs, ys, color=color, lw=1.6,
                label=f"{label}: peak {e.peak_bytes / unit:.2f} {unit_name}")
        if ys:
            top = max(range(len(ys)), key=ys.__getitem__)
            ax.plot([xs[top]], [ys[top]], "o", color=color)
            holder = e.peak_holders[0] if e.peak_holders else None
            text = f"largest holder: {holder.kind} of {holder.layer}" if holder else ""
            ax.text(0.99, 0.97 - 0.06 * k, f"{label} peak ({e.peak_phase}). {text}",
                    transform=ax.transAxes, ha="right", va="top", fontsize=8,
                    color=color)
        ax.axhline(e.persistent_bytes / unit, color=color, lw=0.8, ls=":")
    from matplotlib.patches import Patch

    phases = [Patch(color=c, label=p) for p, c in _PHASE_COLORS.items()]
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles + phases, names + [p.get_label() for p in phases], fontsize=8,
              loc="lower left", frameon=True, framealpha=0.9)
    e0 = ests[0]
    ax.set_title(f"{e0.model_name}, batch {e0.batch_size}: allocator memory through one "
                 "training step (dotted: held between steps)", fontsize=11)
    ax.set_xlabel("progress through the step (events of the simulated step)")
    ax.set_ylabel(f"live memory ({unit_name})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, max(e.peak_bytes for e in ests) / unit * 1.25)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


plot_timeline = timeline
