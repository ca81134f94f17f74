"""How many variables a training step's updates write into copies: real
steps against the simulated step.

TensorFlow's ``AssignSubVariableOp`` and ``AssignAddVariableOp`` copy a
variable before writing it when another tensor still holds its buffer (an
input gradient's read of the weight, ``dx = g @ W^T``, not yet run); the
copy becomes the variable's storage, in the regions the step's tensors
use. A fresh process with the BFC allocator on the CPU trains the model
(``benchmarks/zoo.py``, or ``module:function``) under the profiler, one
warm-up step and ``--steps`` more, with a 7996-byte tensor made before each
step to mark where it starts; the allocations those ops make are counted
step by step. The estimate's nominal order is simulated with the variants
of ``benchmarks.ordering_variants`` given (none: the default model, where
every update whose weight an input gradient reads writes a copy)::

    python -m benchmarks.weight_copies --model resnet50 --batch 16 --optimizer adam --steps 3
    python -m benchmarks.weight_copies --model resnet50 --batch 16 --optimizer adam \\
        --variants weight-gradient-first timed-copies
"""

from __future__ import annotations

import argparse
import sys

MIB = 2**20
MARK_BYTES = 7996  # tf.fill([1999], 7): int32

PROFILED_RUN = r"""
import glob, json, sys, tempfile
import tensorflow as tf
from keras_memscope.measure import _xspace_events, run_steps
from benchmarks.accuracy import OPTIMIZERS
from benchmarks.zoo import named
name, batch, optimizer, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
optimizer = OPTIMIZERS.get(optimizer, optimizer)
model = named(name)
logdir = tempfile.mkdtemp()
tf.profiler.experimental.start(logdir)
marks = []
def marked(step):
    marks.append(tf.fill([1999], 7))
    return step()
run_steps(model, batch, optimizer=optimizer, loss=None, steps=steps, device="cpu",
          around_step=marked)
tf.profiler.experimental.stop()
path = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0]
events = [[kind == "MemoryAllocation", s.get("requested_bytes") or 0, str(s.get("tf_op") or "")]
          for kind, s in _xspace_events(path, ("MemoryAllocation", "MemoryDeallocation"))
          if str(s.get("allocator_name", "")).startswith("bfc_cpu")]
print(json.dumps(events))
"""


def real_copies(model: str, batch: int, optimizer: str, steps: int) -> list[list[int]]:
    """The sizes of the variable copies each measured step's updates make."""
    from benchmarks.allocator_replay import record

    events = record(PROFILED_RUN, [model, str(batch), optimizer, str(steps)])
    per_step: list[list[int]] = []
    for allocated, requested, op in events:
        if not allocated:
            continue
        if requested == MARK_BYTES:
            per_step.append([])
        elif per_step and op.split("/")[-1].split("_")[0] in ("AssignSubVariableOp",
                                                            "AssignAddVariableOp"):
            per_step[-1].append(requested)
    if len(per_step) != steps:
        raise RuntimeError(f"found {len(per_step)} step marks of {MARK_BYTES} bytes, "
                           f"expected {steps}")
    return per_step


def simulated_copies(model: str, batch: int, optimizer: str,
                     names: list[str]) -> tuple[list[int], int]:
    """The sizes of the weights the estimate's nominal order copies (in its
    highest step), and how many weights an input gradient reads."""
    import keras_memscope as memscope
    from benchmarks.accuracy import named_optimizer
    from benchmarks.ordering_variants import variants
    from benchmarks.zoo import named
    from keras_memscope import estimator

    built = named(model)
    results = []
    simulate = estimator.simulate

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        results.append(simulate(*args, **kwargs))
        return results[-1]

    estimator.simulate = recorded
    try:
        with variants(names):
            memscope.estimate(built, batch, optimizer=named_optimizer(optimizer), device="cpu",
                              method="graph")
    finally:
        estimator.simulate = simulate
    sizes = {id(v): int(v.numpy().nbytes) for v in built.trainable_variables}
    copied = [sizes.get(key, 0) for key in results[0].copied_weights]
    return copied, len(sizes)


def _copies(n: int) -> str:
    return f"{n} cop{'y' if n == 1 else 'ies'}"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.accuracy import add_model_arguments
    from benchmarks.ordering_variants import VARIANTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=3, help="steps after the warm-up (real)")
    parser.add_argument("--variants", nargs="*", choices=VARIANTS, default=[],
                        help="models of the step tried and not adopted (simulated)")
    options = parser.parse_args(argv)
    try:
        real = real_copies(options.model, options.batch, options.optimizer, options.steps)
    except RuntimeError as err:
        lines = str(err).strip().splitlines() or ["the measuring process failed"]
        print(f"weight_copies: {lines[-1]}", file=sys.stderr)
        return 1
    for k, sizes in enumerate(real, 1):
        print(f"real step {k}: {_copies(len(sizes))}, {sum(sizes) / MIB:.1f} MiB")
    copied, trainable = simulated_copies(options.model, options.batch, options.optimizer,
                                         options.variants)
    print(f"simulated ({' '.join(options.variants) or 'default'}): {_copies(len(copied))} of "
          f"{trainable} trainable variables, {sum(copied) / MIB:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
