"""Where a training step's peak comes from, measured and estimated: the
forward pass's layout against the backward pass's order.

    python -m benchmarks.step_phases --model mlp_gelu --batch 1024 --remat activations
    python -m benchmarks.step_phases --model convmixer --batch 16 --optimizer adamw

An estimate off by some MiB can be off in the forward pass (the tensors it
keeps, and the allocator's chunks around them: the bytes in use when the loss
starts) or in the backward pass (what the gradients add on top, which
depends on the order the CPU's two threads run them in). This splits both
sides the same way. Measured: fresh processes (BFC allocator on the CPU, as
``measure()`` runs them), each step after the warm-up profiled on its own
(the allocator's bytes in use after every allocation and free): the bytes
in use after the model's first forward allocation, the forward pass's high,
the bytes in use after its last (the level the loss starts from), the
step's peak, and the peak minus that level (what the backward pass and the
updates add). Estimated: the same
figures from the timeline of every simulated order (``history_peaks``: the
nominal order and the others; the estimate is the highest peak).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MIB = 2**20

PROFILED_STEPS = r"""
import json, sys
from keras_memscope.measure import _profiled, _xspace_events, run_steps
from benchmarks.remedies import build
spec = json.loads(sys.argv[1])
model = build(spec["model"], policy=spec["policy"], remat=spec["remat"])
steps = []

def allocations(path):
    return [[s.get("bytes_allocated") or 0, str(s.get("tf_op") or "")]
            for _, s in _xspace_events(path, ("MemoryAllocation", "MemoryDeallocation"))
            if str(s.get("allocator_name", "")).startswith("bfc_cpu")]

run_steps(model, spec["batch"], optimizer=spec["optimizer"], loss=None, steps=spec["steps"],
          device="cpu", around_step=lambda step: steps.append(_profiled(step, allocations)))
print(json.dumps({"name": model.name, "steps": steps}))
"""


def phases(events: list[list], model_name: str) -> dict[str, int] | None:
    """One profiled step's figures from its allocator events (``[bytes in
    use after, op name]`` in time order): in use after the model's first
    forward allocation (an op in the model's name scope, not a gradient),
    the forward pass's high, in use after its last forward allocation (the
    level the loss starts from), the peak and the peak's rise over that
    level. None where the step has no forward op."""
    forward = [i for i, (_, op) in enumerate(events)
               if op.split("/")[0].startswith(model_name)]
    if not forward:
        return None
    at = forward[-1]
    level = events[at][0]
    peak = max(in_use for in_use, _ in events)
    return {"start": events[forward[0]][0],
            "forward": max(in_use for in_use, _ in events[:at + 1]),
            "loss": level, "peak": peak, "rise": peak - level}


def simulated(result) -> dict[str, int]:
    """The same figures from one simulated step (``schedule.StepResult``)."""
    forward = [p for p in result.timeline if p.phase == "forward"]
    # the level the loss starts from: after the last forward op, as measured
    level = (forward[-1].live_bytes if forward
             else next(p.live_bytes for p in result.timeline if p.phase == "loss"))
    return {"start": forward[0].live_bytes if forward else level,
            "forward": max((max(p.live_bytes, p.high_bytes) for p in forward), default=level),
            "loss": level, "peak": result.peak_bytes, "rise": result.peak_bytes - level}


def measured(spec: dict, processes: int) -> list[list[dict[str, int]]]:
    """Each process's steps' figures (:func:`phases`)."""
    from benchmarks.allocator_replay import record

    out = []
    for _ in range(processes):
        run = record(PROFILED_STEPS, [json.dumps(spec)])
        figures = (phases(events, run["name"]) for events in run["steps"])
        out.append([f for f in figures if f is not None])
    return out


@contextlib.contextmanager
def simulations() -> Iterator[list[Any]]:
    """Every ``schedule.StepResult`` the estimator simulates while inside,
    in order (the nominal order first)."""
    from keras_memscope import estimator

    results: list[Any] = []
    simulate = estimator.simulate

    def recording(*args: Any, **kwargs: Any) -> Any:
        results.append(simulate(*args, **kwargs))
        return results[-1]

    estimator.simulate = recording
    try:
        yield results
    finally:
        estimator.simulate = simulate


def estimated(spec: dict) -> list[dict[str, int]]:
    """The figures of every simulated order, the nominal first."""
    import keras_memscope as memscope

    from .remedies import build

    model = build(spec["model"], policy=spec["policy"], remat=spec["remat"])
    with simulations() as results:
        est = memscope.estimate(model, batch_size=spec["batch"], optimizer=spec["optimizer"],
                                device="cpu", method="graph")
    orders = max(1, len(est.history_peaks))  # a recurrent worst case may follow them
    return [simulated(r) for r in results[:orders]]


def _span(values: list[int]) -> str:
    low, high = min(values) / MIB, max(values) / MIB
    return f"{low:.1f}" if round(low, 1) == round(high, 1) else f"{low:.1f} - {high:.1f}"


def table(real: list[list[dict[str, int]]], orders: list[dict[str, int]]) -> str:
    from tabulate import tabulate

    keys = [("start", "after the first forward op"), ("forward", "forward high"),
            ("loss", "in use at the loss"), ("rise", "backward rise"), ("peak", "step peak")]
    steps = [s for p in real for s in p]
    rows = [[label, _span([s[k] for s in steps]), f"{orders[0][k] / MIB:.1f}",
             _span([o[k] for o in orders])] for k, label in keys]
    return tabulate(rows, headers=["MiB", f"measured ({len(real)} processes, {len(steps)} steps)",
                                   "nominal order", f"{len(orders)} simulated orders"],
                    tablefmt="github")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a builder of benchmarks/zoo.py")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--remat", default=None, help="a RematScope mode, e.g. activations")
    parser.add_argument("--policy", default=None, help="a dtype policy, e.g. mixed_bfloat16")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="profiled steps per process")
    options = parser.parse_args(argv)
    spec = {"model": options.model, "batch": options.batch, "optimizer": options.optimizer,
            "remat": options.remat, "policy": options.policy, "steps": options.steps}
    real = measured(spec, options.processes)
    if not any(real):
        print("no profiled step had an op in the model's name scope to split it at",
              file=sys.stderr)
        return 1
    orders = estimated(spec)
    what = ", ".join(f"{k} {v}" for k, v in spec.items() if v and k != "steps")
    print(what)
    print(table(real, orders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
