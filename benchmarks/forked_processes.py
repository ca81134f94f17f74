"""Measuring in forked processes against started ones, side by side.

The tests measure in processes forked from one that has imported TensorFlow
(``tests/forked.py``). This takes zoo configurations and measures each in
started processes (``subprocess.run``, as ``measure()`` does) and forked ones,
alternately, and prints each kind's step peaks and seconds per process: the
peaks should lie in the same range, the forked processes take less time.

    python -m benchmarks.forked_processes [--processes 3] [--only mlp cnn]
"""

from __future__ import annotations

import argparse
import os
import time

from tabulate import tabulate

CONFIGS = [("mlp", 256, "adam"), ("cnn", 128, "adam"), ("lstm", 32, "adam"),
           ("transformer", 8, "adam"), ("resnet50", 8, "adam")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--only", nargs="*", help="model names to run")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import importlib

    from benchmarks.accuracy import OWN_LOSS
    from tests import forked

    measure = importlib.import_module("keras_memscope.measure")
    runners = {"started": measure._run_process, "forked": forked.run}

    rows = []
    for model, batch, opt in CONFIGS:
        if args.only and model not in args.only:
            continue
        got = {kind: ([], []) for kind in runners}
        for _ in range(args.processes):
            for kind, runner in runners.items():
                measure._run_process = runner
                t0 = time.time()
                raw = measure.measure_subprocess({
                    "builder": f"benchmarks.zoo:{model}", "batch_size": batch,
                    "optimizer": opt, "steps": 6, "device": "cpu",
                    "loss": None if model in OWN_LOSS else "sparse_categorical_crossentropy"})
                got[kind][0].append(max(raw["step_peak_bytes"]) / 2**20)
                got[kind][1].append(time.time() - t0)
        row = [f"{model} b{batch} {opt}"]
        for kind in runners:
            peaks, seconds = got[kind]
            row += [f"{min(peaks):.1f} - {max(peaks):.1f}", f"{sum(seconds) / len(seconds):.1f}"]
        rows.append(row)
        print(tabulate([row], tablefmt="plain"), flush=True)
    measure._run_process = runners["started"]
    forked.close_all()
    print(tabulate(rows, headers=["configuration", "started MiB", "s each", "forked MiB",
                                  "s each"], tablefmt="github"))


if __name__ == "__main__":
    main()
