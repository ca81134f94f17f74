"""The graph method against a GPU's allocator: estimate against measured peak.

Each configuration is measured in a fresh process, as
``benchmarks.accuracy`` measures (``measure_subprocess`` with
``device="gpu"``: ``reset_memory_stats("GPU:0")`` before each step,
``get_memory_info("GPU:0")["peak"]`` after it, the highest of ``--steps``
steps after a warm-up step; ``jit_compile=False``, the executor the
estimate follows). The estimates are made in this process for the named device
profile, with the GPUs hidden from its TensorFlow
(``tf.config.set_visible_devices``), so that building the models takes no
GPU memory from the measuring processes.

    python -m benchmarks.gpu_check --device h200 --json gpu.json
    python -m benchmarks.gpu_check --kind cpu --configs mlp:256:sgd   # the code path, no GPU

``--kind cpu`` measures on the CPU instead (a fresh process with the BFC
allocator on, as ``benchmarks.accuracy`` does) and estimates for the CPU:
the same script where no GPU is lent.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

#: model of benchmarks.zoo, batch, optimizer: small enough for a short
#: device lease, and one of each kind the zoo has (MLP, CNN, residual CNN,
#: attention, depthwise convolutions, recurrent)
CONFIGS = [
    ("mlp", 1024, "adam"),
    ("cnn", 128, "adam"),
    ("resnet50", 32, "adam"),
    ("transformer", 16, "adam"),
    ("mobilenetv2", 32, "sgd"),
    ("lstm", 32, "adam"),
]


def _parse_config(text: str) -> tuple[str, int, str]:
    name, batch, opt = text.split(":")
    return name, int(batch), opt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="h200",
                        help="the device profile the estimate is for (default h200)")
    parser.add_argument("--kind", choices=("gpu", "cpu"), default="gpu",
                        help="where to measure (default gpu)")
    parser.add_argument("--configs", nargs="*", type=_parse_config,
                        help="model:batch:optimizer (default: the six of CONFIGS)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    configs = args.configs or CONFIGS
    device = args.device if args.kind == "gpu" else "cpu"
    import keras
    import tensorflow as tf

    import keras_memscope as memscope
    from keras_memscope.measure import measure_subprocess

    from . import zoo
    from .accuracy import OPTIMIZERS, named_optimizer

    if tf.config.list_physical_devices("GPU"):
        tf.config.set_visible_devices([], "GPU")  # this process estimates only
    rows = []
    for name, batch, opt in configs:
        keras.utils.clear_session()
        t0 = time.time()
        est = memscope.estimate(getattr(zoo, name)(), batch,
                                optimizer=named_optimizer(opt), device=device)
        seconds = time.time() - t0
        measured = measure_subprocess({"builder": f"benchmarks.zoo:{name}",
                                       "batch_size": batch,
                                       "optimizer": OPTIMIZERS.get(opt, opt),
                                       "steps": args.steps, "device": args.kind})
        peak = max(measured["step_peak_bytes"])
        rows.append({"model": name, "batch": batch, "optimizer": opt,
                     "device": device, "kind": args.kind,
                     "estimate": est.peak_bytes, "history_peaks": list(est.history_peaks),
                     "held_estimate": est.held_bytes,
                     "measured_steps": measured["step_peak_bytes"],
                     "measured_held": measured["persistent_bytes"],
                     "error": est.peak_bytes / peak - 1, "estimate_seconds": seconds})
        print(f"{name} b{batch} {opt}: estimate {est.peak_bytes / 2**20:.1f} MiB, measured "
              f"{min(measured['step_peak_bytes']) / 2**20:.1f}-{peak / 2**20:.1f} MiB, "
              f"{rows[-1]['error']:+.1%}; held {est.held_bytes / 2**20:.1f} against "
              f"{measured['persistent_bytes'] / 2**20:.1f} MiB", flush=True)
    errors = [abs(r["error"]) for r in rows]
    print(f"{len(rows)} configurations on {args.kind} ({device}): median |error| "
          f"{statistics.median(errors):.1%}, worst {max(errors):.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(main())
