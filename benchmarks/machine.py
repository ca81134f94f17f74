"""The machine a measurement was taken on.

TensorFlow's CPU kernels size some of their buffers from the CPU (the
convolution gradients' column buffers from its L2 cache, the thread pools
from its cores), it runs oneDNN's kernels instead on some CPUs (which have
no column buffers), and the estimate reads the same facts
(``keras_memscope.devices.cpu_cache_facts``, ``cpu_uses_onednn``), so a measurement stands only
for the machine it was taken on: the measurement caches keep these facts
beside each entry and measure again on another machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def facts() -> dict:
    """This machine's CPU model, L2 cache bytes per core, CPU threads, and
    whether TensorFlow runs oneDNN's kernels on it (its default for the CPU,
    or ``TF_ENABLE_ONEDNN_OPTS``)."""
    from keras_memscope.devices import cpu_cache_facts, cpu_uses_onednn

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    l2, threads = cpu_cache_facts()
    return {"cpu": cpu, "l2_bytes": l2, "threads": threads, "onednn": cpu_uses_onednn()}


def describe(machine: dict) -> str:
    return (f"{machine['cpu']}, L2 {machine['l2_bytes'] // 1024} KiB per core, "
            f"{machine['threads']} threads, "
            f"{'oneDNN' if machine.get('onednn') else 'TensorFlow'}'s kernels")


def tag(machine: dict) -> str:
    """A file-name tag for the kind of machine: its kernels, L2 and threads
    (``onednn-l2-1024k-2t``)."""
    kernels = "onednn" if machine.get("onednn") else "tf"
    return f"{kernels}-l2-{machine['l2_bytes'] // 1024}k-{machine['threads']}t"


def cache_file(stem: str, machine: dict | None = None) -> Path:
    """The measurement cache ``stem`` for this kind of machine (or
    ``machine``): one file per kind, so that measuring on one kind keeps
    another's (``benchmarks/results/measured_cpu-onednn-l2-1024k-2t.json``)."""
    return RESULTS / f"{stem}-{tag(machine or facts())}.json"


@contextlib.contextmanager
def processes(runner: str = "started") -> Iterator[str]:
    """While inside, ``keras_memscope.measure``'s processes are ``runner``'s:
    ``"started"`` (``subprocess.run``, as ``measure()`` starts them) or
    ``"forked"`` (forked from a process that has imported TensorFlow and
    Keras, ``tests/forked.py``: the same peaks, a few seconds less each,
    ``benchmarks/forked_processes.py``). Gives ``runner`` back."""
    if runner not in ("started", "forked"):
        raise ValueError(f"runner must be 'started' or 'forked', not {runner!r}")
    if runner == "started":
        yield runner
        return
    import importlib

    from tests import forked

    # the module, not the function ``keras_memscope.measure`` that shadows it
    measure = importlib.import_module("keras_memscope.measure")
    started, measure._run_process = measure._run_process, forked.run
    try:
        yield runner
    finally:
        measure._run_process = started
        forked.close_all()
