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
from typing import Any


def profiled_steps(model: Any, batch: int, optimizer: str, steps: int
                   ) -> list[list[tuple[int, int, str, str]]]:
    """Each of ``steps`` training steps of ``model`` after one warm-up step,
    profiled: its ops' ``(start ns, end ns, thread, name:type)``."""
    from keras_memscope.measure import _op_events, _profiled, run_steps

    from .accuracy import named_optimizer

    events: list[list[tuple[int, int, str, str]]] = []
    run_steps(model, batch, optimizer=named_optimizer(optimizer),
              loss=getattr(model, "loss", None), steps=steps, device="cpu",
              around_step=lambda step: events.append(_profiled(step, _op_events)),
              read_memory=False)
    return events


def main(argv: list[str] | None = None) -> int:
    from .accuracy import add_model_arguments

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ops", required=True, help="regular expression over name:type")
    args = parser.parse_args(argv)
    try:
        wanted = re.compile(args.ops)
    except re.error as exc:
        parser.error(f"--ops is not a regular expression: {exc}")

    from . import zoo

    steps = profiled_steps(zoo.named(args.model), args.batch, args.optimizer, args.steps)
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
