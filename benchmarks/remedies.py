"""Predicted against measured saving of each remedy, on this CPU.

For each model, the baseline training step and the step with one remedy are
measured (fresh processes, BFC allocator, the highest of the processes'
maxima, 3 or ``--processes``; cached with the machine they were taken on,
one file per kind of machine: ``benchmarks.machine.cache_file``) and
estimated (``memscope.whatif``). The saving
is baseline minus remedy; the error is (predicted saving - measured saving)
/ measured saving. The range "between processes" is the saving any pair of
measuring processes shows (lowest baseline minus highest remedy, to highest
minus lowest); "saving of the medians" is the median baseline minus the
median remedy, less moved by one high or low process.

The same comparison with the middle instead of the highest: the graph
method's "typical saving" is the median of the baseline's simulated
orders (``MemoryEstimate.history_peaks``) minus the remedy's, against the
saving of the medians (the rules simulate one order: their peak). One
process or one simulated order cannot move either.

How repeatable a measured saving is: the processes of each configuration are
split in two halves every possible way, and each half's saving taken as the
whole one is (the highest baseline minus the highest remedy). "Halves'
savings" is the range of those savings, and "halves differ by" the median,
over the splits, of the difference between the two halves' savings relative
to their mean: what two independent measurements of the saving with half as
many processes each would disagree by. A saving whose halves differ by more
than the 15% target cannot show whether a prediction is within it.

New measurements run in started processes, or with ``--forked`` in processes
forked from one that has imported TensorFlow (``tests/forked.py``, the tests'
runner; ``benchmarks/forked_processes.py`` measures both side by side). The
cache records which (``runners``), and ``--only-runner`` makes the table
from one kind's processes alone.

    python -m benchmarks.remedies [--processes 6] [--held-out] [--forked]
    python -m benchmarks.remedies --processes 12 --only-runner started
    python -m benchmarks.remedies --processes 24 --forked --only transformer
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import statistics
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

CACHE_STEM = "measured_remedies"
# splits of one configuration's processes into halves (``halves``): all of
# them up to this many (12 processes: 924), else a fixed sample
MAX_SPLITS = 1000

# model, batch, remedy name, whatif arguments
CASES = [
    ("mlp_gelu", 1024, "RematScope activations", {"remat": "activations"}),
    ("mlp_gelu", 1024, "SGD instead of Adam", {"optimizer": "sgd"}),
    ("resnet50", 16, "mixed_bfloat16", {"dtype_policy": "mixed_bfloat16"}),
    ("resnet50", 16, "SGD instead of Adam", {"optimizer": "sgd"}),
    ("resnet50", 16, "batch 8 x 2 accumulation", {"accumulation_steps": 2}),
    ("resnet50", 16, "freeze first half", {"freeze": "half"}),
    ("transformer", 16, "RematScope activations", {"remat": "activations"}),
    ("transformer", 16, "mixed_bfloat16", {"dtype_policy": "mixed_bfloat16"}),
]

# remedies on models whose savings nobody had looked at when the estimator's
# mechanisms were written (``--held-out``)
HELD_OUT_CASES = [
    ("vit", 64, "RematScope activations", {"remat": "activations"}),
    ("vit", 64, "mixed_bfloat16", {"dtype_policy": "mixed_bfloat16"}),
    ("mobilenetv2", 8, "SGD instead of Adam", {"optimizer": "sgd"}),
    ("unet", 8, "batch 4 x 2 accumulation", {"accumulation_steps": 2}),
]


def _first_half(model: keras.Model) -> list[str]:
    """The first half of the layers that own weights, as ``fits`` suggests
    freezing them."""
    from keras_memscope.changes import weighted_layers

    names = [layer.name for layer in weighted_layers(model)]
    return names[: len(names) // 2]


def build(name: str, policy: str | None = None, remat: str | None = None,
          freeze: bool = False) -> keras.Model:
    """A zoo model built as the remedy asks (used by the measuring processes)."""
    from benchmarks import zoo

    if policy:
        keras.config.set_dtype_policy(policy)
    scope = keras.RematScope(mode=remat) if remat else contextlib.nullcontext()
    with scope:
        model = getattr(zoo, name)()
    if freeze:
        chosen = set(_first_half(model))
        for layer in model._flatten_layers(include_self=False):
            if layer.name in chosen:
                layer.trainable = False
    return model


def _spec(name: str, batch: int, change: dict) -> dict:
    kwargs = {"name": name}
    optimizer: object = change.get("optimizer", "adam")
    if "dtype_policy" in change:
        kwargs["policy"] = change["dtype_policy"]
    if "remat" in change:
        kwargs["remat"] = change["remat"]
    if change.get("freeze"):
        kwargs["freeze"] = True
    if "accumulation_steps" in change:
        k = change["accumulation_steps"]
        optimizer = keras.optimizers.serialize(keras.optimizers.Adam(
            gradient_accumulation_steps=k))
        # the automatic name ("adam_3") depends on what ran before; the cache
        # key must not, or the same configuration is measured again
        optimizer["config"].pop("name", None)
        batch = -(-batch // k)
    return {"builder": "benchmarks.remedies:build", "builder_kwargs": kwargs,
            "batch_size": batch, "optimizer": optimizer, "steps": 5, "device": "cpu",
            "loss": "sparse_categorical_crossentropy"}


def measured(spec: dict, cache: dict, here: dict, processes: int = 3,
             runner: str = "started", only: str | None = None) -> list[int]:
    """The per-process maxima of the configuration's training steps, taken on
    the machine ``here`` (``benchmarks.machine.facts``); new ones in
    ``runner``'s processes (``"started"`` or ``"forked"``). With ``only``,
    the maxima of that kind of process alone."""
    from benchmarks import machine
    from keras_memscope.measure import measure_subprocess

    key = json.dumps(spec, sort_keys=True)
    entry = cache.get(key)
    if not isinstance(entry, dict) or entry.get("machine") != here:
        entry = cache[key] = {"maxima": [], "machine": here}
    # (more processes than the cache holds: the missing ones are measured)
    while len(entry["maxima"]) < processes:
        runners = entry.setdefault("runners", ["started"] * len(entry["maxima"]))
        entry["maxima"].append(max(measure_subprocess(spec)["step_peak_bytes"]))
        runners.append(runner)
        path = machine.cache_file(CACHE_STEM, here)
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(cache, indent=1))
    return of_runner(entry, only) if only else entry["maxima"]


def of_runner(entry: dict, runner: str) -> list[int]:
    """A cache entry's maxima from ``runner``'s processes (entries written
    before the cache recorded runners were all measured in started ones)."""
    kinds = entry.get("runners", ["started"] * len(entry["maxima"]))
    chosen = [m for m, kind in zip(entry["maxima"], kinds) if kind == runner]
    if not chosen:
        raise SystemExit(f"no {runner} processes are cached for this configuration; "
                         f"measure some with --processes N{' --forked' * (runner == 'forked')}")
    return chosen


def halves(base: list[int], remedy: list[int]) -> tuple[float, float, float]:
    """Over every split of the baseline's and the remedy's processes into two
    halves (a fixed sample of ``MAX_SPLITS`` where there are more): the
    lowest and highest saving one half shows (its highest baseline minus its
    highest remedy), and the median of the two halves' difference relative
    to their mean saving."""
    def split_maxima(values: list[int]) -> tuple[np.ndarray, np.ndarray]:
        n = len(values)
        if math.comb(n, n // 2) <= MAX_SPLITS:
            splits = [list(c) for c in itertools.combinations(range(n), n // 2)]
        else:  # (24 processes: 2.7 million splits) a fixed sample of them
            rng = np.random.default_rng(0)
            splits = [list(rng.permutation(n)[: n // 2]) for _ in range(MAX_SPLITS)]
        first, second = [], []
        for chosen in splits:
            rest = set(range(n)) - set(chosen)
            first.append(max(values[i] for i in chosen))
            second.append(max(values[i] for i in rest))
        return np.array(first, float), np.array(second, float)

    base_a, base_b = split_maxima(base)
    rem_a, rem_b = split_maxima(remedy)
    saving_a = base_a[:, None] - rem_a[None, :]
    saving_b = base_b[:, None] - rem_b[None, :]
    mean = np.abs(saving_a + saving_b) / 2
    differ = np.abs(saving_a - saving_b) / np.where(mean > 0, mean, np.nan)
    both = np.concatenate([saving_a.ravel(), saving_b.ravel()])
    return float(both.min()), float(both.max()), float(np.nanmedian(differ))


def main(argv: list[str] | None = None) -> int:
    from benchmarks import machine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3,
                        help="measuring processes per configuration (at least; the "
                             "cache's are all used)")
    parser.add_argument("--held-out", action="store_true",
                        help="remedies on models not used to write the estimator "
                             "(HELD_OUT_CASES)")
    parser.add_argument("--forked", action="store_true",
                        help="measure in processes forked from one that has imported "
                             "TensorFlow (tests/forked.py)")
    parser.add_argument("--only", nargs="*", metavar="MODEL",
                        help="the remedies of these models alone (e.g. transformer vit)")
    parser.add_argument("--only-runner", choices=("started", "forked"),
                        help="the table from the cache's processes of this kind alone")
    options = parser.parse_args(argv)
    with machine.processes("forked" if options.forked else "started") as runner:
        return _table(options, runner)


def _table(options: argparse.Namespace, runner: str) -> int:
    import keras_memscope as memscope
    from benchmarks import machine, zoo

    here = machine.facts()
    path = machine.cache_file(CACHE_STEM, here)
    cache = json.loads(path.read_text()) if path.exists() else {}
    mib = 2**20
    print(f"machine: {machine.describe(here)}\n", flush=True)
    methods = ("graph", "rules")
    print("| model | batch | remedy | processes | measured MiB (before -> after) "
          "| saving measured | saving of the medians | between processes | halves' savings "
          "| halves differ by | "
          + " | ".join(f"{m} MiB (before -> after) | {m} saving | {m} error"
                       for m in methods)
          + " | graph typical saving | error against the medians' saving |")
    print("|---|---|---|---|---|---|---|---|---|---|" + "---|---|---|" * len(methods)
          + "---|---|")
    errors: dict[str, list[float]] = {m: [] for m in methods}
    typical_errors: list[float] = []
    repeatable = 0
    cases = HELD_OUT_CASES if options.held_out else CASES
    if options.only:
        unknown = sorted(set(options.only) - {case[0] for case in cases})
        if unknown:
            raise SystemExit(f"no remedies of {', '.join(unknown)} in this set; choose from "
                             f"{', '.join(sorted({case[0] for case in cases}))}")
        cases = [case for case in cases if case[0] in options.only]
    for name, batch, title, change in cases:
        base_all, rem_all = (measured(_spec(name, batch, c), cache, here, options.processes,
                                      runner, options.only_runner) for c in ({}, change))
        half_low, half_high, differ = halves(base_all, rem_all)
        repeatable += differ <= 0.15
        base_m, rem_m = max(base_all), max(rem_all)
        # the saving any pair of processes shows
        low, high = min(base_all) - max(rem_all), max(base_all) - min(rem_all)
        keras.utils.clear_session()
        model = getattr(zoo, name)()
        args = dict(change)
        if args.get("freeze") == "half":
            args["freeze"] = _first_half(model)
        args.setdefault("optimizer", "adam")
        saved_m = base_m - rem_m
        medians = statistics.median(base_all) - statistics.median(rem_all)
        cells = []
        estimates = {}
        for method in methods:
            base_e = memscope.estimate(model, batch, optimizer="adam", device="cpu",
                                       method=method)
            rem_e = memscope.whatif(model, batch, device="cpu", method=method, **args)
            estimates[method] = base_e, rem_e
            saved_e = base_e.peak_bytes - rem_e.peak_bytes
            err = (saved_e - saved_m) / saved_m if saved_m else float("nan")
            errors[method].append(abs(err))
            cells.append(f"{base_e.peak_bytes / mib:.0f} -> {rem_e.peak_bytes / mib:.0f} | "
                         f"{saved_e / mib:.0f} MiB | {err:+.0%}")
        base_g, rem_g = estimates["graph"]
        typical = typical_peak(base_g) - typical_peak(rem_g)
        typical_err = (typical - medians) / medians if medians else float("nan")
        typical_errors.append(abs(typical_err))
        cells.append(f"{typical / mib:.0f} MiB | {typical_err:+.0%}")
        print(f"| {name} | {batch} | {title} | {len(base_all)}, {len(rem_all)} | "
              f"{base_m / mib:.0f} -> {rem_m / mib:.0f} | "
              f"{saved_m / mib:.0f} MiB | {medians / mib:.0f} MiB | "
              f"{low / mib:.0f}-{high / mib:.0f} MiB | "
              f"{half_low / mib:.0f}-{half_high / mib:.0f} MiB | {differ:.0%} | "
              + " | ".join(cells) + " |", flush=True)
    print(f"\nsavings whose halves differ by 15% or less (median split): {repeatable} of "
          f"{len(errors[methods[0]])}")
    for method in methods:
        e = errors[method]
        print(f"\n{method}: median |error| {statistics.median(e):.0%}, worst {max(e):.0%} "
              f"over {len(e)} remedies; within 15%: {sum(x <= 0.15 for x in e)}")
    print(f"\ngraph, typical saving against the saving of the medians: median |error| "
          f"{statistics.median(typical_errors):.0%}, worst {max(typical_errors):.0%}; "
          f"within 15%: {sum(x <= 0.15 for x in typical_errors)}")
    return 0


def typical_peak(est: Any) -> float:
    """The middle of an estimate's simulated orders (its peak where it
    simulated one)."""
    return statistics.median(est.history_peaks) if est.history_peaks else est.peak_bytes


if __name__ == "__main__":
    sys.exit(main())
