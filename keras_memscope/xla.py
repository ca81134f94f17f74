"""What a function TensorFlow compiles with XLA allocates while it runs.

Keras compiles some operations with XLA even when the training step is not
(on the CPU, grouped convolutions: ``keras.src.backend.tensorflow.nn.conv``).
A traced layer then shows one call op whose work, and whose temporaries, are
inside the compiled function. XLA runs it with one temporary buffer, sized by
its buffer assignment, beside the function's outputs. That buffer can dwarf
everything else: the filter gradient of a convolution with one input channel
per group (ConvNeXt's 7 x 7 depthwise convolutions) is computed as a dense
convolution to a ``[7, 7, C, C]`` result and masked into a second buffer of that
size, 220.5 MiB at C = 768 for a 147 KiB kernel (allocator trace, tensorflow-cpu
2.21).

:func:`call_temp_bytes` compiles the called function for the call's static
input shapes and reads XLA's own buffer assignment for it
(:func:`assigned_temp_bytes`): the allocations that are neither the call's
inputs (parameters) nor its outputs (live out), nor constants or
thread-local, are what XLA allocates through TensorFlow's allocator while
the call runs. Against the allocator (tensorflow-cpu 2.21), to the byte: a
grouped Conv1D's gradient with 4 and 16 input channels per group (64 x 512
x 16 and 64 x 256 x 64 inputs) allocates 8,396,800 and 8,429,568 bytes
(``benchmarks.allocation_trace``, the accuracy set's ``poissonnet``); one
input channel per group 231,211,008 bytes at C = 768, 7 x 7.
Where the assignment cannot be read, :func:`hlo_temp_bytes` walks the
optimized module's entry computation in schedule order and returns the most
bytes its instructions' buffers hold at once, without the parameters and
the results. The walk is exact for one input channel per group; with more it
does not see the buffers XLA's assignment shares, and gives more: 10.0 and
12.1 MiB for the two gradients above.
"""

from __future__ import annotations

import re
from typing import Any

#: Bytes per element of XLA's primitive types.
_ELEMENT_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
#: Instructions that make no buffer of their own in the temporary allocation.
_NO_BUFFER = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast",
              "after-all", "partition-id", "replica-id"}
#: Instructions whose result is (a piece of) their first operand's buffer.
_ALIASES = {"bitcast", "get-tuple-element"}

_INSTRUCTION = re.compile(
    r"^\s*(?P<root>ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\(.*?\)|[a-z]\w*\[[^\]]*\](?:\{[^}]*\})?)"
    r"\s+(?P<opcode>[a-z][\w\-]*)\((?P<operands>[^)]*)\)")
_ARRAY = re.compile(r"([a-z]\w*)\[([\d,]*)\]")
_OPERAND = re.compile(r"%([\w.\-]+)")

#: The ops that call a function (``tfgraph`` reads a nested function's work
#: through them too).
CALL_OPS = ("StatefulPartitionedCall", "PartitionedCall")

_CACHE: dict[str, int] = {}


def _shape_bytes(shape: str) -> int:
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        n = 1
        for d in dims.split(","):
            if d:
                n *= int(d)
        total += n * _ELEMENT_BYTES.get(dtype, 4)
    return total


def _entry(text: str) -> list[str]:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("ENTRY ")), None)
    if start is None:
        return []
    body = []
    for ln in lines[start + 1:]:
        if ln.startswith("}"):
            break
        body.append(ln)
    return body


