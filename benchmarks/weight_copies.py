"""How many variables a training step's updates write into copies: real
steps against the simulated step.

TensorFlow's ``AssignSubVariableOp`` and ``AssignAddVariableOp`` copy a
variable before writing it when another tensor still holds its buffer (an
input gradient's read of the weight, ``dx = g @ W^T``, not yet run); the
copy becomes the variable's storage, in the regions the step's tensors
use. A fresh process with the BFC allocator on the CPU trains the model
(``benchmarks/zoo.py``, or ``module:function``) under the profiler, one
warm-up step and ``--steps`` more, with a tensor made before each step to
mark where it starts (``benchmarks.allocation_trace.real_events``); the
allocations those ops make are counted step by step. The estimate's
nominal order is simulated with the variants of
``benchmarks.ordering_variants`` given (none: the default model, where
every update whose weight an input gradient reads writes a copy)::

    python -m benchmarks.weight_copies --model resnet50 --batch 16 --optimizer adam --steps 3
    python -m benchmarks.weight_copies --model resnet50 --batch 16 --optimizer adam \\
        --variants weight-gradient-first timed-copies
"""

from __future__ import annotations

import argparse
import sys

MIB = 2**20


def real_copies(model: str, batch: int, optimizer: str, steps: int) -> list[list[int]]:
    """The sizes of the variable copies each measured step's updates make."""
    from benchmarks.allocation_trace import STEP_MARK_BYTES, real_events

    per_step: list[list[int]] = []
    for allocated, _, requested, _, op in real_events(model, batch, optimizer, steps,
                                                       mark_steps=True):
        if not allocated:
            continue
        if requested == STEP_MARK_BYTES:
            per_step.append([])
        elif per_step and op.split("/")[-1].split("_")[0] in ("AssignSubVariableOp",
                                                            "AssignAddVariableOp"):
            per_step[-1].append(requested)
    if len(per_step) != steps:
        raise RuntimeError(f"found {len(per_step)} step marks of {STEP_MARK_BYTES} bytes, "
                           f"expected {steps}")
    return per_step


def simulated_copies(model: str, batch: int, optimizer: str,
                     names: list[str]) -> tuple[list[int], int]:
    """The sizes of the weights the estimate's nominal order copies (in its
    highest step), and how many trainable variables the model has."""
    import keras_memscope as memscope
    from benchmarks.accuracy import named_optimizer
    from benchmarks.ordering_variants import variants
    from benchmarks.step_phases import simulations
    from benchmarks.zoo import named

    built = named(model)
    with simulations() as results, variants(names):
        memscope.estimate(built, batch, optimizer=named_optimizer(optimizer), device="cpu",
                          method="graph")
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
