"""Replay a real process's allocations through the allocator model.

    python -m benchmarks.allocator_replay --model resnet50 --batch 16 \
        --policy mixed_bfloat16 --steps 3

In a fresh process with TensorFlow's BFC allocator on the CPU, the profiler
records every allocation and deallocation from before the model is built to
the end of the last training step (the allocator's own count of the bytes
in use after each). The same sequence, replayed through
``keras_memscope.allocator.BFCModel``, gives the bytes in use the model
counts; the script prints both peaks over the whole run and how far the
two counts agree event by event. The events are put in the allocator's own
order first (``in_allocator_order``): the profiler orders them by
timestamps taken outside the allocator's lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROFILED_RUN = r"""
import glob, json, sys, tempfile
import keras, tensorflow as tf
from keras_memscope.measure import _xspace_events, synthetic_tensor
name, batch, policy, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
logdir = tempfile.mkdtemp()
tf.profiler.experimental.start(logdir)
if policy:
    keras.config.set_dtype_policy(policy)
from benchmarks import zoo
model = getattr(zoo, name)()
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
shape = (batch,) + tuple(model.inputs[0].shape[1:])
dtype = model.inputs[0].dtype
x = synthetic_tensor(shape, str(dtype))
y = synthetic_tensor((batch,), "int32")
for _ in range(steps):
    model.train_on_batch(x, y)
tf.profiler.experimental.stop()
path = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0]
events = []
for kind, s in _xspace_events(path, ("MemoryAllocation", "MemoryDeallocation")):
    if str(s.get("allocator_name", "")).startswith("bfc_cpu"):
        events.append([kind == "MemoryAllocation", s.get("addr"),
                       s.get("requested_bytes") or 0, s.get("bytes_allocated") or 0,
                       s.get("allocation_bytes") or 0])
print(json.dumps(events))
"""

#: how far ahead ``in_allocator_order`` looks for the event the count says came first
LOOK_AHEAD = 4


def record(code: str, args: list[str], timeout: float = 900) -> list[list]:
    """What ``code``, run in a fresh process with the CPU's BFC allocator,
    prints last, as JSON: for ``PROFILED_RUN``, ``[allocated?, address,
    requested bytes, bytes in use after, chunk bytes]`` of every event of
    that allocator."""
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="3")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def in_allocator_order(events: list[list]) -> tuple[list[list], int]:
    """``PROFILED_RUN``'s events in the order the allocator made them, and
    how many were moved to get there.

    The profiler orders events by their timestamps, taken on each thread
    outside the allocator's lock, so two threads' events close in time can
    come out the other way round. Each event carries the allocator's count
    after it and its chunk: where an event's count is not the count before
    it plus or minus its chunk, and one of the next few events' is, that
    one came first."""
    ordered, pending, moved = [], list(events), 0
    count = None
    while pending:
        fits = [j for j, e in enumerate(pending[:LOOK_AHEAD])
                if count is None or e[3] == count + (e[4] if e[0] else -e[4])]
        j = fits[0] if fits else 0
        moved += j > 0
        event = pending.pop(j)
        ordered.append(event)
        count = event[3]
    return ordered, moved


def replay(events: list[list]) -> list[int]:
    """The bytes in use after each event, as ``BFCModel`` counts them."""
    from keras_memscope.allocator import BFCModel

    model, handles, in_use = BFCModel(), {}, []
    for allocated, addr, requested, *_ in events:
        if allocated:
            handles[addr] = model.alloc(requested)[0]
        elif addr in handles:
            model.free(handles.pop(addr))
        in_use.append(model.in_use)
    return in_use


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a model of benchmarks/zoo.py")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--policy", default="", help="a dtype policy, e.g. mixed_bfloat16")
    parser.add_argument("--steps", type=int, default=3)
    options = parser.parse_args(argv)
    events, moved = in_allocator_order(record(PROFILED_RUN, [
        options.model, str(options.batch), options.policy, str(options.steps)]))
    replayed = replay(events)
    mib = 2**20
    real = max(e[3] for e in events)
    differ = [i for i, (e, r) in enumerate(zip(events, replayed)) if e[3] != r]
    worst = max((abs(events[i][3] - replayed[i]) for i in differ), default=0)
    print(f"{options.model} b{options.batch} {options.policy or 'float32'}, "
          f"{options.steps} steps, {len(events)} allocator events: in-use peak "
          f"{real / mib:.1f} MiB (TensorFlow), {max(replayed) / mib:.1f} MiB (BFCModel); "
          f"the counts agree up to event {differ[0] if differ else len(events)}, "
          f"differ at {len(differ)} events after it, by at most {worst / mib:.1f} MiB "
          f"({moved} events put back in the allocator's order)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
