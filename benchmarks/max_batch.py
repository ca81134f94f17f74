"""Predicted against verified largest batch under CPU memory limits.

For each model and limit: the batch ``max_batch_size`` predicts from the
estimate, the batch real training steps confirm (fresh processes, the CPU
allocator limited with ``TF_CPU_BFC_MEM_LIMIT_IN_MB``), the trial steps that
took, and the trials a search without a prediction (double from 2, then
bisect) needs to find the same batch.

    python -m benchmarks.max_batch
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import keras_memscope as memscope  # noqa: E402
from benchmarks import zoo  # noqa: E402

MiB = 1 << 20

CASES = [
    ("cnn", "adam", (128 * MiB, 256 * MiB)),
    ("mobilenetv2_96", "sgd", (512 * MiB, 1024 * MiB)),
    ("transformer", "adam", (512 * MiB,)),
]


def mobilenetv2_96() -> keras.Model:
    return keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3))


def main() -> int:
    print("| model | optimizer | limit | predicted | verified | trial steps | "
          "search without prediction | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for name, opt, limits in CASES:
        for limit in limits:
            keras.utils.clear_session()
            model = mobilenetv2_96() if name == "mobilenetv2_96" else getattr(zoo, name)()
            t0 = time.time()
            r = memscope.max_batch_size(model, device="cpu", memory_bytes=limit,
                                        safety_margin=0, optimizer=opt, verify=True)
            trials = ", ".join(f"{b}:{'ok' if res == 'fits' else 'OOM'}" for b, res in r.trials)
            print(f"| {name} | {opt} | {limit // MiB} MiB | {r.predicted} | {r.verified} | "
                  f"{len(r.trials)} ({trials}) | {r.halving_trials} | {time.time() - t0:.0f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
