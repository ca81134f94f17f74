"""Estimated against measured share of training time by layer family.

Calibrates this CPU (``memscope.calibrate``), estimates each model's training
step, then times real steps with TensorFlow's profiler, summing op times per
layer family through the ops' name scopes. Prints, per model, each family's
share of time estimated and measured, the difference in percentage points,
and the step time.

    python -m benchmarks.time_breakdown
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import keras_memscope as memscope  # noqa: E402
from benchmarks import zoo  # noqa: E402
from keras_memscope.measure import profile_step  # noqa: E402
from keras_memscope.report import category_breakdown  # noqa: E402

CASES = [("alexnet_small", 16), ("vgg16", 4), ("resnet50", 8), ("transformer", 8)]


def main() -> int:
    profile = memscope.calibrate("cpu")
    print(profile.source.split(";")[0])
    worst_pp, worst_step = 0.0, 0.0
    for name, batch in CASES:
        keras.utils.clear_session()
        model = getattr(zoo, name)()
        est = memscope.estimate(model, batch, optimizer="adam", device=profile)
        shares = {row["category"]: row["time_share"] for row in category_breakdown(est)}
        measured = profile_step(model, batch, optimizer="adam", steps=3)
        total = measured["ops_s"]
        print(f"\n{name}, batch {batch}, Adam: step estimated {est.step_time_s:.2f} s, "
              f"measured {measured['step_s']:.2f} s "
              f"({est.step_time_s / measured['step_s'] - 1:+.0%})")
        print("| family | estimated | measured | difference (pp) |")
        print("|---|---|---|---|")
        cats = sorted(set(shares) | set(measured["by_category"]),
                      key=lambda c: -measured["by_category"].get(c, 0))
        for cat in cats:
            e = shares.get(cat, 0.0)
            m = measured["by_category"].get(cat, 0.0) / total
            worst_pp = max(worst_pp, abs(e - m) * 100)
            print(f"| {cat} | {e:.1%} | {m:.1%} | {(e - m) * 100:+.1f} |")
        worst_step = max(worst_step, abs(est.step_time_s / measured["step_s"] - 1))
    print(f"\nworst share difference {worst_pp:.1f} pp; worst step-time error {worst_step:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
