"""The tensors alive at a real training step's peak, by the op that made them.

    python -m benchmarks.peak_tensors --model vae --batch 256 --optimizer adam

A fresh process (BFC allocator on the CPU, as ``measure()`` runs them) trains
the zoo model; each step after the warm-up is profiled on its own, and the
allocations of that step still alive when the allocator's count of bytes in
use was highest are listed (64 KiB and more; each with the bytes it
requested and the chunk the allocator gave it), with the count and the bytes
those allocations requested and took in chunks.
"""

from __future__ import annotations

import argparse
import sys

MIB = 2**20

PROFILED_STEPS = r"""
import json, sys
from keras_memscope.measure import _profiled, _xspace_events, run_steps
from benchmarks import zoo
name, batch, optimizer, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
model = getattr(zoo, name)()
found = []
def events(path):
    return [[kind == "MemoryAllocation", s.get("addr"), s.get("requested_bytes") or 0,
             s.get("bytes_allocated") or 0, str(s.get("tf_op") or ""),
             s.get("allocation_bytes") or 0]
            for kind, s in _xspace_events(path, ("MemoryAllocation", "MemoryDeallocation"))
            if str(s.get("allocator_name", "")).startswith("bfc_cpu")]
run_steps(model, batch, optimizer=optimizer, loss=None, steps=steps, device="cpu",
          around_step=lambda step: found.append(_profiled(step, events)))
print(json.dumps(found))
"""


def at_peak(events: list[list]) -> tuple[int, str, list[tuple[int, int, str]]]:
    """One step's events (``[allocated?, address, requested, in use after,
    op, chunk]``): the bytes in use at the peak, the op of the peak's event,
    and the step's allocations alive there (requested bytes, chunk bytes, op)
    in the order made."""
    live: dict[int, tuple[int, int, str, int]] = {}
    best: tuple[int, str, dict] = (-1, "", {})
    for i, (allocated, addr, requested, in_use, op, chunk) in enumerate(events):
        if allocated:
            live[addr] = (requested, chunk, op, i)
        else:
            live.pop(addr, None)
        if in_use > best[0]:
            best = (in_use, op, dict(live))
    in_use, op, alive = best
    return in_use, op, [(r, c, o) for r, c, o, _ in sorted(alive.values(), key=lambda v: v[3])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a function of benchmarks.zoo")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--steps", type=int, default=2, help="profiled steps")
    options = parser.parse_args(argv)
    from benchmarks.allocator_replay import record

    try:
        steps = record(PROFILED_STEPS, [options.model, str(options.batch), options.optimizer,
                                        str(options.steps)])
    except RuntimeError as err:  # the process's stderr
        print(err, file=sys.stderr)
        return 1
    for n, events in enumerate(steps):
        in_use, op, alive = at_peak(events)
        print(f"step {n}: {in_use / MIB:.2f} MiB in use at the peak ({op}); "
              f"{sum(r for r, _, _ in alive) / MIB:.2f} MiB requested in the step alive "
              f"there, in {sum(c for _, c, _ in alive) / MIB:.2f} MiB of chunks")
        for requested, chunk, made_by in alive:
            if requested >= 64 * 1024:
                print(f"  {requested / MIB:8.3f} MiB  (chunk {chunk / MIB:8.3f})  {made_by}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
