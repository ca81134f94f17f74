"""How much a step's peak, and a predicted saving, move with the order of a
CPU's two gradient streams.

On the CPU, TensorFlow's executor runs input and weight gradients on two
threads, and which ops run beside which follows the ops' durations, which
vary from step to step. Their allocator then sees the same requests in
slightly different orders and rounds them into different chunks. A CPU
estimate simulates the nominal order and ``DeviceProfile.order_histories``
others, every prim's forward and two gradient times scaled by independent
log-normal factors (``op_time_sigma``: one op's step-to-step spread, measured
by ``benchmarks/op_time_spread.py``), and reports the highest peak. This prints
each history's peak for ResNet-50 at batch 16 under Adam and after a change
(SGD instead, or another ``--remedy``; another zoo model with ``--model``),
and each history's saving.

    python -m benchmarks.history_spread [--seeds 10] [--sigma 0.33]
    python -m benchmarks.history_spread --remedy mixed_bfloat16
    python -m benchmarks.history_spread --model transformer --remedy activations
    python -m benchmarks.history_spread --model unet --batch 8 --remedy none

Measured for comparison (``python -m benchmarks.remedies --processes 12``,
the highest of twelve processes): Adam 1911 MiB (the lowest 1734), SGD 1613
MiB, saving 298 MiB (121-383 between processes); mixed_bfloat16 1524 MiB,
saving 387 MiB (209-442); the U-Net at batch 8
under Adam (``python -m benchmarks.accuracy --held-out``): 190.6-201.4 MiB.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import keras_memscope as memscope
from keras_memscope import devices

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
    parser.add_argument("--seeds", type=int, default=10,
                        help="orders simulated beside the nominal one")
    parser.add_argument("--sigma", type=float, default=0.33)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--model", default="resnet50", help="a benchmarks.zoo model")
    parser.add_argument("--remedy", choices=sorted(REMEDIES), default="sgd",
                        help="the change whose saving is re-simulated (none: the Adam "
                             "step's peaks alone)")
    args = parser.parse_args(argv)

    profile = dataclasses.replace(devices.get_device("cpu"), op_time_sigma=args.sigma,
                                  order_histories=args.seeds)
    model = getattr(zoo, args.model)()
    change = REMEDIES[args.remedy]
    est = memscope.estimate(model, args.batch, optimizer="adam", device=profile)
    adam = [p / 2**20 for p in est.history_peaks]
    print(f"{args.model}, batch {args.batch} (sigma {args.sigma})")
    if change is None:
        print(f"Adam: nominal {adam[0]:.1f} MiB; other orders "
              + ", ".join(f"{p:.1f}" for p in adam[1:])
              + f"; range {min(adam):.1f}-{max(adam):.1f} MiB")
        return 0
    after_est = memscope.whatif(model, args.batch, device=profile,
                                **{"optimizer": "adam", **change})
    after = [p / 2**20 for p in after_est.history_peaks]
    print(f"| history | Adam MiB | {args.remedy} MiB | saving MiB |")
    print("|---|---|---|---|")
    for i, (a, b) in enumerate(zip(adam, after)):
        print(f"| {'nominal' if i == 0 else i} | {a:.0f} | {b:.0f} | {a - b:.0f} |")
    savings = [a - b for a, b in zip(adam[1:], after[1:])]
    print(f"\nother orders: saving median {statistics.median(savings):.0f} MiB, "
          f"range {min(savings):.0f}-{max(savings):.0f}; Adam median "
          f"{statistics.median(adam[1:]):.0f}, {args.remedy} median "
          f"{statistics.median(after[1:]):.0f}")
    print(f"the estimates (highest of each): Adam {max(adam):.0f} MiB, {args.remedy} "
          f"{max(after):.0f} MiB, saving {max(adam) - max(after):.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
