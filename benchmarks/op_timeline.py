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


def main(argv: list[str] | None = None) -> int:
    from .accuracy import add_model_arguments, named_optimizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ops", required=True, help="regular expression over name:type")
    args = parser.parse_args(argv)
    try:
        wanted = re.compile(args.ops)
    except re.error as exc:
        parser.error(f"--ops is not a regular expression: {exc}")

    from keras_memscope.measure import _op_events, _profiled, run_steps

    from . import zoo

    model = zoo.named(args.model)
    steps: list[list[tuple[int, int, str, str]]] = []
    run_steps(model, args.batch, optimizer=named_optimizer(args.optimizer),
              loss=getattr(model, "loss", None), steps=args.steps, device="cpu",
              around_step=lambda step: steps.append(_profiled(step, _op_events)),
              read_memory=False)
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
