"""When grappler turns a sum of partial gradients into an accumulation.

Grappler's memory optimizer (``SchedulingPass`` in TensorFlow's
``memory_optimizer.cc``) rewrites an ``AddN`` of more than two inputs into a
``TemporaryVariable`` that each input is added into as it arrives, started
from a ``ZerosLike`` of the first input, when its own static estimate of the
step's peak (``GraphMemory::InferStatically``) exceeds 80% of the memory
size of the device, and only the AddNs whose inputs are alive at that static
peak. A process that ran the rewritten step keeps the zeros between steps
(the separable model at batch 64: ``AddN_5/tmp_var_zeros``, 18 MiB).

This runs the same optimizer offline on the graph of Keras' own training
step (``train_on_batch``'s function) with the CPU given each ``--memory``
size, and prints how many AddNs it rewrites; with ``--measure`` also what a
fresh process holds between steps after its first step
(``memscope.measure``), where the runtime made its own decision.

    python -m benchmarks.grappler_addn --model separable --batch 16 32 40 64
    python -m benchmarks.grappler_addn --batch 32 40 --memory 128 256 --measure
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from keras_memscope.tfgraph import CPU_DEVICE as DEVICE  # noqa: E402
from keras_memscope.tfgraph import grappler_rewrite  # noqa: E402


def _step_graph(model, batch: int):
    """The graph of the function ``train_on_batch`` runs, after one call."""
    import numpy as np
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

    x = np.zeros([batch, *model.input_shape[1:]], "float32")
    model.train_on_batch(x, np.zeros([batch], "int32"))
    found: list = []
    seen: set[int] = set()

    def walk(obj) -> None:
        if isinstance(obj, Function):
            found.append(obj)
            return
        if id(obj) in seen:
            return
        seen.add(id(obj))
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                walk(cell.cell_contents)
            except ValueError:  # an empty cell
                continue

    walk(model.train_function)
    traced = [f for f in found if f._list_all_concrete_functions()]
    return traced[0]._list_all_concrete_functions()[-1].graph


def rewritten_addns(graph, memory_mib: int) -> tuple[int, int]:
    """(AddNs of more than two inputs, how many grappler rewrites) with the
    CPU's memory size set to ``memory_mib``."""
    from tensorflow.core.protobuf import device_properties_pb2
    from tensorflow.python.grappler import cluster as gcluster

    # this machine's CPU as grappler describes it (frequency, caches, cores),
    # with the memory size given
    props = device_properties_pb2.DeviceProperties()
    props.CopyFrom(gcluster.Cluster().ListDevices()[0].properties)
    props.memory_size = memory_mib << 20
    cluster = gcluster.Cluster(devices=[device_properties_pb2.NamedDevice(name=DEVICE,
                                                                          properties=props)])
    out = grappler_rewrite(graph, cluster)
    ops = [n.op for n in out.node] + [n.op for f in out.library.function for n in f.node_def]
    candidates = sum(1 for op in graph.get_operations()
                     if op.type == "AddN" and len(op.inputs) > 2)
    return candidates, ops.count("DestroyTemporaryVariable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="separable", help="a benchmarks.zoo model")
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 32, 40, 48, 64])
    parser.add_argument("--memory", type=int, nargs="+", default=[64, 128, 160, 192, 256],
                        help="the CPU's memory size given to grappler, MiB")
    parser.add_argument("--measure", action="store_true",
                        help="also measure what a fresh process holds between steps")
    args = parser.parse_args(argv)

    import keras
    from tensorflow.python.client import device_lib

    import keras_memscope as memscope

    from . import zoo

    limits = {d.name: d.memory_limit for d in device_lib.list_local_devices()}
    print(f"TensorFlow's CPU device memory limit: {limits.get('/device:CPU:0', 0) / 2**20:.0f} MiB")
    print("| batch | AddN > 2 inputs | " + " | ".join(f"rewritten at {m} MiB" for m in args.memory)
          + (" | held between steps (MiB) |" if args.measure else " |"))
    print("|---|---|" + "---|" * len(args.memory) + ("---|" if args.measure else ""))
    for batch in args.batch:
        model = getattr(zoo, args.model)()
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        graph = _step_graph(model, batch)
        counts = [rewritten_addns(graph, m) for m in args.memory]
        row = [str(batch), str(counts[0][0])] + [str(c[1]) for c in counts]
        if args.measure:
            measured = memscope.measure(getattr(zoo, args.model)(), batch, optimizer="sgd",
                                        steps=3, device="cpu")
            row.append(f"{measured.persistent_bytes / 2**20:.2f}")
        print("| " + " | ".join(row) + " |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
