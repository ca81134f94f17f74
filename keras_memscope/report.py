"""Records -> text tables (tabulate), JSON and CSV. Computes nothing."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from tabulate import tabulate

from .records import MemoryEstimate
from .units import human_bytes, human_count


def _shape(shapes: tuple[tuple[int, ...], ...]) -> str:
    if not shapes:
        return ""
    text = ", ".join("(" + ", ".join(str(d) for d in s) + ")" for s in shapes)
    return text


def layer_rows(est: MemoryEstimate) -> list[list[object]]:
    step = est.step_time_s
    rows = []
    for r in est.layers:
        row = [
            r.name + (" (shared)" if r.shared else ""),
            r.class_name,
            _shape(r.output_shapes),
            f"{r.params:,}",
            human_bytes(r.activation_bytes),
            human_count(r.forward_macs) if r.forward_macs else "",
            human_count(r.forward_flops + r.backward_flops) if r.forward_flops else "",
        ]
        if step:
            row.append(f"{(r.time_s or 0.0) / step:.1%}")
        rows.append(row)
    return rows


def totals_rows(est: MemoryEstimate) -> list[list[str]]:
    constants = ([["folded constants", human_bytes(est.constants_bytes)]]
                 if est.constants_bytes else [])
    released = ([["accumulators already reset at the peak", "-" + human_bytes(est.released_bytes)]]
                if est.released_bytes else [])
    return [
        ["weights", human_bytes(est.weights_bytes)],
        ["optimizer state", human_bytes(est.optimizer_bytes)],
        ["input batch and labels" if est.input_batches == 1 else
         f"input batches and labels ({est.input_batches}: the next is fetched during the step)",
         human_bytes(est.input_bytes)],
        *constants,
        *released,
        ["activations (alive at peak)", human_bytes(est.activations_bytes)],
        ["gradients (alive at peak)", human_bytes(est.gradients_bytes)],
        ["workspace (alive at peak)", human_bytes(est.workspace_bytes)],
        ["allocator chunks beyond requests", human_bytes(est.allocator_bytes)],
        ["= allocator peak", human_bytes(est.peak_bytes)],
        [f"runtime overhead ({est.device})", human_bytes(est.overhead_bytes)],
        ["= total", human_bytes(est.total_bytes)],
        *([["held between steps, in the allocator's chunks", human_bytes(est.held_bytes)]]
          if est.held_bytes else []),
    ]


def render_summary(est: MemoryEstimate, *, max_holders: int = 5) -> str:
    """The text ``memscope.summary`` prints."""
    head = (
        f'Model "{est.model_name}"  batch {est.batch_size}  optimizer {est.optimizer}  '
        f"policy {est.dtype_policy}  device {est.device}  method {est.method}"
    )
    headers = ["Layer", "Class", "Output shape", "Params", "Kept for backward", "Fwd MACs",
               "Fwd+bwd FLOPs"]
    if est.step_time_s:
        headers.append("% time")
    table = tabulate(layer_rows(est), headers=headers, tablefmt="simple",
                     disable_numparse=True)
    totals = tabulate(totals_rows(est), tablefmt="plain", colalign=("left", "right"))
    time_line = (f"Step time on {est.device}: {est.step_time_s:.3g} s" if est.step_time_s
                 else f"No step time: device {est.device!r} has no speeds "
                      "(name a GPU, or run memscope.calibrate('cpu') first)")
    lines = [head, table, "",
             f"Params: {est.params:,} ({est.trainable_params:,} trainable)   "
             f"Forward MACs: {human_count(est.forward_macs)}   FLOPs: forward "
             f"{human_count(est.forward_flops)}, backward {human_count(est.backward_flops)} "
             "(1 MAC = 2 FLOPs)",
             time_line, "", render_breakdown(est),
             f"Saved activations at the end of the forward pass: "
             f"{human_bytes(est.saved_activations_bytes)}",
             f"Without freeing or reuse, one step would need "
             f"{human_bytes(est.no_reuse_bytes)}; liveness and in-place buffers bring the "
             f"peak to {human_bytes(est.peak_bytes)} "
             f"({est.no_reuse_bytes / max(est.peak_bytes, 1):.1f} x less)",
             "", totals, "", f"Peak during the {est.peak_phase} phase; largest holders:"]
    for h in est.peak_holders[:max_holders]:
        lines.append(f"  {human_bytes(h.bytes):>10}  {h.kind:<17} {h.layer}")
    if est.unsupported:
        lines.append("")
        lines.append("No cost rule (fallback used): " + ", ".join(
            f"{k} x{v}" for k, v in est.unsupported.items()))
    for note in est.notes:
        lines.append(f"Note: {note}")
    return "\n".join(lines)


def to_json(est: MemoryEstimate, *, indent: int | None = 2) -> str:
    return json.dumps(est.to_dict(), indent=indent)


def to_csv(est: MemoryEstimate) -> str:
    """One row per layer call."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["name", "class_name", "output_shapes", "params", "trainable_params",
                     "activation_bytes", "workspace_bytes", "forward_macs", "shared", "rule"])
    for r in est.layers:
        writer.writerow([r.name, r.class_name, _shape(r.output_shapes), r.params,
                         r.trainable_params, r.activation_bytes, r.workspace_bytes,
                         r.forward_macs, r.shared, r.rule])
    return out.getvalue()