def hlo_temp_bytes(text: str) -> int:
    """The most bytes the entry computation's own buffers hold at once.

    ``text`` is an optimized, scheduled HLO module (instructions printed in
    the order they run). Each instruction that makes a buffer holds it from
    where it is defined to its last reader; parameters, constants and the
    results (the root, or the root tuple's elements) are outside the
    temporary allocation, and views (``bitcast``, ``get-tuple-element``)
    read their source's buffer. Instructions inside fusions make no buffers."""
    parsed = []
    for ln in _entry(text):
        m = _INSTRUCTION.match(ln)
        if m:
            parsed.append((m["name"], m["shape"], m["opcode"], _OPERAND.findall(m["operands"]),
                           bool(m["root"])))
    if not parsed:
        return 0
    source: dict[str, str] = {}  # a view -> the buffer it reads
    results: set[str] = set()
    for name, _, opcode, operands, root in parsed:
        if opcode in _ALIASES and operands:
            source[name] = source.get(operands[0], operands[0])
        if root:
            results.update([name] if opcode != "tuple" else operands)
    results = {source.get(r, r) for r in results}
    last_use: dict[str, int] = {}
    for i, (_, _, _, operands, _) in enumerate(parsed):
        for o in operands:
            last_use[source.get(o, o)] = i
    size: dict[str, int] = {}
    for name, shape, opcode, _, _ in parsed:
        if opcode not in _NO_BUFFER and name not in results:
            size[name] = _shape_bytes(shape)
    live = peak = 0
    ends: dict[int, int] = {}
    for i, (name, _, _, _, _) in enumerate(parsed):
        if name in size:
            live += size[name]
            end = last_use.get(name, i)
            ends[end] = ends.get(end, 0) + size[name]
        peak = max(peak, live)
        live -= ends.pop(i, 0)
    return peak


def compiled(op: Any) -> bool:
    """Whether a call op's function runs compiled by XLA."""
    if op.type not in CALL_OPS:
        return False
    try:
        return bool(op.get_attr("_XlaMustCompile"))
    except (ValueError, TypeError):
        return False


def call_temp_bytes(op: Any) -> int:
    """The temporary buffer XLA allocates to run this call op's function (0
    for a call that is not compiled, or one that cannot be compiled here)."""
    if not compiled(op) or not all(t.shape.is_fully_defined() for t in op.inputs):
        return 0
    if any(t.dtype.name == "resource" for t in op.inputs):
        return 0
    name = op.get_attr("f").name
    key = name + repr([(tuple(t.shape), t.dtype.name) for t in op.inputs])
    if key not in _CACHE:
        _CACHE[key] = _compile(op, name)
    return _CACHE[key]


def _compile(op: Any, name: str) -> int:
    import tensorflow as tf
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.ops import gen_functional_ops

    fn = op.graph._get_function(name)
    if fn is None:
        return 0
    tout = [t.dtype for t in op.outputs]

    def body(*args: Any) -> Any:
        tf_ops.get_default_graph()._add_function_recursive(fn)
        return gen_functional_ops.partitioned_call(list(args), Tout=tout, f=name)

    specs = [tf.TensorSpec(t.shape, t.dtype) for t in op.inputs]
    try:
        jitted = tf.function(body, jit_compile=True, autograph=False)
        ir = jitted.experimental_get_compiler_ir(*specs)
    except Exception:  # a function XLA cannot compile here: nothing known
        return 0
    assigned = assigned_temp_bytes(ir)
    if assigned is not None:
        return assigned
    try:
        return hlo_temp_bytes(ir(stage="optimized_hlo"))
    except Exception:
        return 0


def assigned_temp_bytes(ir: Any) -> int | None:
    """The bytes of the temporary allocations in XLA's buffer assignment for
    a compiled function (``ir``: what ``experimental_get_compiler_ir``
    returns), or None where it cannot be read."""
    try:
        from tensorflow.compiler.xla.service import hlo_pb2

        proto = hlo_pb2.HloProto()
        proto.ParseFromString(ir(stage="optimized_hlo_proto_serialized"))
    except Exception:
        return None
    if not proto.HasField("buffer_assignment"):
        return None
    return sum(a.size for a in proto.buffer_assignment.buffer_allocations
               if not (a.is_entry_computation_parameter or a.maybe_live_out or a.is_constant
                       or a.is_thread_local))
