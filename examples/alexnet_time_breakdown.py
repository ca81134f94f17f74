"""Which layers take AlexNet's training time: convolutions or fully connected?

The fully connected layers hold most of AlexNet's parameters; the question is
whether they also take most of the time. This prints, for a training step at
batch 16, the share of parameters, FLOPs and time of each layer family:
estimated for an A100 (datasheet speeds), estimated for this CPU (calibrated
with a micro-benchmark) and measured on this CPU (TensorFlow's profiler, op
times summed per layer family).

    python examples/alexnet_time_breakdown.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tabulate import tabulate  # noqa: E402

import keras_memscope as memscope  # noqa: E402
from benchmarks.zoo import alexnet  # noqa: E402
from keras_memscope.measure import profile_step  # noqa: E402
from keras_memscope.report import category_breakdown  # noqa: E402

BATCH = 16


def main() -> None:
    model = alexnet()
    gpu = memscope.estimate(model, BATCH, optimizer="sgd", device="a100-40gb")
    cpu_profile = memscope.calibrate("cpu")
    cpu = memscope.estimate(model, BATCH, optimizer="sgd", device=cpu_profile)
    measured = profile_step(model, BATCH, optimizer="sgd", steps=3)
    total = measured["ops_s"]
    gpu_rows = {r["category"]: r for r in category_breakdown(gpu)}
    cpu_rows = {r["category"]: r for r in category_breakdown(cpu)}
    rows = []
    for cat in ("conv", "dense", "pool", "other", "optimizer"):
        g, c = gpu_rows.get(cat), cpu_rows.get(cat)
        if g is None and cat not in measured["by_category"]:
            continue
        rows.append([
            cat,
            f"{(g or {}).get('param_share', 0):.1%}",
            f"{(g or {}).get('flop_share', 0):.1%}",
            f"{(g or {}).get('time_share') or 0:.1%}",
            f"{(c or {}).get('time_share') or 0:.1%}",
            f"{measured['by_category'].get(cat, 0.0) / total:.1%}",
        ])
    print(f"AlexNet, batch {BATCH}, SGD: {gpu.params:,} parameters, "
          f"{(gpu.forward_flops + gpu.backward_flops) / 1e9:.0f} GFLOPs per training step\n")
    print(tabulate(rows, headers=["family", "% params", "% FLOPs", "% time A100 (est.)",
                                  "% time this CPU (est.)", "% time this CPU (measured)"],
                   tablefmt="github", disable_numparse=True))
    print(f"\nstep time: A100 estimated {gpu.step_time_s * 1e3:.1f} ms; this CPU estimated "
          f"{cpu.step_time_s:.2f} s, measured {measured['step_s']:.2f} s")


if __name__ == "__main__":
    main()
