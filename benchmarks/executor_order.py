"""The traced order of each layer's two gradients against a real step's.

``keras_memscope.executor`` reads which of a convolution's or product's two
gradients TensorFlow's executor starts first from grappler's rewrite of the
traced training step, without running it. This runs one real step of each
named zoo configuration (``train_on_batch`` under ``run_metadata``, a step of
the batch given) and reads the same flags off the graph the runtime built
(its optimized function graph, nodes in id order); it prints, per
configuration, how many gradient pairs agree (``executor._pairs`` on both
graphs, each weight named as the runtime names its function argument; a
shared layer's calls: one list, in the forward pass's order).

    python -m benchmarks.executor_order senet:8:sgd-nesterov mlp:256:sgd ...

With ``--batches`` it runs no step: it traces each configuration at batches
1, B and 3 x B and says whether the three give the same flags (the order is
kept per model and optimizer, whatever the batch).

    python -m benchmarks.executor_order --batches
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

DEFAULT = ["senet:8:sgd-nesterov", "mlp:256:sgd", "cnn:128:adam", "resnet50:16:sgd",
           "vgg16:8:adam", "unet:8:adam", "transformer:8:adam", "siamese:64:rmsprop",
           "mobilenetv2:8:adam", "sepspatial:32:adafactor"]


def _argument(name: str) -> str:
    """A captured variable's placeholder name as the runtime names the
    function argument it becomes (``a/B_1/c`` -> ``a_b_1_c``)."""
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


def runtime_graph(model, x, y):
    """The graph TensorFlow's runtime builds for one real training step of
    the compiled ``model`` on ``(x, y)``: ``run_metadata``'s optimized graph
    of the step's function (nodes in id order)."""
    from tensorflow.python.eager import context

    context.enable_run_metadata()
    try:
        model.train_on_batch(x, y)
        metadata = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
    return max(metadata.function_graphs,
               key=lambda f: len(f.post_optimization_graph.node)).post_optimization_graph


def compare(model_name: str, batch: int, optimizer: str) -> tuple[int, int, list[str]]:
    import keras

    from keras_memscope import executor
    from keras_memscope.measure import synthetic_batch

    from . import zoo
    from .accuracy import named_optimizer

    keras.utils.clear_session()
    model = zoo.named(model_name)
    function, variables = executor._step_graph(model, batch, named_optimizer(optimizer), None)
    graph_def, variable_of = executor._runtime_graph_def(function, variables)
    traced = executor._pairs(executor.constructor_order(list(graph_def.node)),
                             {name: _argument(name) for name in variable_of})
    x, y, loss = synthetic_batch(model, batch, loss=getattr(model, "loss", None))
    model.compile(optimizer=named_optimizer(optimizer), loss=loss, jit_compile=False)
    graph = runtime_graph(model, x, y)
    runtime = executor._pairs(list(graph.node),
                              {n.name: n.name for n in graph.node if n.op == "_Arg"})
    keys = set(traced) | set(runtime)
    same = sum(sum((Counter(traced.get(k, [])) & Counter(runtime.get(k, []))).values())
               for k in keys)
    differ = sorted(k for k in keys if Counter(traced.get(k, [])) != Counter(runtime.get(k, [])))
    return sum(len(v) for v in runtime.values()), same, differ


def same_at_batches(model_name: str, batch: int, optimizer: str) -> tuple[bool, int | None]:
    """Whether the traced flags at batches 1, ``batch`` and 3 x ``batch``
    are the same, and how many pairs there are (None: the order is not read)."""
    import keras

    from keras_memscope import executor

    from . import zoo
    from .accuracy import named_optimizer

    keras.utils.clear_session()
    model = zoo.named(model_name)
    found = []
    for b in (1, batch, 3 * batch):
        executor._ORDERS.clear()  # (traced afresh: the order is kept whatever the batch)
        found.append(executor.weight_gradient_first(model, b, named_optimizer(optimizer)))
    pairs = None if found[1] is None else sum(len(v) for v in found[1].values())
    return found[0] == found[1] == found[2], pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", default=DEFAULT,
                        help="model:batch:optimizer (zoo names; default: ten)")
    parser.add_argument("--batches", action="store_true",
                        help="trace at batches 1, B and 3 x B, no step run: the same flags?")
    args = parser.parse_args(argv)
    total = agree = 0
    for config in args.configs:
        parts = config.split(":")
        if len(parts) != 3 or not parts[1].isdigit():
            parser.error(f"{config!r}: expected model:batch:optimizer")
        if args.batches:
            same_flags, count = same_at_batches(parts[0], int(parts[1]), parts[2])
            total += 1
            agree += same_flags
            print(f"{config}: {'the same' if same_flags else 'NOT the same'} at batches "
                  f"1, {parts[1]} and {3 * int(parts[1])} "
                  f"({'order not read' if count is None else f'{count} pairs'})", flush=True)
            continue
        pairs, same, differ = compare(parts[0], int(parts[1]), parts[2])
        total += pairs
        agree += same
        print(f"{config}: {same} of {pairs} pairs in the runtime's order"
              + (f"; differ: {', '.join(differ[:6])}" if differ else ""), flush=True)
    print(f"all: {agree} of {total}" + (" configurations" if args.batches else ""))
    return 0 if agree == total else 1


if __name__ == "__main__":
    sys.exit(main())
