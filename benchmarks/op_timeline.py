"""When chosen ops of a training step start and end, step by step.

Which of two gradient streams ends first decides what a CPU step holds at
its peak (``benchmarks/RESULTS.md``: skipnet's spread between steps). This
trains a zoo model (or ``module:function``) with its own loss where it is
compiled with one, profiles each of ``--steps`` steps after one warm-up
step under ``tf.profiler``, and prints the ops whose name matches
``--ops`` (a regular expression over ``name:type``): start and end in ms
from the step's first op, duration, and the executor thread that ran it.

    python -m benchmarks.op_timeline --model skipnet --batch 16 --optimizer rmsprop \\
        --ops 'conv2d_2_1/convolution|stateless_dropout/(SelectV2|Mul):|concatenate_1/Slice:'
"""

from __future__ import annotations

import argparse
import os
import re
import sys


def op_events(path: str) -> list[tuple[int, int, str, str]]:
    """(start ps, end ps, thread, ``name:type``) of every TensorFlow op in a
    profiler XSpace file, in time order."""
    from keras_memscope.measure import _load_xspace

    found = []
    for plane in _load_xspace(path).planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_Compute") and "Executor" not in line.name:
                continue
            for ev in line.events:
                name = names.get(ev.metadata_id, "")
                if name.count(":") != 1:  # an op is "name:type"
                    continue
                start = line.timestamp_ns * 1000 + ev.offset_ps
                found.append((start, start + ev.duration_ps, line.name, name))
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True,
                        help="a function of benchmarks.zoo, or module:function")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--optimizer", default="adam",
                        help="a Keras optimizer's name, or one with options named in "
                             "benchmarks.accuracy.OPTIMIZERS")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ops", required=True, help="regular expression over name:type")
    args = parser.parse_args(argv)
    try:
        wanted = re.compile(args.ops)
    except re.error as exc:
        parser.error(f"--ops is not a regular expression: {exc}")

    from keras_memscope.measure import _profiled, run_steps

    from . import zoo
    from .accuracy import named_optimizer

    model = zoo.named(args.model)
    steps: list[list[tuple[int, int, str, str]]] = []
    run_steps(model, args.batch, optimizer=named_optimizer(args.optimizer),
              loss=getattr(model, "loss", None), steps=args.steps, device="cpu",
              around_step=lambda step: steps.append(_profiled(step, op_events)))
    for k, events in enumerate(steps, 1):
        print(f"step {k}: ms from the step's first op (start, end, duration), thread, op")
        base = events[0][0] if events else 0
        for start, end, thread, name in events:
            if wanted.search(name):
                print(f"  {(start - base) / 1e9:8.3f} {(end - base) / 1e9:8.3f} "
                      f"{(end - start) / 1e9:7.3f}  {thread[-6:]}  {name}")
    return 0


if __name__ == "__main__":
    # a measuring process's allocator (here, not in main(): a process that
    # calls main() keeps its own setting, and measure() runs in a process
    # with the BFC allocator on instead of starting a fresh one)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    sys.exit(main())
