"""Seconds per estimate of ResNet-50 (Adam, CPU), graph method and rules.

The first graph estimate traces every distinct layer call; a second at the
same batch size reuses those traces; a new batch size traces again.

    python -m benchmarks.estimate_speed

``--workflows`` times what the command line's ``fit`` (ResNet-50 b16 on the
CPU profile with 1 GiB, remedies suggested) and ``max-batch`` (3 GiB) do,
each on a fresh model, alternately with the executor's order kept per batch
(as before it was kept whatever the batch) and as it is kept now, ``--runs``
times each:

    python -m benchmarks.estimate_speed --workflows --runs 2
"""

from __future__ import annotations

import argparse
import os
import time
import weakref

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _workflows(runs: int) -> None:
    import keras

    from keras_memscope import executor, planning

    as_now = executor.weight_gradient_first
    per_batch_orders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def per_batch(model, batch_size, optimizer, *, input_shape=None):
        # the order kept by model, batch and key, as it was
        kept = per_batch_orders.setdefault(model, {})
        key = (batch_size, executor._cache_key(model, optimizer, input_shape))
        if key not in kept:
            executor._ORDERS.pop(model, None)
            kept[key] = as_now(model, batch_size, optimizer, input_shape=input_shape)
        return kept[key]

    jobs = {"fit b16, 1 GiB, remedies": lambda m: planning.fits(
                m, 16, device="cpu", memory_bytes=1 << 30, optimizer="adam"),
            "max-batch, 3 GiB": lambda m: planning.max_batch_size(
                m, device="cpu", memory_bytes=3 << 30, optimizer="adam")}
    print("| workflow | order kept | seconds | orders read |\n|---|---|---|---|")
    for _ in range(runs):
        for label, job in jobs.items():
            for kept, key in (("per batch", per_batch), ("whatever the batch", as_now)):
                keras.utils.clear_session()
                model = keras.applications.ResNet50(weights=None)
                executor.weight_gradient_first, read = key, []
                per_batch_orders.clear()
                real = executor._weight_gradient_first
                executor._weight_gradient_first = (
                    lambda *a, read=read, real=real: read.append(1) or real(*a))
                try:
                    t = time.perf_counter()
                    job(model)
                    took = time.perf_counter() - t
                finally:
                    executor.weight_gradient_first = as_now
                    executor._weight_gradient_first = real
                print(f"| {label} | {kept} | {took:.1f} | {len(read)} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", action="store_true",
                        help="time fit and max-batch, the order kept per batch and not")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    if args.workflows:
        _workflows(args.runs)
        return

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
