"""Every allocation of a training run, real or simulated, in order.

    python -m benchmarks.allocation_trace --model selunet --batch 512 --optimizer adamw
    python -m benchmarks.allocation_trace --model selunet --batch 512 --optimizer adamw \
        --source estimate

``--source real`` (the default): a fresh process with TensorFlow's BFC
allocator on the CPU builds the model (``benchmarks/zoo.py``, or
``module:function``) and trains it as ``measure()`` does (one warm-up step
and ``--steps`` more) under the profiler; every allocation and
deallocation of the CPU allocator is printed from before the first weight
is drawn, with the bytes requested, the chunk the allocator gave, the
chunk's address, the bytes in use after it and the op that made it.

``--source estimate``: the same model's graph estimate in this process,
with every allocation and free of its simulated allocators
(``keras_memscope.allocator.BFCModel``), one per simulated order of the
step (``simulation 0`` the nominal order): the weights as the model is
built, the batch, the optimizer's state, then the warm-up step and the
measured one.

Allocations under ``--min-kib`` (and their frees) are left out; 0 prints all.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

MIB = 2**20
#: the bytes of the tensor ``real_events(..., mark_steps=True)`` makes before
#: each measured step (``tf.fill([1999], 7)``, int32)
STEP_MARK_BYTES = 7996

PROFILED_RUN = r"""
import glob, json, sys, tempfile
import tensorflow as tf
from keras_memscope.measure import _xspace_events, run_steps
from benchmarks.accuracy import OPTIMIZERS
from benchmarks.zoo import named
name, batch, optimizer, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
optimizer = OPTIMIZERS.get(optimizer, optimizer)
logdir = tempfile.mkdtemp()
tf.profiler.experimental.start(logdir)
model = named(name)
marks = []
def marked(step):  # a tensor of STEP_MARK_BYTES before each measured step
    marks.append(tf.fill([1999], 7))
    return step()
run_steps(model, batch, optimizer=optimizer, loss=None, steps=steps, device="cpu",
          around_step=marked if sys.argv[5:] == ["mark"] else None)
tf.profiler.experimental.stop()
path = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0]
events = [[kind == "MemoryAllocation", s.get("addr"), s.get("requested_bytes") or 0,
           s.get("allocation_bytes") or 0, str(s.get("tf_op") or "")]
          for kind, s in _xspace_events(path, ("MemoryAllocation", "MemoryDeallocation"))
          if str(s.get("allocator_name", "")).startswith("bfc_cpu")]
print(json.dumps(events))
"""


def real_events(model: str, batch: int, optimizer: str, steps: int,
                mark_steps: bool = False) -> list[tuple]:
    """``(allocated?, address, requested, chunk, op)`` of every event of the
    CPU allocator in a fresh process (a free carries its allocation's
    sizes and op); with ``mark_steps`` a tensor of :data:`STEP_MARK_BYTES`
    is made before each measured step."""
    from benchmarks.allocator_replay import record

    raw = record(PROFILED_RUN, [model, str(batch), optimizer, str(steps),
                                *(["mark"] if mark_steps else [])])
    live: dict[int, tuple[int, int, str]] = {}
    out = []
    for allocated, addr, requested, chunk, op in raw:
        if allocated:
            live[addr] = (requested, chunk, op)
            out.append((True, addr, requested, chunk, op))
        elif addr in live:
            out.append((False, addr, *live.pop(addr)))
    return out


def simulated_events(model: str, batch: int, optimizer: str) -> list[tuple]:
    """The same events from the estimate's simulated allocators, each event
    named by the simulation it belongs to (the step's, and where the
    estimate runs another, such as a recurrent loop's worst case, that one)
    and by the layer and kind of the simulated buffer it is part of (none
    for the weights, batch and optimizer state made before the step)."""
    import keras_memscope as memscope
    from benchmarks.accuracy import named_optimizer
    from benchmarks.zoo import named
    from keras_memscope import allocator, schedule

    built = named(model)
    out: list[tuple] = []
    sizes: dict[tuple[int, int], tuple[int, int]] = {}
    runs: dict[int, int] = {}  # each simulated allocator, numbered as it is first used
    held: list[allocator.BFCModel] = []  # kept, so that no later one takes an id of theirs
    alloc, free = allocator.BFCModel.alloc, allocator.BFCModel.free
    sim_alloc = schedule._Simulator.alloc
    making = [""]  # the simulated buffer being made: its layer and kind

    def traced_alloc(self: allocator.BFCModel, nbytes: int) -> tuple[int, int]:
        handle, chunk = alloc(self, nbytes)
        if id(self) not in runs:
            runs[id(self)] = len(runs)
            held.append(self)
        run = runs[id(self)]
        name = f"simulation {run}" + (f" {making[0]}" if making[0] else "")
        sizes[run, handle] = (nbytes, chunk, name)
        out.append((True, handle, nbytes, chunk, name))
        return handle, chunk

    def traced_free(self: allocator.BFCModel, handle: int) -> None:
        free(self, handle)
        run = runs[id(self)]
        out.append((False, handle, *sizes.pop((run, handle))))

    def named_alloc(self: Any, nbytes: int, layer: str, kind: str, *args: Any,
                    **kwargs: Any) -> int:
        making[0] = f"{layer} ({kind})"
        try:
            return sim_alloc(self, nbytes, layer, kind, *args, **kwargs)
        finally:
            making[0] = ""

    allocator.BFCModel.alloc, allocator.BFCModel.free = traced_alloc, traced_free
    schedule._Simulator.alloc = named_alloc  # type: ignore[method-assign]
    try:
        est = memscope.estimate(built, batch, optimizer=named_optimizer(optimizer), device="cpu",
                                method="graph")
    finally:
        allocator.BFCModel.alloc, allocator.BFCModel.free = alloc, free
        schedule._Simulator.alloc = sim_alloc  # type: ignore[method-assign]
    print(f"estimate: {est.peak_bytes / MIB:.2f} MiB; simulated orders "
          + ", ".join(f"{p / MIB:.1f}" for p in est.history_peaks))
    return out


def main(argv: list[str] | None = None) -> int:
    from benchmarks.accuracy import add_model_arguments

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=1, help="steps after the warm-up (real)")
    parser.add_argument("--source", choices=("real", "estimate"), default="real")
    parser.add_argument("--min-kib", type=float, default=64,
                        help="leave out allocations smaller than this (KiB)")
    options = parser.parse_args(argv)
    try:
        if options.source == "real":
            events = real_events(options.model, options.batch, options.optimizer,
                                 options.steps)
        else:
            events = simulated_events(options.model, options.batch, options.optimizer)
    except (RuntimeError, AttributeError, ImportError, ValueError) as err:
        lines = str(err).strip().splitlines() or [type(err).__name__]
        print(f"allocation_trace: {lines[-1]}", file=sys.stderr)
        return 1
    in_use: dict[str, int] = {}  # by simulation (one for a real run)
    for allocated, addr, requested, chunk, op in events:
        run = " ".join(op.split()[:2]) if options.source == "estimate" else ""
        in_use[run] = in_use.get(run, 0) + (chunk if allocated else -chunk)
        if requested >= options.min_kib * 1024:
            print(f"{'+' if allocated else '-'} {requested / MIB:9.4f} MiB (chunk "
                  f"{chunk / MIB:9.4f}) @{addr:x}  in use {in_use[run] / MIB:9.3f}  {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
