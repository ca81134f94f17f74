"""Quantized and low-rank training, measured beside its estimate.

One small token model as built, with LoRA on its Dense layers, and
quantized by Keras for int8, int4 and float8 training.

    python -m benchmarks.quantized [--processes 4] [--steps 5]

The model: an Embedding of 1000 x 256 over 128 tokens, Dense 1024 with a
ReLU, Dense 256, mean pooling, Dense 10, trained at batch 32 under Adam.
Each variant is measured in ``--processes`` fresh processes
(``memscope.measure``) and estimated; the table gives the per-process
peaks, the range of their steps, the estimate and its error against the
highest process. Each variant is a function here, for ``python -m
benchmarks.allocation_trace --model benchmarks.quantized:float8``.
"""

from __future__ import annotations

import argparse
import os
import warnings
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MIB = 2**20


def as_built() -> Any:
    import keras
    from keras import layers

    tokens = keras.Input((128,), dtype="int32")
    x = layers.Dense(1024, activation="relu")(layers.Embedding(1000, 256)(tokens))
    x = layers.GlobalAveragePooling1D()(layers.Dense(256)(x))
    return keras.Model(tokens, layers.Dense(10)(x), name="tokenmlp")


def lora() -> Any:
    import keras

    model = as_built()
    for layer in model.layers:
        if isinstance(layer, keras.layers.Dense):
            layer.enable_lora(4)
    return model


def _quantized(mode: str) -> Any:
    model = as_built()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the layers without weights have no quantize)
        model.quantize(mode)
    return model


def int8() -> Any:
    return _quantized("int8")


def int4() -> Any:
    return _quantized("int4")


def float8() -> Any:
    return _quantized("float8")


VARIANTS = {"as built": as_built, "LoRA (enable_lora(4))": lora, 'quantize("int8")': int8,
            'quantize("int4")': int4, 'quantize("float8")': float8}


def table(variants: dict[str, Any], batch: int, processes: int, steps: int,
          optimizer: str = "adam", before: Any = None) -> str:
    """Each variant's model measured in ``processes`` fresh processes of
    ``steps`` steps and estimated, as a table (GitHub markdown). With
    ``before`` (a context manager factory), also estimated inside it, in a
    column of its own (the estimate as it was before a change)."""
    from tabulate import tabulate

    import keras_memscope as memscope

    rows = []
    for name, build in variants.items():
        model = build()
        earlier = []
        if before is not None:
            with before():
                then = memscope.estimate(model, batch, optimizer=optimizer, device="cpu")
            earlier = [f"{then.peak_bytes / MIB:.1f}"]
        est = memscope.estimate(model, batch, optimizer=optimizer, device="cpu")
        runs = [memscope.measure(model, batch, optimizer=optimizer, steps=steps, device="cpu")
                for _ in range(processes)]
        measured = [p for r in runs for p in r.step_peak_bytes]
        worst = max(r.peak_bytes for r in runs)
        rows.append([name, ", ".join(f"{r.peak_bytes / MIB:.1f}" for r in runs),
                     f"{min(measured) / MIB:.1f} - {max(measured) / MIB:.1f}",
                     *earlier, f"{est.peak_bytes / MIB:.1f}",
                     f"{(est.peak_bytes / worst - 1) * 100:+.1f}%"])
    return tabulate(rows, headers=["model", "measured MiB (processes)", "measured steps MiB",
                                   *(["graph MiB before"] if before is not None else []),
                                   "graph MiB", "error"], tablefmt="github")


def run(argv: list[str] | None, description: str, variants: dict[str, Any], batch: int,
        processes: int, steps: int, before: Any = None) -> int:
    """The command line of this script and of the others that measure
    variants this way (``benchmarks.rnn_cells``, ``benchmarks.composite_layers``,
    ``benchmarks.preprocessing``): ``--processes``, ``--steps`` and
    ``--batch``, then the machine and :func:`table`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--processes", type=int, default=processes)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch", type=int, default=batch)
    args = parser.parse_args(argv)
    from benchmarks import machine

    print(f"machine: {machine.describe(machine.facts())}")
    print(table(variants, args.batch, args.processes, args.steps, before=before))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(argv, __doc__.splitlines()[0], VARIANTS, 32, processes=4, steps=5)


if __name__ == "__main__":
    raise SystemExit(main())
