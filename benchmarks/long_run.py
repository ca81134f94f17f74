"""Each step's peak over a longer run than the accuracy benchmarks' six steps.

The CPU allocator's chunks carry over from step to step, and how much they
leave unused between the step's tensors can change with every step. This
trains a zoo model for ``--steps`` steps in a fresh process (BFC allocator)
and prints each step's peak, and the estimate beside them:

    python -m benchmarks.long_run --model mobilenetv2 --batch 8 --steps 25
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenetv2", help="a benchmarks.zoo model")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--steps", type=int, default=25)
    args = parser.parse_args(argv)

    import keras_memscope as memscope
    from keras_memscope.measure import measure_subprocess

    from . import zoo

    spec = {"builder": f"benchmarks.zoo:{args.model}", "batch_size": args.batch,
            "optimizer": args.optimizer, "steps": args.steps, "device": "cpu",
            "loss": "sparse_categorical_crossentropy"}
    peaks = [n / 2**20 for n in measure_subprocess(spec)["step_peak_bytes"]]
    est = memscope.estimate(getattr(zoo, args.model)(), args.batch, optimizer=args.optimizer,
                            device="cpu", method="graph")
    print(f"{args.model} b{args.batch} {args.optimizer}, {args.steps} steps, MiB: "
          + ", ".join(f"{p:.1f}" for p in peaks))
    first = peaks[:6]
    print(f"highest of the first 6 steps {max(first):.1f}, of all {max(peaks):.1f} "
          f"(step {peaks.index(max(peaks)) + 1}); estimate {est.peak_bytes / 2**20:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