def render_fit(report: Any) -> str:
    """The text of ``memscope fit``."""
    verdict = "FITS" if report.fits else "DOES NOT FIT"
    lines = [
        f"{report.estimate.model_name} at batch {report.batch_size} on {report.device}: {verdict}",
        f"  required (allocator peak) {human_bytes(report.required_bytes)}",
        f"  available to the allocator {human_bytes(report.available_bytes)} "
        f"(safety margin {report.safety_margin:.0%})",
        f"  headroom {human_bytes(report.headroom_bytes)}"
        + ("" if report.fits or report.headroom_bytes < 0 else
           f" (less than the {report.safety_margin:.0%} safety margin)"),
    ]
    if report.worst_case_bytes > report.required_bytes:
        lines.append(
            f"  up to {human_bytes(report.worst_case_bytes)} if a recurrent gradient loop "
            "runs ahead of its weight sums (see the notes): "
            + ("still fits" if report.worst_case_fits else "would not fit"))
    if report.suggestions:
        lines.append("")
        lines.append("Ways to make it fit (predicted allocator peak):")
        rows = [[s.title, human_bytes(s.required_bytes), "yes" if s.fits else "no", s.cost]
                for s in report.suggestions]
        lines.append(tabulate(rows, headers=["change", "peak", "fits", "cost"],
                              tablefmt="simple", disable_numparse=True))
    for note in report.estimate.notes:
        lines.append(f"Note: {note}")
    return "\n".join(lines)


def render_devices(catalogue: list[Any], local: list[Any]) -> str:
    """The text of ``memscope devices``."""
    def row(p: Any) -> list[str]:
        flops = p.peak_flops
        return [p.name, p.kind,
                human_bytes(p.memory_bytes) if p.memory_bytes else "?",
                human_bytes(p.available_bytes) if p.available_bytes else "?",
                f"{flops['float32'] / 1e12:.1f}" if "float32" in flops else "",
                f"{flops['bfloat16'] / 1e12:.0f}" if "bfloat16" in flops else
                (f"{flops['float16'] / 1e12:.0f}" if "float16" in flops else ""),
                f"{p.bandwidth_bytes_s / 1e9:.0f}" if p.bandwidth_bytes_s else ""]

    head = ["name", "kind", "memory", "for TF's allocator", "FP32 TFLOP/s",
            "16-bit TFLOP/s", "GB/s"]
    return "\n".join([
        "Catalogue:", tabulate([row(p) for p in catalogue], headers=head, tablefmt="simple",
                               disable_numparse=True),
        "", "This machine:", tabulate([row(p) for p in local], headers=head, tablefmt="simple",
                                      disable_numparse=True),
    ])


def category_breakdown(est: MemoryEstimate) -> list[dict[str, Any]]:
    """Per layer family: share of parameters, FLOPs and time (the optimizer's
    update is its own row); rows sum to 1 in each column."""
    from .rules import CATEGORIES

    params = {c: 0 for c in CATEGORIES}
    flops = {c: 0 for c in CATEGORIES}
    times = {c: 0.0 for c in CATEGORIES}
    for r in est.layers:
        cat = r.category if r.category in params else "other"
        params[cat] += r.params
        flops[cat] += r.forward_flops + r.backward_flops
        times[cat] += r.time_s or 0.0
    rows = []
    total_p = sum(params.values()) or 1
    total_f = sum(flops.values()) or 1
    timed = est.step_time_s is not None
    total_t = (est.step_time_s or 0.0) or 1.0
    for cat in CATEGORIES:
        if not (params[cat] or flops[cat] or times[cat]):
            continue
        rows.append({"category": cat, "param_share": params[cat] / total_p,
                     "flop_share": flops[cat] / total_f,
                     "time_share": times[cat] / total_t if timed else None})
    if timed:
        rows.append({"category": "optimizer", "param_share": 0.0, "flop_share": 0.0,
                     "time_share": (est.update_time_s or 0.0) / total_t})
    return rows


def render_breakdown(est: MemoryEstimate) -> str:
    rows = [[r["category"], f"{r['param_share']:.1%}", f"{r['flop_share']:.1%}",
             "" if r["time_share"] is None else f"{r['time_share']:.1%}"]
            for r in category_breakdown(est)]
    return tabulate(rows, headers=["family", "% params", "% FLOPs", "% time"],
                    tablefmt="simple", disable_numparse=True)
