"""The traced order of each layer's two gradients against a real step's.

``keras_memscope.executor`` reads which of a convolution's or product's two
gradients TensorFlow's executor starts first from grappler's rewrite of the
traced training step, without running it. This runs one real step of each
named zoo configuration (``train_on_batch`` under ``run_metadata``, a step of
the batch given) and reads the same flags off the graph the runtime built
(its optimized function graph, nodes in id order); it prints, per
configuration, how many gradient pairs agree. A pair is keyed by its input
gradient's op name with the name scopes' numeric suffixes dropped (a shared
layer's calls: one list, in the graph's order).

    python -m benchmarks.executor_order senet:8:sgd-nesterov mlp:256:sgd ...
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter, defaultdict

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

DEFAULT = ["senet:8:sgd-nesterov", "mlp:256:sgd", "cnn:128:adam", "resnet50:16:sgd",
           "vgg16:8:adam", "unet:8:adam", "transformer:8:adam", "siamese:64:rmsprop",
           "mobilenetv2:8:adam", "sepspatial:32:adafactor"]


def _key(name: str) -> str:
    scope = name.split("gradient_tape/", 1)[-1].rsplit("/", 1)[0]
    return re.sub(r"_\d+(?=/|$)", "", scope)


def flags_by_name(nodes: list) -> dict[str, list[tuple[bool, bool | None]]]:
    """Each pair's (kernel, bias) flags (``executor._pairs``'s, keyed by the
    input gradient's scope): whether the weight and the bias gradient come
    after the input gradient among the output gradient's readers."""
    by_name = {n.name: n for n in nodes}

    def reads_weight(node) -> bool:
        """Whether a product reads a variable (through casts and views)."""
        for name in node.input[:2]:
            src = by_name.get(name.lstrip("^").split(":")[0])
            for _ in range(8):
                if src is None or src.op == "ReadVariableOp":
                    break
                src = (by_name.get(src.input[0].lstrip("^").split(":")[0])
                       if src.op in ("Cast", "Identity", "Reshape") and src.input else None)
            if src is not None:
                return True
        return False

    readers = defaultdict(list)
    for position, node in enumerate(nodes):
        for name in node.input:
            if not name.startswith("^"):
                base, _, port = name.partition(":")
                readers[(base, port or "0")].append((position, node))
    out = defaultdict(list)
    for read in readers.values():
        inputs, weights, biases = [], [], []
        for position, node in read:
            if "gradient_tape" not in node.name:
                continue
            if "BackpropInput" in node.op:
                inputs.append((position, node))
            elif "BackpropFilter" in node.op:
                weights.append(position)
            elif node.op == "BiasAddGrad":
                biases.append(position)
            elif node.op in ("MatMul", "BatchMatMulV2", "BatchMatMulV3"):
                (inputs.append((position, node)) if reads_weight(node)
                 else weights.append(position))
        if len(inputs) == 1 and len(weights) == 1:
            (at, node), = inputs
            out[_key(node.name)].append(
                (weights[0] > at, biases[0] > at if len(biases) == 1 else None))
    return dict(out)


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
    graph_def, _ = executor._runtime_graph_def(function, variables)
    traced = flags_by_name(executor.constructor_order(list(graph_def.node)))
    x, y, loss = synthetic_batch(model, batch, loss=getattr(model, "loss", None))
    model.compile(optimizer=named_optimizer(optimizer), loss=loss, jit_compile=False)
    runtime = flags_by_name(list(runtime_graph(model, x, y).node))
    keys = set(traced) | set(runtime)
    same = sum(sum((Counter(traced.get(k, [])) & Counter(runtime.get(k, []))).values())
               for k in keys)
    differ = sorted(k for k in keys if Counter(traced.get(k, [])) != Counter(runtime.get(k, [])))
    return sum(len(v) for v in runtime.values()), same, differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", default=DEFAULT,
                        help="model:batch:optimizer (zoo names; default: ten)")
    args = parser.parse_args(argv)
    total = agree = 0
    for config in args.configs:
        parts = config.split(":")
        if len(parts) != 3 or not parts[1].isdigit():
            parser.error(f"{config!r}: expected model:batch:optimizer")
        pairs, same, differ = compare(parts[0], int(parts[1]), parts[2])
        total += pairs
        agree += same
        print(f"{config}: {same} of {pairs} pairs in the runtime's order"
              + (f"; differ: {', '.join(differ[:6])}" if differ else ""), flush=True)
    print(f"all: {agree} of {total}")
    return 0 if agree == total else 1


if __name__ == "__main__":
    sys.exit(main())
