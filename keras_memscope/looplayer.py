"""A layer no rule knows that runs a loop of its own (``keras.ops.scan``,
``keras.ops.fori_loop``, ``keras.ops.while_loop``), costed from TensorFlow's
graph of its forward pass and gradient.

The graph method schedules a layer op by op, but a ``While`` op is not an
op like the others: its outputs and the lists its iterations push for the
gradient are ``variant`` tensors (``TensorList``s) whose bytes are their
elements', and the gradient flows through them into a second loop. This
module follows the layer's own ops in the order TensorFlow runs them and
counts the buffers each tensor holds: a list holds its elements' buffers,
a view holds its source's, a list made from a tensor a copy of its rows
(one allocation each), a loop's output
list holds one buffer per iteration of each tensor its body writes or
pushes into it (read off the loop's condition, ``loop_trips``), and one
buffer may be held by several tensors (a scan's states are both its output
list's elements and what its accumulator keeps for the gradient). What the
layer holds between its forward pass and its gradient, and the highest it
reaches in each beyond that, make one prim (:func:`loop_layer_prim`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from .ir import Prim, prim, upcast_bytes
from .tfgraph import (
    _MATMUL_OPS,
    FORWARDING_GRAD_OPS,
    FORWARDING_OPS,
    _constants,
    _elements,
    _past_identities,
    _slice_is_view,
    view_root,
)
from .tfgraph import _bytes as _traced_bytes
from .tfgraph import _macs as _op_macs
from .units import round_up

WHILE_OPS = ("While", "StatelessWhile")
_BRANCHES = ("If", "StatelessIf", "Case", "StatelessCase")
#: list ops whose output list holds what its input list holds, plus the
#: element they write
_LIST_WRITES = ("TensorListSetItem", "TensorListPushBack")
#: ops whose output holds no buffer of its own: its first input's
_VIEWS = {"Reshape", "Identity", "IdentityN", "Squeeze", "ExpandDims", "StopGradient",
          "Snapshot", "EnsureShape", "PreventGradient", "TensorListGetItem",
          "TensorListPopBack", "TensorListElementShape", "TensorListLength"}
#: ops that hold nothing (values known before the step, bookkeeping)
_NOTHING = {"Const", "NoOp", "Placeholder", "ReadVariableOp", "VarHandleOp", "Shape",
            "ShapeN", "Size", "Rank", "BroadcastGradientArgs", "InvertPermutation",
            "TensorListReserve", "EmptyTensorList"}
#: ops that read only their input's shape (a list's ``ZerosLike`` reads its
#: elements: TensorFlow's ``TensorListZerosLike`` makes a zero tensor per element)
_SHAPE_ONLY = {"Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs", "OnesLike"}


def _bytes(t: Any) -> int:
    """A tensor's own bytes: none for a list or a resource (a list's are
    its elements', counted as they are written into it)."""
    return 0 if t.dtype.name in ("variant", "resource") else _traced_bytes(t)


