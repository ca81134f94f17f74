"""Seconds per estimate of ResNet-50 (Adam, CPU), graph method and rules.

The first graph estimate traces every distinct layer call; a second at the
same batch size reuses those traces; a new batch size traces again.

    python -m benchmarks.estimate_speed
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    import keras

    import keras_memscope as memscope

    model = keras.applications.ResNet50(weights=None)
    print("| estimate | seconds | peak MiB |\n|---|---|---|")
    for label, batch, method in (("graph, first (traces)", 16, "graph"),
                                 ("graph, same batch again (cached)", 16, "graph"),
                                 ("graph, batch 32 (traces again)", 32, "graph"),
                                 ("rules", 16, "rules")):
        t = time.perf_counter()
        est = memscope.estimate(model, batch, optimizer="adam", device="cpu", method=method)
        print(f"| {label} | {time.perf_counter() - t:.1f} | {est.peak_bytes / 2**20:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
