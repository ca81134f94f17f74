"""How much a predicted saving moves with the simulated step's allocation history.

The graph method simulates one allocation history: the CPU's two gradient
streams (input and weight gradients) interleave as the nominal op times say.
Real processes differ in those times, so their allocators see the same
requests in slightly different orders and round them into different chunks.
This re-simulates ResNet-50 at batch 16 (Adam, and SGD instead, or another
``--remedy``; another zoo model with ``--model``) with every
prim's two gradient times scaled by independent log-normal factors (sigma
given; the default is one op's step-to-step spread measured by
``benchmarks/op_time_spread.py``), once per seed, and prints each history's
peaks and the saving.

    python -m benchmarks.history_spread [--seeds 10] [--sigma 0.33]
    python -m benchmarks.history_spread --remedy mixed_bfloat16
    python -m benchmarks.history_spread --model transformer --remedy activations
    python -m benchmarks.history_spread --model unet --batch 8 --remedy none

Measured for comparison (``python -m benchmarks.remedies``): Adam 1850 MiB,
SGD 1578 MiB, saving 271 MiB (206-307 between processes); mixed_bfloat16 1517
MiB, saving 333 MiB (268-355); the U-Net at batch 8
under Adam (``python -m benchmarks.accuracy --held-out``): 190.6-201.4 MiB.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

import keras_memscope as memscope
from keras_memscope import estimator

from . import zoo

#: the change each ``--remedy`` makes to the Adam step (``memscope.whatif``)
REMEDIES = {
    "sgd": {"optimizer": "sgd"},
    "mixed_bfloat16": {"dtype_policy": "mixed_bfloat16"},
    "activations": {"remat": "activations"},
    "none": None,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--sigma", type=float, default=0.33)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--model", default="resnet50", help="a benchmarks.zoo model")
    parser.add_argument("--remedy", choices=sorted(REMEDIES), default="sgd",
                        help="the change whose saving is re-simulated (none: the Adam "
                             "step's peaks alone)")
    args = parser.parse_args(argv)

    nominal = estimator._backward_time
    seed: list[int | None] = [None]

    def scaled(profile, dtypes):  # the estimator's hook, times scaled per prim
        times = nominal(profile, dtypes)
        if seed[0] is None:
            return times
        rng, factors = random.Random(seed[0]), {}

        def f(cost):
            if id(cost) not in factors:
                factors[id(cost)] = (rng.lognormvariate(0, args.sigma),
                                     rng.lognormvariate(0, args.sigma))
            a, b = times(cost)
            return a * factors[id(cost)][0], b * factors[id(cost)][1]
        return f

    estimator._backward_time = scaled
    model = getattr(zoo, args.model)()
    histories: list[int | None] = [None, *range(1, args.seeds + 1)]
    change = REMEDIES[args.remedy]
    adam, after = [], []
    for s in histories:
        seed[0] = s
        adam.append(memscope.estimate(model, args.batch, optimizer="adam",
                                      device="cpu").peak_bytes / 2**20)
        if change is not None:
            est = memscope.whatif(model, args.batch, device="cpu",
                                  **{"optimizer": "adam", **change})
            after.append(est.peak_bytes / 2**20)
    print(f"{args.model}, batch {args.batch} (sigma {args.sigma})")
    if change is None:
        print(f"Adam: nominal {adam[0]:.1f} MiB; scaled histories "
              + ", ".join(f"{p:.1f}" for p in adam[1:])
              + f"; range {min(adam):.1f}-{max(adam):.1f} MiB")
        return 0
    print(f"| history | Adam MiB | {args.remedy} MiB | saving MiB |")
    print("|---|---|---|---|")
    for i, s in enumerate(histories):
        a, b = adam[i], after[i]
        print(f"| {'nominal' if s is None else s} | {a:.0f} | {b:.0f} | {a - b:.0f} |")
    savings = [a - b for a, b in zip(adam[1:], after[1:])]
    print(f"\nscaled histories: saving median {statistics.median(savings):.0f} MiB, "
          f"range {min(savings):.0f}-{max(savings):.0f}; Adam median "
          f"{statistics.median(adam[1:]):.0f}, {args.remedy} median "
          f"{statistics.median(after[1:]):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