def loop_trips(while_op: Any) -> int | None:
    """How many iterations a ``While`` op runs, where its condition compares
    a loop variable that starts at a constant and grows by a constant with
    a constant bound (``i < n``: ``keras.ops.fori_loop``, ``keras.ops.scan``
    over a tensor of known length, a ``for`` over a ``range``; ``i >= 0``
    counting down: a reversed scan), or its
    ``maximum_iterations`` is a constant; the fewest of these; None where
    none is found."""
    import tensorflow as tf

    cond = getattr(while_op, "_cond_graph", None)
    body = getattr(while_op, "_body_graph", None)
    if cond is None or body is None:
        return None
    position = {t.name: i for i, t in enumerate(cond.inputs)}

    def static(t: Any) -> int | None:
        t = _past_identities(t)
        j = position.get(t.name)
        if j is not None:  # a loop invariant bound: its value entering the loop
            if j >= len(body.outputs) or \
                    _past_identities(body.outputs[j]).name != body.inputs[j].name:
                return None
            t = while_op.inputs[j]
        value = _static_value(t)
        return None if value is None or getattr(value, "shape", ()) != () else int(value)

    def counter(t: Any) -> tuple[int, int] | None:
        """(start, step) of a loop variable that grows or shrinks by a
        constant."""
        j = position.get(_past_identities(t).name)
        if j is None or j >= len(body.outputs):
            return None
        start = _static_value(while_op.inputs[j])
        grow = _past_identities(body.outputs[j]).op
        if start is None or grow.type not in ("AddV2", "Add", "Sub") or len(grow.inputs) != 2:
            return None
        mine = [k for k, x in enumerate(grow.inputs)
                if _past_identities(x).name == body.inputs[j].name]
        if len(mine) != 1 or (grow.type == "Sub" and mine[0] != 0):
            return None
        step = tf.get_static_value(grow.inputs[1 - mine[0]])
        if step is None or getattr(step, "shape", ()) != () or int(step) == 0:
            return None
        return int(start), int(step) * (-1 if grow.type == "Sub" else 1)

    found = []
    for op in cond.get_operations():
        if op.type not in ("Less", "LessEqual", "Greater", "GreaterEqual") \
                or len(op.inputs) != 2:
            continue
        var, bound = counter(op.inputs[0]), static(op.inputs[1])
        if var is None or bound is None:
            continue
        start, step = var
        closed = 1 if op.type.endswith("Equal") else 0
        if op.type.startswith("Less") and step > 0:  # counting up to a bound
            found.append(max(0, -(-(bound - start + closed) // step)))
        elif op.type.startswith("Greater") and step < 0:  # counting down (a reversed scan)
            found.append(max(0, -(-(start - bound + closed) // -step)))
    limit = _static_value(while_op.inputs[1]) if len(while_op.inputs) > 1 else None
    if limit is not None and getattr(limit, "shape", ()) == () and int(limit) >= 0:
        found.append(int(limit))  # maximum_iterations
    return min(found) if found else None


def _static_value(t: Any) -> Any:
    """``tf.get_static_value``, and one element of a constant vector (a
    dimension of a known shape: ``tf.shape(x)[0]``), and a sum or difference
    of two such (``tf.shape(x)[0] - 1``: where a reversed scan starts)."""
    import tensorflow as tf

    value = tf.get_static_value(t)
    if value is None and t.op.type in ("AddV2", "Add", "Sub") and len(t.op.inputs) == 2:
        a, b = (_static_value(x) for x in t.op.inputs)
        if a is not None and b is not None and getattr(a, "shape", ()) == () \
                and getattr(b, "shape", ()) == ():
            return int(a) - int(b) if t.op.type == "Sub" else int(a) + int(b)
    if value is None and t.op.type == "StridedSlice":
        parts = [tf.get_static_value(x) for x in t.op.inputs]
        if t.op.inputs[0].op.type == "Shape" and t.op.inputs[0].op.inputs[0].shape \
                .is_fully_defined():
            parts[0] = t.op.inputs[0].op.inputs[0].shape.as_list()
        import numpy as np

        if all(p is not None and np.ndim(p) == 1 for p in parts) and len(parts[1]) == 1 \
                and t.op.get_attr("shrink_axis_mask") == 1:
            value = np.asarray(parts[0])[int(parts[1][0])]
    return value


class _Buffers:
    """Which buffers each tensor holds as a graph's ops run, and the bytes
    alive. A buffer is ``(key, kind)``: ``"one"`` a single tensor's,
    ``"all"`` one tensor of a loop body made anew at every iteration (its
    size is the iterations'), ``"last"`` the last of those and ``"prev"``
    all but the last (each inside its ``"all"`` where both are held)."""

    def __init__(self, trips_of: dict[str, int], constant: Collection[str] = (),
                 upcast: Collection[str] = ()) -> None:
        self.size: dict[tuple[str, str], int] = {}
        #: how many allocations a buffer is (a list's elements are each one)
        self.pieces: dict[tuple[str, str], int] = {}
        #: a list's bytes and allocations when it was made (what a loop
        #: nested in a body hands the outer loop's lists per iteration)
        self.made: dict[str, tuple[int, int]] = {}
        self.holds: dict[str, frozenset[tuple[str, str]]] = {}
        self.readers: dict[str, int] = {}
        self.pinned: set[str] = set()
        self.trips_of = trips_of
        self.constant = set(constant)
        #: the types whose matrix products run on float32 copies (``matmul_upcast``)
        self.upcast = tuple(upcast)
        #: an op that grappler merges into one that ran before it -> that
        #: op's outputs (:meth:`count_readers`)
        self.merged: dict[str, list[str]] = {}
        self.peak = 0
        #: the buffers alive at the peak (with one loop iteration's
        #: temporaries beside them where a loop reaches it: their bytes)
        self.at_peak: tuple[set[tuple[str, str]], int] = (set(), 0)

    # -- what is alive ----------------------------------------------------
    def alive(self) -> set[tuple[str, str]]:
        held: set[tuple[str, str]] = set()
        for name, bufs in self.holds.items():
            if self.readers.get(name, 0) > 0 or name in self.pinned:
                held |= bufs
        return held

    def counted(self, bufs: Collection[tuple[str, str]]) -> list[tuple[str, str]]:
        """``bufs`` without a loop's last value, or all values but its last,
        where all its values are there."""
        bufs = set(bufs)
        return [b for b in bufs if not (b[1] in ("last", "prev") and (b[0], "all") in bufs)]

    def bytes_of(self, bufs: Collection[tuple[str, str]]) -> int:
        return sum(self.size.get(b, 0) for b in self.counted(bufs))

    def pieces_of(self, bufs: Collection[tuple[str, str]]) -> int:
        return sum(self.pieces.get(b, 1) for b in self.counted(bufs) if self.size.get(b, 0))

    def live(self) -> int:
        return self.bytes_of(self.alive())

    def new(self, key: str, nbytes: int, kind: str = "one",
            pieces: int = 1) -> frozenset[tuple[str, str]]:
        self.size[(key, kind)] = nbytes
        self.pieces[(key, kind)] = max(1, pieces)
        return frozenset({(key, kind)})

    # -- running ops ------------------------------------------------------
    def count_readers(self, ops: Sequence[Any]) -> None:
        """Count each tensor's readers among ``ops`` (which run in this
        order), and find the ops grappler's ``dedup_computations`` merges
        into an earlier one of the same type, attributes and inputs (equal
        constants alike): such an op runs as a read of the earlier one's
        outputs, which its own readers then read. The gradient of a reversed
        scan's two stacked outputs, added together, makes a list of the same
        upstream gradient twice; the allocator trace holds one (96
        allocations of 64 KiB, not 192)."""
        import tensorflow as tf

        first: dict[tuple[Any, ...], list[str]] = {}
        alias: dict[str, str] = {}

        def ident(t: Any) -> Any:
            if t.op.type == "Const":
                value = tf.get_static_value(t)
                if value is not None:
                    return ("const", t.dtype.name, tuple(t.shape.as_list()), value.tobytes())
            return alias.get(t.name, t.name)

        for op in ops:
            if not (op.type in _NOTHING or op.type in WHILE_OPS or op.type in _BRANCHES
                    or op.type == "Placeholder" or op._is_stateful or not op.outputs):
                attrs = tuple(sorted((k, v.SerializeToString(deterministic=True))
                                     for k, v in op.node_def.attr.items()))
                key = (op.type, attrs, tuple(ident(t) for t in op.inputs))
                if key in first:
                    self.merged[op.name] = first[key]
                    for t, n in zip(op.outputs, first[key]):
                        alias[t.name] = n  # (an op merged into is never merged itself)
                        self.readers[n] = self.readers.get(n, 0) + 1
                    continue
                first[key] = [t.name for t in op.outputs]
            if op.type in _SHAPE_ONLY:
                continue
            for t in op.inputs:
                self.readers[t.name] = self.readers.get(t.name, 0) + 1

    def run(self, ops: Sequence[Any]) -> None:
        for op in ops:
            self.step(op)

    def reached(self, extra: int = 0, alive: set[tuple[str, str]] | None = None) -> None:
        """Note the bytes alive now, and ``extra`` beside them, as the peak
        where they are higher."""
        alive = self.alive() if alive is None else alive
        reached = self.bytes_of(alive) + extra
        if reached > self.peak:
            self.peak, self.at_peak = reached, (alive, extra)

    def step(self, op: Any) -> None:
        if op.type == "Placeholder":
            return  # an argument: what it holds was given
        if op.type in _BRANCHES:
            # (what a branch holds is not followed here: the layer's rule,
            # or the fallback, costs it)
            raise NotImplementedError(f"{op.name}: a conditional")
        if op.name in self.merged:
            # (grappler's: this op's outputs are the earlier op's)
            same = self.merged[op.name]
            for t, n in zip(op.outputs, same):
                self.holds[t.name] = self.holds.get(n, frozenset())
                self.readers[n] = self.readers.get(n, 0) - 1
            self._let_go((*(t.name for t in op.outputs), *same))
            return
        before = self.alive()
        extra = 0
        if op.type in WHILE_OPS:
            outs, extra, first = self._loop(op)
            self.reached(first, before)
        else:
            outs = [self._result(op, i, t) for i, t in enumerate(op.outputs)]
        for t, bufs in zip(op.outputs, outs):
            self.holds[t.name] = bufs
            if t.dtype.name == "variant":
                self.made[t.name] = (self.bytes_of(bufs), self.pieces_of(bufs))
        if op.type not in WHILE_OPS:
            self.reached(self._upcast_bytes(op))
        if op.type not in _SHAPE_ONLY:
            for t in op.inputs:
                self.readers[t.name] = self.readers.get(t.name, 0) - 1
        # (a result nobody reads, an input read last)
        self._let_go(t.name for t in (*op.outputs, *op.inputs))
        if op.type in WHILE_OPS:
            # the last iteration runs with the lists full and its loop
            # variables' previous values alive beside its own temporaries
            self.reached(extra)

    def _let_go(self, names: Iterable[str]) -> None:
        """Drop what the tensors ``names`` hold where nobody reads them any
        more and they are not pinned."""
        for n in names:
            if self.readers.get(n, 0) <= 0 and n not in self.pinned:
                self.holds.pop(n, None)

    def _upcast_bytes(self, op: Any) -> int:
        """The float32 copies a matrix product of a type in ``upcast`` holds
        while it runs, beside its result (``ir.upcast_bytes``; an allocator
        trace of a bfloat16 loop body on a CPU without bfloat16 instructions:
        2, 4 and 2 MiB after each 1 MiB product of 512 x 1024 by 1024 x
        1024)."""
        if op.type not in _MATMUL_OPS or len(op.inputs) != 2 \
                or op.outputs[0].dtype.name not in self.upcast:
            return 0
        return upcast_bytes(*(_elements(t) for t in (*op.inputs, op.outputs[0])))

    def _held(self, t: Any) -> frozenset[tuple[str, str]]:
        return self.holds.get(t.name, frozenset())

    def _result(self, op: Any, i: int, t: Any) -> frozenset[tuple[str, str]]:
        if t.name in self.constant and t.dtype.name != "variant":
            return frozenset()
        if op.type in _NOTHING:
            return frozenset()
        if op.type in _VIEWS and op.inputs:
            return self._held(op.inputs[0])
        if op.type in ("StridedSlice", "Slice", "Split") and _slice_is_view(op):
            return self._held(op.inputs[1 if op.type == "Split" else 0])
        if op.type == "TensorListFromTensor" and op.inputs:
            # a copy of every slice along the first dimension, each its own
            # allocation (``TensorListFromTensor`` copies them aligned: the
            # allocator trace of a scan holds 128 of them after its input
            # is freed)
            x = op.inputs[0]
            rows = x.shape[0] if x.shape.rank else None
            if rows is None or not x.shape.is_fully_defined():
                return self.new(t.name, _bytes(x))
            return self.new(t.name, int(rows) * round_up(_bytes(x) // max(1, int(rows))),
                            pieces=int(rows))
        if op.type in _LIST_WRITES:
            return self._held(op.inputs[0]) | self._held(op.inputs[-1])
        if op.type == "ZerosLike" and op.inputs and op.inputs[0].dtype.name == "variant":
            # a zero tensor for every element of the list
            held = self._held(op.inputs[0])
            return self.new(t.name, self.bytes_of(held), pieces=self.pieces_of(held))
        if op.type == "AddN" and t.dtype.name == "variant":
            # lists added element by element: each element a new sum
            held = max((self._held(x) for x in op.inputs), key=self.bytes_of)
            return self.new(t.name, self.bytes_of(held), pieces=self.pieces_of(held))
        if op.type in _FORWARDING and i == 0:
            # (AddN's kernel forwards its first input only)
            for x in op.inputs[:1] if op.type == "AddN" else op.inputs:
                bufs = self._held(x)
                if (self.readers.get(x.name) == 1 and x.name not in self.pinned
                        and len(bufs) == 1 and self.bytes_of(bufs) == _bytes(t)
                        and not any(bufs & self._held_by(n) for n in self.holds
                                    if n != x.name)):
                    return bufs  # written into its input, whose last reader it is
        return self.new(t.name, _bytes(t))

    def _held_by(self, name: str) -> frozenset[tuple[str, str]]:
        if self.readers.get(name, 0) > 0 or name in self.pinned:
            return self.holds.get(name, frozenset())
        return frozenset()

    # -- a loop -------------------------------------------------------------
    def _loop(self, op: Any) -> tuple[list[frozenset[tuple[str, str]]], int, int]:
        """The buffers each output of a ``While`` op holds; the highest
        temporary bytes of one iteration, beside the lists full and the
        previous values of the loop variables (the last iteration); and the
        highest the first iteration adds."""
        trips = self.trips_of.get(op.name)
        if trips is None:
            raise NotImplementedError(f"{op.name}: iterations not known")
        body = op._body_graph
        position = {t.name: k for k, t in enumerate(body.inputs)}
        passed = {k for k, (a, b) in enumerate(zip(body.inputs, body.outputs))
                  if _past_identities(b).name == a.name}

        def element(t: Any, kind: str, seen: frozenset[str]) -> frozenset[tuple[str, str]]:
            """The buffers a tensor of the body written into a list holds."""
            r = view_root(t)
            if r.name in seen:
                return frozenset()
            seen = seen | {r.name}
            k = position.get(r.name)
            if k is not None:
                if k in passed or k >= len(body.outputs):
                    return self._held(op.inputs[k])  # an invariant: its own buffers
                # the previous iteration's value of a loop variable: the value
                # the loop started from, then what each iteration but the
                # last made (a nested loop pushes the outer loop's state as
                # its first input, the buffer the outer loop pushes too)
                made = element(body.outputs[k], kind, seen)
                if kind != "all":
                    return made
                return self._held(op.inputs[k]) | frozenset(
                    (key, "prev") if part == "all" else (key, part) for key, part in made)
            if r.op.type == "TensorListGetItem":
                lst = _past_identities(r.op.inputs[0])
                k = position.get(lst.name)
                if k is not None and (k in passed or k >= len(body.outputs)):
                    return self._held(op.inputs[k])  # an element of an invariant list
                if k is not None:  # an element of a list the body writes
                    return frozenset().union(*[element(e, kind, seen) for e, _ in
                                               _writes(body.outputs[k], body.inputs[k])
                                               if e is not None])
                return frozenset()
            if r.op.type in ("Const", "ReadVariableOp") or r.name in body_constant:
                return frozenset()
            n = round_up(_bytes(r))  # (each iteration's its own allocation)
            each = 1
            if r.dtype.name == "variant":  # a list a nested loop made: its elements
                n, each = inner.made.get(r.name, (0, 1))
            key = f"{op.name}/{r.name}"
            if kind == "all":
                self.size[(key, "all")] = trips * n
                self.pieces[(key, "all")] = max(1, trips * each)
                self.size[(key, "prev")] = max(0, trips - 1) * n
                self.pieces[(key, "prev")] = max(1, (trips - 1) * each)
                self.size.setdefault((key, "last"), n)
                return frozenset({(key, "all")})
            self.size[(key, "last")] = n
            return frozenset({(key, "last")})

        body_constant = set(_constants(body.get_operations())[1])
        # one iteration, on its own: its temporaries (what it frees by its
        # end), and the lists a loop nested in it makes
        inner = _Buffers({**self.trips_of, **_trips(body.get_operations(), self.trips_of)},
                         body_constant, self.upcast)
        inner.pinned = {t.name for t in body.outputs}
        inner.count_readers(body.get_operations())
        inner.run(body.get_operations())
        outs: list[frozenset[tuple[str, str]]] = []
        for j, t in enumerate(op.outputs):
            if j in passed:
                outs.append(self._held(op.inputs[j]))
                continue
            src = body.outputs[j]
            if t.dtype.name != "variant":
                outs.append(element(src, "last", frozenset()))
                continue
            bufs: frozenset[tuple[str, str]] = frozenset()
            inherited = False
            added = False
            for e, kind in _writes(src, body.inputs[j]):
                if kind == "sum":
                    added = True
                elif e is None:
                    inherited = True
                else:
                    bufs |= element(e, kind, frozenset())
            if added:
                # element-wise sums: each replaces the element it adds to
                held = max(bufs, self._held(op.inputs[j]), key=self.bytes_of)
                bufs = self.new(f"{op.name}:{j}", self.bytes_of(held),
                                pieces=self.pieces_of(held))
            elif inherited:
                bufs |= self._held(op.inputs[j])
            outs.append(bufs)
        first = inner.peak
        temporary = max(0, inner.peak - inner.live())
        # the previous values of the loop variables the body makes anew
        previous = sum(self.size.get(b, 0) for j, bufs in enumerate(outs)
                       if j not in passed and op.outputs[j].dtype.name != "variant"
                       for b in bufs if b[1] == "last")
        return outs, temporary + previous, first


def _writes(t: Any, start: Any) -> list[tuple[Any, str]]:
    """What a loop body writes into the list ``t`` it returns for the list
    ``start`` it was given: ``(element, kind)`` pairs, ``kind`` ``"all"``
    (an element per iteration: pushed, or set at a varying index) or
    ``"last"`` (set at a constant index: replaced at every iteration),
    ``(None, "")`` where the list given is written into, ``(None, "sum")``
    where lists are added (a gradient list)."""
    import tensorflow as tf

    found: list[tuple[Any, str]] = []
    stack = [t]
    seen: set[str] = set()
    while stack:
        x = _past_identities(stack.pop())
        if x.name in seen:
            continue
        seen.add(x.name)
        if x.name == start.name:
            found.append((None, ""))
        elif x.op.type == "TensorListPushBack":
            found.append((x.op.inputs[1], "all"))
            stack.append(x.op.inputs[0])
        elif x.op.type == "TensorListSetItem":
            fixed = tf.get_static_value(x.op.inputs[1]) is not None
            found.append((x.op.inputs[2], "last" if fixed else "all"))
            stack.append(x.op.inputs[0])
        elif x.op.type == "AddN":
            found.append((None, "sum"))
            stack.extend(x.op.inputs)
    return found


def _trips(ops: Sequence[Any], known: dict[str, int]) -> dict[str, int]:
    """Iterations of every ``While`` op among ``ops``: read off its
    condition, or, for a gradient loop, those of the loop it is the gradient
    of (``<forward>_grad``)."""
    trips: dict[str, int] = {}
    for op in ops:
        if op.type not in WHILE_OPS:
            continue
        n = loop_trips(op)
        if n is None:
            tail = op.name.rsplit("/", 1)[-1]
            for name, m in {**known, **trips}.items():
                if tail == name.rsplit("/", 1)[-1] + "_grad" or op.name.endswith(name + "_grad"):
                    n = m
                    break
        if n is not None:
            trips[op.name] = n
    return trips


#: element-wise kernels (and their gradients) that write into an input
_FORWARDING = FORWARDING_OPS | FORWARDING_GRAD_OPS


#: iterations TensorFlow's ``tf.while_loop`` runs at once unless told
PARALLEL_ITERATIONS = 10


def loop_backlog(loop: Any, trips: int) -> list[int]:
    """What a gradient loop holds beyond one iteration when it runs ahead of
    the sums it carries: each iteration's partials (what its body adds into
    a loop variable: a kernel's partial gradient, a dynamic slice's gradient
    padded to its input) for every iteration it may run ahead, up to the
    loop's ``parallel_iterations`` (TensorFlow runs iterations side by side
    where they do not wait for each other: the allocator trace of a loop
    summing eight chunks' gradients holds several iterations' 2 MiB slice
    gradients at once)."""
    body = getattr(loop, "_body_graph", None)
    if body is None:
        return []
    partials: list[int] = []
    for j, out in enumerate(body.outputs):
        src = _past_identities(out)
        if (j >= len(body.inputs) or src.name == body.inputs[j].name
                or not src.dtype.is_floating or src.op.type not in ("AddN", "AddV2", "Add")):
            continue
        mine = [x for x in src.op.inputs if _past_identities(x).name == body.inputs[j].name]
        if mine:
            partials += [round_up(_bytes(x)) for x in src.op.inputs
                         if _past_identities(x).name != body.inputs[j].name and _bytes(x)]
    try:
        at_once = int(loop.get_attr("parallel_iterations"))
    except (ValueError, TypeError):
        at_once = PARALLEL_ITERATIONS
    return partials * max(0, min(trips, at_once) - 1)


def _macs(ops: Sequence[Any], trips: dict[str, int]) -> int:
    """Multiply-accumulates of ``ops``, a loop's body's as many times as it
    runs."""
    total = 0
    for op in ops:
        if op.type in WHILE_OPS and op.name in trips:
            body = op._body_graph.get_operations()
            total += trips[op.name] * _macs(body, {**trips, **_trips(body, trips)})
        else:
            total += _op_macs(op)
    return total


def loop_layer_prim(name: str, forward: Sequence[Any], backward: Sequence[Any],
                    inputs: Sequence[Any], refs: dict[str, str], outputs: Sequence[Any],
                    gradients: Sequence[Any], weights: Sequence[str],
                    differentiable: Sequence[str], upcast: Collection[str] = ()) -> list[Prim]:
    """One prim for a layer call that runs loops of its own, from its graph:
    ``forward`` and ``backward`` ops in the order they run, its ``inputs``
    (placeholders, named by ``refs``), the ``weights`` it reads, its
    ``outputs`` and the gradients it returns (``gradients``), of which
    those of ``differentiable`` reach the schedule (its multiply-accumulates:
    the forward ops', a loop's body's once per iteration). The prim's outputs
    are the call's, and one more: what the forward pass leaves held for the
    gradient beyond the call's inputs and outputs, saved with the inputs and
    outputs the gradient reads. Its forward workspace is the highest the
    forward ops reach beyond those; its backward workspace, the highest the
    gradient ops reach beyond what was held before them and the gradients
    they return; its ``backlog_parts``, what its gradient loops hold when
    they run ahead of their sums (:func:`loop_backlog`). A matrix product
    of a type in ``upcast`` (the device computes it in float32: its
    ``DeviceProfile.upcast_dtypes``) holds float32 copies of its operands
    and result while it runs."""
    ops = list(forward) + list(backward)
    trips = _trips(ops, {})
    # the zeros a gradient loop starts its sums from are made at every step
    # (allocator trace: a fixed-point loop's kernel-sized zeros), unlike the
    # other constants, which grappler folds and holds between steps
    constant = set(_constants(ops)[1]) - {t.name for op in backward if op.type in WHILE_OPS
                                          for t in op.inputs}
    sim = _Buffers(trips, constant, upcast)
    for i, t in enumerate(inputs):
        sim.holds[t.name] = sim.new(f"in:{i}", 0)
    out_names = [t.name for t in outputs]
    sim.pinned = set(out_names) | {t.name for t in inputs}
    sim.count_readers(ops)
    sim.run(forward)
    # what is held for the gradient: buffers of the tensors a gradient op reads
    for_gradient: set[tuple[str, str]] = set()
    for n, bufs in sim.holds.items():
        if sim.readers.get(n, 0) > 0:
            for_gradient |= bufs
    out_bufs = set().union(*[sim.holds.get(n, frozenset()) for n in out_names])
    out_bytes = sim.bytes_of(out_bufs)
    kept = for_gradient - out_bufs - {b for b in for_gradient if b[0].startswith("in:")}
    kept_bytes = sim.bytes_of(kept | out_bufs) - out_bytes
    kept_pieces = sim.pieces_of(kept | out_bufs) - sim.pieces_of(out_bufs)
    forward_ws = max(0, sim.peak - out_bytes - kept_bytes)
    # (as many allocations as the buffers beyond those at the peak are)
    beyond, loop_extra = sim.at_peak
    forward_pieces = sim.pieces_of(set(sim.counted(beyond)) - kept - out_bufs) \
        + (1 if loop_extra else 0)
    saved = [refs[t.name] for i, t in enumerate(inputs) if (f"in:{i}", "one") in for_gradient
             and t.name in refs]
    saved += [f"out{i}" for i, n in enumerate(out_names)
              if sim.holds.get(n, frozenset()) & for_gradient]
    # the gradient
    sim.pinned = {t.name for t in gradients} | {t.name for t in inputs}
    start = sim.live()
    sim.peak, sim.at_peak = start, (sim.alive(), 0)
    sim.run(backward)
    grad_bufs = set().union(*[sim.holds.get(t.name, frozenset()) for t in gradients])
    backward_ws = max(0, sim.peak - start - sim.bytes_of(grad_bufs))
    beyond, loop_extra = sim.at_peak
    parts: list[int] = []
    for b in sim.counted(set(beyond) - grad_bufs - kept - out_bufs):
        n, k = sim.size.get(b, 0), sim.pieces.get(b, 1)
        parts += [n // k] * k if n else []
    parts += [loop_extra] if loop_extra else []
    if backward_ws and sum(parts) != backward_ws:
        parts = []  # (what was held before it let go of some: one block)
    backlog = [n for op in backward if op.type in WHILE_OPS and op.name in trips
               for n in loop_backlog(op, trips[op.name])]
    outs = [(f"out{i}", _bytes(t)) for i, t in enumerate(outputs)]
    if kept_bytes:
        outs.append(("t0", kept_bytes))
        saved.append("t0")
    return [prim(name, [refs[t.name] for t in inputs if t.name in refs] + list(weights),
                 outs, save=list(dict.fromkeys(saved)),
                 differentiable=list(differentiable),
                 forward_workspace_bytes=forward_ws,
                 forward_workspace_pieces=max(1, forward_pieces) if forward_ws else 1,
                 backward_workspace_bytes=backward_ws,
                 backward_workspace_parts=tuple(parts) if backward_ws and len(parts) > 1 else (),
                 output_pieces=[("t0", kept_pieces)] if kept_bytes and kept_pieces > 1 else [],
                 backlog_parts=backlog,
                 macs=_macs(forward, trips))]
