"""The accuracy and remedies benchmarks under models of the step that were
tried and not adopted (``benchmarks/RESULTS.md``, "The two gradient
products at this machine's own speeds" and "Models nobody had estimated").

    python -m benchmarks.ordering_variants --variants first-chunk onednn-speeds ratio \
        -- --blind --methods graph
    python -m benchmarks.ordering_variants --variants first-chunk --run remedies \
        -- --processes 12

Everything after ``--`` goes to ``benchmarks.accuracy`` (``--run accuracy``,
the default) or ``benchmarks.remedies``; their cached measurements are
used, and the estimates are made in this process with the variants in
place:

* ``first-chunk``: the simulated allocator's first region starts with one
  256-byte chunk held, as a real process's holds the seed tensors and a
  handle made before the first weight is drawn;
* ``matmul-shapes``: the speeds that order the CPU's two gradient streams
  (``keras_memscope.timing.NOMINAL_CPU_SPEEDS``) gain a matmul's and its two
  gradients' speeds by smallest dimension, as fractions of the square
  product's (medians of three ``memscope.calibrate`` runs on a 2-core AMD
  EPYC with oneDNN's kernels), scaled to the nominal matmul speed;
* ``onednn-speeds``: those speeds replaced by the same three calibrations'
  medians, every figure (convolutions' filter and input gradients 363 and
  483 GFLOP/s, where the nominal ones are 59 and 104);
* ``ratio``: each prim's input- and weight-gradient factors share a common
  part, so that the log of their ratio spreads by ``--ratio-sigma`` (0.22:
  the median over ResNet-50's layers of that spread over profiled steps,
  ``benchmarks/op_time_spread.py``) while each factor keeps the spread of
  ``op_time_sigma``;
* ``add-pass-through``: an addition's gradient for each input of its
  output's shape is the output gradient's own buffer, as TensorFlow hands it
  on (``keras_memscope.schedule.PASS_THROUGH_GRADIENTS``), where the
  simulation gives each further input a buffer of its own;
* ``read-together``: a prim two of whose gradient ops read its output
  gradient as they become ready together (a product's ``dy * b`` and
  ``dy * a``) writes neither into it while the second thread is free, as
  TensorFlow runs them side by side then
  (``keras_memscope.schedule.SIDE_BY_SIDE_GRADIENTS``);
* ``onednn-conv-ratios``: a convolution's filter and input gradients at
  oneDNN's speeds relative to its forward kernel (the calibrations' 363
  and 483 against 480 GFLOP/s), on the nominal forward speed: the filter
  gradient 1.33 times as slow as the input gradient, not 1.77;
* ``update-busy``: with ``read-together``, an optimizer update made during
  the backward pass holds the second thread for its simulated seconds too
  (``keras_memscope.schedule.UPDATES_HOLD_THE_THREAD``);
* ``weight-gradient-first``: a convolution's or matrix product's weight
  gradient that comes while the second thread is busy starts at once, and
  its input gradient waits for a thread
  (``keras_memscope.schedule.WEIGHT_GRADIENT_FIRST``), in every layer
  whose executor order is not read (``keras_memscope.executor``: elsewhere
  that order decides);
* ``timed-copies``: an update writes its weight into a copy only where the
  simulated times have an input gradient still reading the weight then
  (``keras_memscope.schedule.TIMED_COPIES``), not every time;
* ``six-steps``: the CPU's simulated orders each run six steps after the
  warm-up, the highest kept (``DeviceProfile.simulated_steps``), as
  ``benchmarks/accuracy.py`` measures six;
* ``per-prim-workspace``: the intermediates a layer's gradient ops make
  beyond the gradients the schedule holds are held beside the gradients of
  the forward op whose gradient function made them (the tape's own record,
  at their highest there), and a forward op whose gradient writes into the
  gradient it was given hands it on as its input's
  (``keras_memscope.tfgraph.PER_PRIM_WORKSPACE``), where the layer's
  highest is held where its gradient starts and where it ends;
* ``updates-take-time``: an optimizer update made while the step goes on
  holds its gradient and one variable-sized temporary for its simulated
  seconds, beside what is allocated meanwhile
  (``keras_memscope.schedule.UPDATES_TAKE_TIME``);
* ``saved-inputs-donate``: an element-wise prim without weights writes an
  input gradient into a tensor it saved for its gradient when nothing else
  reads that tensor any more, where the output gradient's buffer is taken
  (``keras_memscope.schedule.SAVED_INPUTS_DONATE``);
* ``products-side-by-side``: a matrix product of two activations computes
  its second input gradient on the second thread, holding what it reads
  till it ends, on every CPU (``keras_memscope.schedule.
  PRODUCT_GRADIENTS_SIDE_BY_SIDE``; adopted where TensorFlow runs its own
  kernels, whose products' speeds the ordering speeds have);
* ``loop-gradient-one-op``: a recurrent loop's weight gradients end with
  its input gradient, and what it saved goes then
  (``keras_memscope.schedule.LOOP_GRADIENT_ONE_OP``);
* ``dense-transposed-reads``: a Dense layer's input gradient ``dy @ W^T``
  reads its kernel transposed, at ``NOMINAL_TRANSPOSED_READ_BYTES_S`` more
  per byte on TensorFlow's own kernels
  (``keras_memscope.tfgraph.DENSE_TRANSPOSED_READS``);
* ``conv-gemm-shapes``: on TensorFlow's own CPU kernels, a convolution's
  filter and input gradients at the speeds of Eigen contractions of their
  own shapes (``keras_memscope.timing.CONV_GEMM_SHAPES``,
  ``CONV_GRADIENT_CONTRACTIONS``), not at one nominal speed each;
* ``push-constants-down``: each traced gradient ``op(C, op(X, Y))`` rewritten
  as grappler's constant folding rewrites it, ``op(X, op(C, Y))``, the new
  inner op run in the forward pass where it reads only forward tensors
  (``keras_memscope.tfgraph.PUSH_CONSTANTS_DOWN``; attention's scaled
  softmax gradient);
* ``push-down-as-grappler``: the same, only where grappler's own rewrite of
  the layer's traced graph pairs the constant with that leaf
  (``keras_memscope.tfgraph.PUSH_DOWN_AS_GRAPPLER_DOES``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import sys
from collections.abc import Iterator, Sequence
from typing import Any

VARIANTS = ("first-chunk", "matmul-shapes", "onednn-speeds", "ratio", "add-pass-through",
            "read-together", "update-busy", "onednn-conv-ratios", "weight-gradient-first",
            "timed-copies", "six-steps", "updates-take-time", "saved-inputs-donate",
            "per-prim-workspace", "products-side-by-side", "loop-gradient-one-op",
            "dense-transposed-reads", "conv-gemm-shapes", "push-constants-down",
            "push-down-as-grappler")
#: the switches of ``keras_memscope.tfgraph`` that variants set: they change
#: what a layer's trace gives, so its cached traces go when one is restored
TFGRAPH_SWITCHES = ("PER_PRIM_WORKSPACE", "DENSE_TRANSPOSED_READS", "PUSH_CONSTANTS_DOWN",
                    "PUSH_DOWN_AS_GRAPPLER_DOES")
#: the kernels ``weight-gradient-first`` starts first
FIRST_KERNELS = frozenset({"conv", "conv_transpose", "matmul"})
#: the variants that set a switch of ``keras_memscope.schedule``: its name and value
SCHEDULE_SWITCHES: dict[str, tuple[str, Any]] = {
    "weight-gradient-first": ("WEIGHT_GRADIENT_FIRST", FIRST_KERNELS),
    "timed-copies": ("TIMED_COPIES", True),
    "updates-take-time": ("UPDATES_TAKE_TIME", True),
    "update-busy": ("UPDATES_HOLD_THE_THREAD", True),
    "read-together": ("SIDE_BY_SIDE_GRADIENTS", True),
    "saved-inputs-donate": ("SAVED_INPUTS_DONATE", True),
    "products-side-by-side": ("PRODUCT_GRADIENTS_SIDE_BY_SIDE", True),
    "loop-gradient-one-op": ("LOOP_GRADIENT_ONE_OP", True),
}

G = 1e9
#: medians of three calibrations (``memscope.calibrate("cpu")``) of a 2-core
#: AMD EPYC, tensorflow-cpu 2.21 with oneDNN's kernels, FLOP/s
ONEDNN_RATES = {
    "matmul": 470.5 * G, "conv": 480.0 * G, "conv_filter_grad": 363.0 * G,
    "conv_input_grad": 482.9 * G, "reduce": 32.1 * G,
    "matmul@16": 180.8 * G, "matmul@64": 348.0 * G, "matmul@256": 438.2 * G,
    "matmul@2048": 470.5 * G,
    "matmul_input_grad@16": 37.6 * G, "matmul_input_grad@64": 131.6 * G,
    "matmul_input_grad@256": 283.8 * G,
    "matmul_weight_grad@16": 214.3 * G, "matmul_weight_grad@64": 400.3 * G,
    "matmul_weight_grad@256": 465.4 * G,
}
ONEDNN_SPEEDS: dict[str, Any] = {
    "peak_flops": {"float32": 480.0 * G},
    "bandwidth_bytes_s": 58.3 * G,
    "op_overhead_s": 0.62e-6,
    "rates": ONEDNN_RATES,
}


@contextlib.contextmanager
def variants(names: Sequence[str], ratio_sigma: float = 0.22) -> Iterator[None]:
    """The step's model with the named variants in place, restored after."""
    import dataclasses

    from keras_memscope import allocator, devices, estimator, schedule, tfgraph, timing

    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    saved_speeds = timing.NOMINAL_CPU_SPEEDS
    saved_init = allocator.BFCModel.__init__
    saved_times = estimator._scaled_times
    saved_cpu = devices._cpu_profile
    switches = {**SCHEDULE_SWITCHES,
                "add-pass-through": ("PASS_THROUGH_GRADIENTS", schedule._ADDITIONS | {"AddN"})}
    saved_switches = {attr: getattr(schedule, attr) for attr, _ in switches.values()}
    for name in names:
        if name in switches:
            setattr(schedule, *switches[name])
    saved_traced = {attr: getattr(tfgraph, attr) for attr in TFGRAPH_SWITCHES}
    saved_conv_gemm = timing.CONV_GEMM_SHAPES
    if "conv-gemm-shapes" in names:
        timing.CONV_GEMM_SHAPES = True
    if "per-prim-workspace" in names:
        tfgraph.PER_PRIM_WORKSPACE = True
        tfgraph._CACHE.clear()  # (traced before with the switch off)
    if "dense-transposed-reads" in names:
        tfgraph.DENSE_TRANSPOSED_READS = True
        tfgraph._CACHE.clear()
    if "push-constants-down" in names or "push-down-as-grappler" in names:
        tfgraph.PUSH_CONSTANTS_DOWN = True
        tfgraph.PUSH_DOWN_AS_GRAPPLER_DOES = "push-down-as-grappler" in names
        tfgraph._CACHE.clear()
    if "six-steps" in names:
        devices._cpu_profile = lambda: dataclasses.replace(saved_cpu(), simulated_steps=6)
    if "onednn-speeds" in names:
        timing.NOMINAL_CPU_SPEEDS = ONEDNN_SPEEDS
    elif "matmul-shapes" in names:
        nominal = saved_speeds["rates"]["matmul"]
        square = ONEDNN_RATES["matmul"]
        shaped = {k: v / square * nominal for k, v in ONEDNN_RATES.items() if "@" in k}
        timing.NOMINAL_CPU_SPEEDS = {**saved_speeds,
                                     "rates": {**saved_speeds["rates"], **shaped}}
    if "onednn-conv-ratios" in names:
        rates = dict(timing.NOMINAL_CPU_SPEEDS["rates"])
        for family in ("conv_filter_grad", "conv_input_grad"):
            rates[family] = rates["conv"] * ONEDNN_RATES[family] / ONEDNN_RATES["conv"]
        timing.NOMINAL_CPU_SPEEDS = {**timing.NOMINAL_CPU_SPEEDS, "rates": rates}
    if "first-chunk" in names:
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            saved_init(self, *args, **kwargs)
            self._extend(allocator.GRANULE)  # the first region, 2 MiB
            self._find(allocator.GRANULE)  # its first chunk, held for good
        allocator.BFCModel.__init__ = init  # type: ignore[method-assign]
    if "ratio" in names:
        def scaled_times(times: Any, sigma: float, seed: int) -> Any:
            half = ratio_sigma / 2
            common = math.sqrt(max(sigma * sigma - half * half, 0.0))
            normals = estimator._prim_factors(1.0, random.Random(seed), 2)

            def scaled(cost: Any) -> tuple[float, float]:
                (a, b), (u, v) = times(cost), normals(cost)
                shared, apart = common * math.log(u), half * math.log(v)
                return a * math.exp(shared + apart), b * math.exp(shared - apart)
            return scaled
        estimator._scaled_times = scaled_times
    try:
        yield
    finally:
        timing.NOMINAL_CPU_SPEEDS = saved_speeds
        allocator.BFCModel.__init__ = saved_init  # type: ignore[method-assign]
        estimator._scaled_times = saved_times
        for attr, value in saved_switches.items():
            setattr(schedule, attr, value)
        devices._cpu_profile = saved_cpu
        timing.CONV_GEMM_SHAPES = saved_conv_gemm
        if any(getattr(tfgraph, attr) != value for attr, value in saved_traced.items()):
            for attr, value in saved_traced.items():
                setattr(tfgraph, attr, value)
            tfgraph._CACHE.clear()  # (traced with the variants' switches)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(
        description="Run benchmarks.accuracy or benchmarks.remedies (arguments after --) "
                    "with models of the training step that were tried and not adopted.")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, required=True,
                        help="the models to put in place (this module's docstring)")
    parser.add_argument("--ratio-sigma", type=float, default=0.22,
                        help="with 'ratio': the spread of the log of the two gradient "
                             "factors' ratio")
    parser.add_argument("--run", choices=("accuracy", "remedies"), default="accuracy",
                        help="the benchmark to run (default: accuracy)")
    options = parser.parse_args(argv)
    if options.run == "accuracy":
        from benchmarks.accuracy import main as run
    else:
        from benchmarks.remedies import main as run
    with variants(options.variants, options.ratio_sigma):
        return run(rest)


if __name__ == "__main__":
    sys.exit(main())
