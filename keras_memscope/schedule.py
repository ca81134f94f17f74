"""One training step as allocations and frees: liveness and the peak.

The simulator runs the prims of every layer call in forward order, a loss, then
the gradients in reverse order and the optimizer updates, keeping each tensor
alive exactly as long as something still needs it:

* a forward tensor lives until its last consumer has run, or until the
  backward pass of every op that saved it;
* an element-wise op takes over its input's buffer when nothing else holds it
  (TensorFlow's buffer forwarding), a reshape is a view;
* the gradient of a tensor read by several ops is summed once all parts exist;
* a weight's gradient lives until the optimizer has applied it; updates run
  ``update_lag`` gradients behind the backward pass (the executor runs them
  beside the next layer's gradient), each with its own temporaries.

Every allocation is rounded up to the allocator granule. The result is the
peak of live bytes, what is alive at that moment, and a timeline.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Collection, Sequence
from typing import Any

from .allocator import BFCModel, ExactModel
from .allocator import make as make_allocator
from .ir import LayerOp, Prim
from .records import Holder, TimelinePoint
from .units import round_up

INF = float("inf")

_OUT_REF = re.compile(r"^out\d+$")

PERSISTENT = "persistent"
ACTIVATION = "activation"
GRADIENT = "gradient"
WORKSPACE = "workspace"
UPDATE = "optimizer update"


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """What the loss keeps per model output: bytes saved for its gradient,
    the loss's forward temporaries beyond them, and, where its graph was
    traced (``tfgraph.trace_loss``), the output gradient's bytes, whether it
    is written into a saved tensor, and the gradient's temporaries beyond
    the saved tensors and itself. Without a gradient size the saved tensor
    becomes the output's gradient."""

    saved_bytes: int
    workspace_bytes: int = 0
    gradient_bytes: int = 0
    backward_bytes: int = 0
    gradient_in_saved: bool = True
    #: the output's own buffer is taken by the tensor its gradient is written
    #: into (a cross-entropy on logits), where nothing else reads the output
    output_reused: bool = False
    #: ``(key, bytes)`` of the constants grappler folds the loss's graph into,
    #: held between steps (``tfgraph.folded_constants``)
    constants: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class PrimCost:
    """The work of one prim: FLOPs and bytes moved, forward and backward.

    Backward FLOPs are split into the gradients with respect to activations
    (``input``) and to weights (``weight``); a prim with multiply-accumulates
    costs ``2 x macs`` FLOPs per wanted gradient, an element-wise prim its
    forward FLOPs per wanted gradient.
    """

    layer_index: int
    forward_flops: int
    forward_bytes: int
    backward_input_flops: int
    backward_weight_flops: int
    backward_bytes: int
    macs: int
    kernel: str = ""
    gemm_min_dim: int = 0
    recomputed: bool = False
    #: the sizes of the new buffers its kernels write (outputs that cannot
    #: take over an input's buffer), forward and backward
    forward_allocs: tuple[int, ...] = ()
    backward_allocs: tuple[int, ...] = ()
    #: a convolution's output channels (0 for other prims)
    out_channels: int = 0
    #: the bytes its input and weight gradients' kernels read transposed
    #: (``Prim.transposed_reads``)
    backward_input_transposed: int = 0
    backward_weight_transposed: int = 0
    #: the bytes of their operands those kernels read (``Prim.operand_reads``)
    backward_input_reads: int = 0
    backward_weight_reads: int = 0
    #: a 2-D convolution's ``(batch, image, filter_total, out_channels)``
    #: (``Prim.conv_gemm``)
    conv_gemm: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What the simulation found (bytes above ``baseline_bytes`` unless said)."""

    baseline_bytes: int
    peak_bytes: int  # what the allocator counts at the peak, persistent included
    peak_phase: str
    activations_bytes: int
    gradients_bytes: int
    workspace_bytes: int
    allocator_bytes: int
    saved_activations_bytes: int
    layer_saved_bytes: dict[int, int]
    layer_workspace_bytes: dict[int, int]
    timeline: tuple[TimelinePoint, ...]
    holders: tuple[Holder, ...]
    costs: tuple[PrimCost, ...] = ()
    allocated_bytes: int = 0  # every allocation of the measured step, summed
    #: keys of the weights whose updates write into copies (with
    #: ``TIMED_COPIES``, those of the highest step)
    copied_weights: frozenset[int] = frozenset()
    #: the zeros constants gradient accumulators are reset to (in ``baseline_bytes``)
    accumulator_zeros_bytes: int = 0
    #: of ``baseline_bytes``, what is not held at the peak (accumulators reset
    #: to their zeros constant before it)
    released_bytes: int = 0
    #: grappler's folded constants held between steps (in ``baseline_bytes``)
    constants_bytes: int = 0
    #: what the allocator counts in use between two measured steps (the
    #: lowest before one), chunks included: ``baseline_bytes`` as the
    #: allocator holds it
    held_bytes: int = 0


def folded_constants(ops: Sequence[LayerOp],
                     losses: Sequence[LossSpec]) -> dict[str, tuple[int, str]]:
    """Each distinct folded constant of the layer calls and the losses, in the
    order first met (``LayerOp.constants``, ``LossSpec.constants``): its
    bytes and where it was met (the call's name, or "the loss's gradient")."""
    found: dict[str, tuple[int, str]] = {}
    for where, constants in (*((op.name, op.constants) for op in ops),
                             *(("the loss's gradient", loss.constants) for loss in losses)):
        for key, nbytes in constants:
            found.setdefault(key, (nbytes, where))
    return found


@dataclasses.dataclass
class _Buffer:
    nbytes: int
    layer: str
    kind: str
    live_tensors: int = 0
    pieces: int = 1


@dataclasses.dataclass
class _Job:
    """A prim's weight gradients on the second stream: what they hold and when
    they run (seconds from the start of the backward pass; ``INF`` until
    :func:`_share` gives the job a thread and runs it to its end)."""

    flat: _Flat
    weights: list[int]
    out_grads: list[int]
    start: float
    end: float
    workspace: int | None = None
    started: bool = False
    left: float = 0.0  # seconds of work still to do at the full machine's speed


@dataclasses.dataclass
class _Flat:
    op: LayerOp
    prim: Prim
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    grad_ins: tuple[int, ...]
    needs_backward: bool = False
    saved: tuple[int, ...] = ()
    input_grads: tuple[int, ...] = ()
    weight_reads: tuple[int, ...] = ()  # weights its input gradient reads
    sparse: tuple[int, ...] = ()  # weights whose gradient is IndexedSlices


class _Simulator:
    """Live buffers on top of an allocator model; records the peak."""

    def __init__(self, allocator: ExactModel | BFCModel) -> None:
        self.allocator = allocator
        self.peak = 0
        self.peak_phase = "forward"
        self.peak_snapshot: dict[tuple[str, str], int] = {}
        self.buffers: dict[int, _Buffer] = {}
        self.handles: dict[int, list[int]] = {}
        self.next_buffer = 0
        self.timeline: list[TimelinePoint] = []
        self.recording = False
        self.event_high = 0
        self.allocated = 0

    @property
    def live(self) -> int:
        return self.allocator.in_use

    def alloc(self, nbytes: int, layer: str, kind: str, pieces: int = 1,
              sizes: Sequence[int] = ()) -> int:
        """One buffer, made of ``pieces`` equal allocations (a loop's per-step
        tensors are many small allocations, not one large one), or of
        allocations of the given ``sizes``."""
        pieces = max(1, pieces)
        if not sizes:
            sizes = [-(-nbytes // pieces)] * pieces
        handles = [self.allocator.alloc(n)[0] for n in sizes]
        total = sum(round_up(n) for n in sizes)
        if self.recording:
            self.allocated += total
        bid = self.next_buffer
        self.next_buffer += 1
        self.buffers[bid] = _Buffer(total, layer, kind, pieces=len(sizes))
        self.handles[bid] = handles
        return bid

    def free(self, bid: int) -> None:
        buf = self.buffers.pop(bid, None)
        if buf is not None:
            for handle in self.handles.pop(bid):
                self.allocator.free(handle)

    def check(self, phase: str) -> None:
        self.event_high = max(self.event_high, self.live)
        if self.recording and self.live > self.peak:
            self.peak = self.live
            self.peak_phase = phase
            snap: dict[tuple[str, str], int] = defaultdict(int)
            for buf in self.buffers.values():
                snap[(buf.layer, buf.kind)] += buf.nbytes
            self.peak_snapshot = dict(snap)

    def point(self, phase: str, layer: str, event: str) -> None:
        if self.recording:
            self.timeline.append(TimelinePoint(
                len(self.timeline), phase, layer, event, self.live,
                max(self.event_high, self.live)))
        self.event_high = self.live


#: the prims grappler's arithmetic optimizer gathers into one AddN
_ADDITIONS = frozenset({"AddV2", "Add", "add"})
#: The prims whose gradient for each input of the output's shape is handed
#: on as the output gradient's own buffer (TensorFlow's ``_AddGrad``: a sum
#: over no axes and a reshape to the same shape, both of which hand on their
#: input). Empty: each further input's gradient gets a buffer of its own.
#: Tried with the additions and AddN (``benchmarks.ordering_variants
#: --variants add-pass-through``) and not adopted: benchmarks/RESULTS.md,
#: "Models nobody had estimated (``--unheard``)" and "A broadcast product's
#: gradient at full size".
PASS_THROUGH_GRADIENTS: frozenset[str] = frozenset()
#: Whether a prim whose gradient ops read its output gradient together
#: (``Prim.grad_read_together``) writes no input gradient into it while the
#: CPU's second thread is free, as TensorFlow runs the two ops side by side
#: then. False: such a prim writes into it as any element-wise gradient
#: does. Tried (``benchmarks.ordering_variants --variants read-together``)
#: and not adopted: benchmarks/RESULTS.md, "A product's two gradients side
#: by side (tried, not adopted)".
SIDE_BY_SIDE_GRADIENTS = False
#: With :data:`SIDE_BY_SIDE_GRADIENTS`, whether an optimizer update that
#: runs during the backward pass also holds the second thread, for
#: ``update_time`` seconds from when its gradient is written (an allocator
#: trace of the GELU MLP under RematScope: Adam's ``Square``, ``Sqrt`` and
#: ``Mul`` of an earlier layer made between the recomputed GELU's tensors).
#: Tried (``benchmarks.ordering_variants --variants read-together
#: update-busy``) and not adopted: benchmarks/RESULTS.md, "A product's two
#: gradients side by side (tried, not adopted)".
UPDATES_HOLD_THE_THREAD = False
#: The kernels whose weight gradient starts at once when the CPU's second
#: thread is busy, its input gradient waiting for the first thread to come
#: free. Such a kernel's weight gradient is an op of its own, made after the
#: input gradient's by TensorFlow's gradient function (``_Conv2DGrad``,
#: ``_MatMulGrad``), both reading the output gradient, and the executor runs
#: the last of the ops an op makes ready on its own thread and queues the
#: others. Profiled (``benchmarks.op_timeline``): ResNet-50's
#: ``conv5_block1_2_conv`` filter gradient started 2.3 ms before its input
#: gradient, on the thread that ran the BatchNormalization gradient before
#: it, and the Adam update of its kernel wrote a copy before the input
#: gradient ended; a transposed convolution's filter gradient started on the
#: thread that ran ``MaxPoolGrad``, its input gradient on the other after
#: ``BiasAddGrad``. Empty: the input gradient goes first and the weight
#: gradient waits for the second thread. Tried with ``{"conv",
#: "conv_transpose", "matmul"}`` (``benchmarks.ordering_variants --variants
#: weight-gradient-first``) and not adopted: benchmarks/RESULTS.md, "Weight
#: copies, the weight gradient first and six simulated steps". The rule
#: where the executor's own order is not read (``simulate``'s
#: ``weight_first`` None); where it is, that order decides, call by call
#: (``executor.weight_gradient_first``: "Which of a layer's two gradients
#: runs first").
WEIGHT_GRADIENT_FIRST: frozenset[str] = frozenset()
#: Whether a matrix product of two activations (attention's ``scores =
#: q k^T`` and ``probs v``) computes its two input gradients side by side,
#: the second on the CPU's second thread as a weight gradient is: both
#: products become ready together when the output gradient is written, the
#: executor runs one and queues the other, and the next op on the chain
#: starts when its own product ends, while the other still reads what it
#: reads. An allocator trace of a 256-position attention (``axialattn``,
#: b32): when ``probs v``'s gradient for ``v`` ends after the one for
#: ``probs``, the softmax's gradient cannot write into ``probs`` (still
#: read) and a 32 MiB tensor more is alive at the step's peak (137.2-137.3
#: MiB in three measured steps, against 108.1 in the warm-up step, where
#: it ended first). The one whose input comes first in the forward pass
#: (its gradient is needed last) runs on the second thread. Which ends
#: first is a matter of the two products' own speeds: on TensorFlow's own
#: kernels the gradient for ``v`` reads the 32 MiB ``probs`` and takes about
#: twice as long as the one for ``probs``, which writes 32 MiB
#: (``benchmarks.matmul_forms``: 8.7-10.9 against 4.2-5.2 ms), what the
#: ordering speeds' ``gemm_read`` rate gives them. None (the default): side
#: by side where the speeds that order the two threads have that rate
#: (``timing.ordering_profile``: TensorFlow's own CPU kernels), one after the
#: other on the first thread elsewhere (oneDNN's kernels, where the two
#: products take about one time, 2.2-4.3 ms, and side by side was tried and
#: not adopted: benchmarks/RESULTS.md, "Two activations' product: its
#: gradients side by side"); True or False: always, never (``benchmarks.
#: ordering_variants --variants products-side-by-side`` sets True).
PRODUCT_GRADIENTS_SIDE_BY_SIDE: bool | None = None
#: Whether the simulated times decide which updates write their weight into
#: a copy (those whose gradient and update end before the last input
#: gradient reading the weight). False: every such update copies. Tried
#: (``--variants timed-copies``) and not adopted, as above.
TIMED_COPIES = False
#: Whether an optimizer update made while the step goes on takes time: for
#: its simulated seconds (``update_time``, from when its gradient is
#: written, or when the update before it ends: one runs at a time) its
#: gradient and one variable-sized temporary stay alive beside what the
#: step allocates meanwhile, the last gradients and the updates after it
#: included (an allocator trace of the gated MLP, b8 Adam: the
#: second kernel's gradient and Adam's ``Square_3`` alive when the first
#: kernel's 16 MiB gradient is made, and that kernel's update beside them,
#: 160.5 MiB in use). False: an update's temporaries come and go at once.
#: Tried (``benchmarks.ordering_variants --variants updates-take-time``) and
#: not adopted: benchmarks/RESULTS.md, "An update that takes time".
UPDATES_TAKE_TIME = False
#: Whether an element-wise prim without weights writes an input gradient
#: into a tensor it saved for its gradient when nothing else reads that
#: tensor any more (TensorFlow's kernels forward an input whose buffer has
#: no other reader: an allocator trace of FNet b128 makes no new 32 MiB
#: buffer in the GELU's gradient). False: only the output gradient's buffer
#: is taken over, and the GELU's second product gets one of its own, as an
#: allocator trace of a smaller GELU network shows. Tried (``--variants
#: saved-inputs-donate``) and not adopted: benchmarks/RESULTS.md, "A GELU
#: gradient written into its forward tensors (tried, not adopted)".
SAVED_INPUTS_DONATE = False
#: Whether a recurrent loop's gradient is one op whose weight gradients end
#: with its input gradient (it sums them inside the loop), what the loop
#: saved going then, before the next layer's gradient starts. True mends two
#: stacked SimpleRNN (17.2 MiB -> 14.2 against 14.3 measured) and the GRUs,
#: but runs a Bidirectional layer's two loops one after the other, where
#: TensorFlow runs them side by side (bilstm b32 Adam -20.4% -> -29.9%):
#: tried (``--variants loop-gradient-one-op``), not adopted;
#: benchmarks/RESULTS.md, "Stacked recurrent layers".
LOOP_GRADIENT_ONE_OP = False
#: Whether an element-wise prim whose weight gradient is a product summed
#: down to the weight (a learned scale's ``w * x``: ``Prim.workspace_for``
#: on the weight) writes no input gradient into its output gradient: the
#: weight gradient's product reads that gradient too and runs after the input
#: gradient is made, so the buffer has two readers when the input gradient's
#: kernel looks (an allocator trace of an additive attention's ``w *
#: tanh(q + k)``, b64: the output gradient, the input gradient and the scale's
#: product, 64 MiB each, alive together).
WEIGHT_GRADIENT_READS_FIRST = True


def _handed_on(f: _Flat) -> set[int]:
    """The tensors whose gradient is ``f``'s output gradient itself
    (``Prim.grad_passes``), by id."""
    p = f.prim
    return {f.ins[p.inputs.index(r)] for r in p.grad_passes if r in p.inputs}


def _tensor_of(f: _Flat, ref: str) -> int:
    """The tensor id of ``f``'s input or output named ``ref``."""
    p = f.prim
    if ref in p.inputs:
        return f.ins[p.inputs.index(ref)]
    return f.outs[[r for r, _ in p.outputs].index(ref)]


def _addition_trees(flats: Sequence[_Flat], made: dict[int, int]) -> dict[int, set[int]]:
    """For each addition in a tree of additions of one shape (a Keras ``Add``
    of more than two inputs: each partial sum read only by the next), every
    input of its tree, by the addition's index into ``flats``. Grappler's
    arithmetic optimizer makes such a tree one ``AddN``, so none of its
    additions starts before all those inputs exist: the trace of a WaveNet
    stack frees its four skip outputs together, after the last."""
    readers: dict[int, list[int]] = defaultdict(list)
    for k, f in enumerate(flats):
        for t in dict.fromkeys(f.ins):
            readers[t].append(k)
    root = list(range(len(flats)))  # each addition's tree, by its last addition
    for k in range(len(flats) - 1, -1, -1):  # readers come after what they read
        f = flats[k]
        if f.prim.name not in _ADDITIONS or len(f.outs) != 1:
            continue
        reads = readers[f.outs[0]]
        if len(reads) == 1 and flats[reads[0]].prim.name in _ADDITIONS \
                and flats[reads[0]].prim.outputs[0][1] == f.prim.outputs[0][1]:
            root[k] = root[reads[0]]
    members: dict[int, set[int]] = defaultdict(set)
    for k, r in enumerate(root):
        members[r].add(k)
    found: dict[int, set[int]] = {}
    for ks in members.values():
        if len(ks) > 1:
            inputs = {t for k in ks for t in flats[k].ins if made.get(t) not in ks}
            found.update((k, inputs) for k in ks)
    return found


def _dependencies(flats: Sequence[_Flat], made: dict[int, int],
                  also_reads: dict[int, set[int]] | None = None
                  ) -> tuple[list[int], dict[int, list[int]]]:
    """How many ops of ``flats`` each op waits for, and the ops waiting on
    each (in ``flats``' order), by index into ``flats``; ``made`` maps a
    tensor to the op that makes it, ``also_reads`` adds tensors an op waits
    for beyond its inputs."""
    waiting: list[int] = []
    readers: dict[int, list[int]] = defaultdict(list)
    for k, f in enumerate(flats):
        reads = [*f.ins, *(also_reads or {}).get(k, ())]
        producers = dict.fromkeys(made[t] for t in reads if t in made and made[t] != k)
        waiting.append(len(producers))
        for j in producers:
            readers[j].append(k)
    return waiting, readers


def _two_threads(flats: Sequence[_Flat], seconds: Sequence[float]) -> list[int]:
    """The order in which TensorFlow's executor starts a step's forward ops
    on the CPU's two threads: an op that finishes hands the ops it makes
    ready to its own thread's queue, run last in, first out (as in
    :func:`_depth_first`); a thread with nothing queued takes the oldest op
    of the other's queue. Independent branches (the two towers of a shared
    encoder, a shortcut's convolution beside its block's first) so run side
    by side, and their outputs are made in turn: the allocator trace of a
    siamese network makes both towers' first activations before either
    tower's pooling. ``seconds`` is each op's forward time; returns indices
    into ``flats`` in start order. A sum of more than two tensors waits for
    all of them (:func:`_addition_trees`)."""
    import heapq

    made = {t: k for k, f in enumerate(flats) for t in f.outs}
    waiting, readers = _dependencies(flats, made, _addition_trees(flats, made))
    queues: list[deque[int]] = [deque(k for k in range(len(flats)) if not waiting[k]), deque()]
    queues[0].reverse()  # the first op made runs first
    running: list[tuple[float, int, int, int]] = []
    idle = [True, True]
    now, started, order = 0.0, 0, []
    while True:
        for th in (0, 1):
            if not idle[th]:
                continue
            own, other = queues[th], queues[1 - th]
            k = own.pop() if own else other.popleft() if other else None
            if k is None:
                continue
            idle[th] = False
            order.append(k)
            heapq.heappush(running, (now + seconds[k], started, th, k))
            started += 1
        if not running:
            break
        now, _, th, k = heapq.heappop(running)
        idle[th] = True
        for j in readers[k]:
            waiting[j] -= 1
            if not waiting[j]:
                queues[th].append(j)
    ran = set(order)
    return order + [k for k in range(len(flats)) if k not in ran]


def _depth_first(flats: Sequence[_Flat], index: Sequence[int]) -> list[int]:
    """The order TensorFlow's executor runs a function's ops in when one
    thread runs them all (a recomputation: the profiled step runs a region's
    recomputed ops on one thread): an op that finishes hands the ops it makes
    ready to its own thread's queue, which Eigen's thread pool runs last in,
    first out, so the consumer made last runs next, and a sibling made
    earlier waits until that chain stalls. ``flats`` are in the order the
    graph made them; returns their ``index`` values in run order.

    The trace of GELU's ``0.5 * x * erfc(-x / sqrt(2))`` recomputed: the
    ``-x`` chain runs first and ``0.5 * x`` last, written into ``x``, which
    nothing reads after it (in the forward pass's order it runs first, into a
    buffer of its own, and ``-x`` writes into ``x``)."""
    made = {t: k for k, f in enumerate(flats) for t in f.outs}
    waiting, readers = _dependencies(flats, made)
    stack = [k for k in range(len(flats)) if not waiting[k]]
    order: list[int] = []
    while stack:
        k = stack.pop()
        order.append(index[k])
        for j in readers[k]:
            waiting[j] -= 1
            if not waiting[j]:
                stack.append(j)
    return order


def _share(jobs: Sequence[_Job], clock: float, work: float, keep_waiting: int = -1) -> float:
    """Run ``work`` seconds of the input-gradient stream from ``clock``
    beside the weight-gradient ``jobs`` waiting, and return when it ends.

    Two ops run at once (the executor's two threads) and share the cores:
    each of ``n`` running ops goes at 1/n of its speed alone, so a weight
    gradient running beside an input gradient slows it down and one running
    alone goes at full speed. Jobs take a free thread in order; each job's
    ``start`` and ``end`` are set as it gets a thread and as it finishes
    (``left``: its seconds of work still to do). With ``keep_waiting`` >= 0
    there is no work: both threads run jobs until that many are left."""
    t = clock
    if work <= 0 and keep_waiting < 0:
        return t
    while True:
        waiting = [j for j in jobs if j.left > 0]
        if work <= 0 and len(waiting) <= keep_waiting:
            return t
        running = waiting[:1 if work > 0 else 2]
        for j in running:
            if j.start == INF:
                j.start = t
        n = len(running) + (1 if work > 0 else 0)
        step = min([j.left for j in running] + ([work] if work > 0 else []))
        t += step * n
        for j in running:
            j.left -= step
            if j.left <= 1e-12:
                j.left, j.end = 0.0, t
        if work > 0:
            work -= step
            if work <= 1e-12:
                return t


def simulate(
    ops: Sequence[LayerOp],
    *,
    model_inputs: Sequence[int],
    model_outputs: Sequence[int],
    losses: Sequence[LossSpec],
    update_workspace: Callable[[int, int], int],
    persistent: Sequence[tuple[Any, ...]],
    update_lag: int = 1,
    weight_grad_lag: int = 0,
    all_reduce_bytes: int = 0,
    remat: Sequence[Sequence[tuple[int, int]]] = (),
    allocator: str = "bfc",
    granule: int = 256,
    backward_time: Callable[[PrimCost], tuple[float, float]] | None = None,
    forward_time: Callable[[PrimCost], float] | None = None,
    worst_case: bool = False,
    slots: Sequence[tuple[Any, ...]] = (),
    accumulation_steps: int = 0,
    decayed: Collection[int] = (),
    sparse_update: Callable[[int, int], tuple[Sequence[int], Sequence[int],
                                              tuple[list[int], bool] | None]] | None = None,
    copy_on_read: bool = False,
    early_update: int | Callable[[int], int] = 0,
    final_update_workspace: Callable[[int, int], int] | None = None,
    update_time: Callable[[int, int], float] | None = None,
    steps: int = 1,
    products_timed: bool = False,
    weight_first: Collection[tuple[int, int]] | None = None,
) -> StepResult:
    """Simulate a warm-up step and ``steps`` measured ones, of which the
    highest is kept; see the module docstring.

    ``persistent`` lists ``(kind, bytes)``, ``(kind, bytes, weight_key)`` or
    ``(kind, bytes, weight_key, temporaries)`` allocations held across steps,
    in the order they are made (weights, the batch, optimizer slots);
    ``temporaries`` same-sized buffers are allocated before the kept one and
    freed after it (a random initializer's draw and its scaled copy).

    ``slots`` lists the optimizer's variables after ``persistent``, each
    ``(weight_key, bytes, share_key)``: those with a ``share_key`` start as
    one buffer per key (made before the warm-up step), and each writes a
    buffer of its own at its weight's first update unless it is the last of
    its buffer's sharers (see ``optimizers.Slot``); the others are made
    before the warm-up step. A fourth element, True, marks a gradient
    accumulator.

    ``sparse_update(values_bytes, table_bytes)`` gives the allocations an
    optimizer update makes for a weight whose gradient is ``IndexedSlices``
    (``Prim.sparse_grad``, read by that one op): values-sized and
    table-sized (its densifications), alive together before its usual
    update, and the buffers its whole update holds at its highest with its
    ops run one at a time, with whether the values are alive then (None: not
    known), which is what it holds beside a weight-gradient job; None: such
    gradients are written table-sized. With
    ``copy_on_read`` that update scatters into the variable, after which
    TensorFlow copies the variable at every read: each op reading it in the
    next step has a copy of it while it runs.

    With ``accumulation_steps`` = k > 1 (Keras' ``gradient_accumulation_steps``)
    only every k-th step updates; the others accumulate. An accumulating step
    writes ``accumulator + gradient`` into the gradient's buffer, which the
    accumulator then keeps (``assign`` takes the tensor; its old buffer goes).
    An updating step starts with every accumulator holding a buffer of its
    own, updates the weights with ``(gradient + accumulator) / k`` (written
    into the gradient's buffer), and resets each accumulator to a zeros
    tensor, one per shape and dtype that the process holds from the first
    step on (three accumulators of one shape: one buffer): the accumulator's
    buffer is freed. ResNet-50 b8 Adam with k = 2 holds 381 MiB between an update and
    the next step, 485-497 MiB after an accumulating step (330-340 without
    accumulation). The warm-up step accumulates, the slots' own copies are
    made at the first update, and the peak is the highest of the steps that
    follow until the second update.

    ``remat`` lists rematerialized regions, each a run of consecutive prims
    given as ``(layer index, prim position)``: as ``tf.recompute_grad`` does, a
    region keeps only its inputs through the forward pass and runs its forward
    prims again just before its gradients.

    With ``weight_grad_lag`` > 0 the weight gradients run on a second stream
    beside the input gradients (TensorFlow's CPU executor runs two ops at
    once). ``backward_time`` gives each prim's seconds of input and of weight
    gradients: a weight-gradient job then starts when the second stream is
    free and ends when its work is done, holding its output gradient, what
    it reads and its workspace until then (a U-Net's 128 x 128 filter
    gradient runs while three smaller layers' input gradients are
    computed). The two running ops share the cores: each goes at half its
    speed alone while the other runs, and at full speed alone (a 1024-wide
    MLP's kernel gradient beside the next input gradient). A convolution's or
    matrix product's weight gradient that comes while the second stream is
    busy starts at once and its input gradient waits for the first of the
    two to end where ``weight_first`` holds its ``(layer op index, weight
    key)`` (``executor.weight_gradient_first``: where the executor's order
    puts the weight gradient after the input gradient), or, with
    ``weight_first`` None, where :data:`WEIGHT_GRADIENT_FIRST` names its
    kernel (by default none). A loop whose gradient holds a buffer per thread running
    it (``Prim.backward_thread_parts``: a ConvLSTM step's column buffers)
    holds one while a job still runs on the second thread, and all of them
    once the jobs have ended, if they end before it. Without
    ``backward_time``, each job ends
    ``weight_grad_lag`` gradient ops later. ``products_timed``: the times
    give a product of two activations' two gradients their own speeds,
    and (:data:`PRODUCT_GRADIENTS_SIDE_BY_SIDE` None) the second runs on the
    second stream.

    A weight's update writes into a copy of it when an input gradient still
    reads its value (``dx = g @ W^T``): the copy becomes the variable's
    storage, in the regions the step's tensors use. Every such update
    copies; with :data:`TIMED_COPIES` and ``backward_time`` the simulated
    times decide, as TensorFlow's race does: a copy where the weight's
    gradient and then its update (``update_time``) end before the last
    input gradient reading it. The copies move weights from step to step,
    and with them the chunks later steps get (``steps``).
    ``forward_time`` gives a prim's forward seconds: a recomputed prim takes
    that long on the first stream, while weight-gradient jobs may end.

    ``decayed`` lists the weights the optimizer decays (Keras'
    ``weight_decay``). TensorFlow's ``variable.assign_sub(variable * wd * lr)``
    depends only on the forward pass's read of the variable, so it can run at
    the start of the step while that read is still held (by its forward
    reader, and by the gradient that keeps the weight): it then writes the
    decayed value into a copy, which becomes the variable's storage, and the
    old buffer goes with its last reader (allocator traces of ConvNeXt-Tiny
    and of an MLP under AdamW: an ``AssignSubVariableOp`` allocation beside
    a decay product). When it runs varies from process to process (in the
    MLP every decay before the first gradient op in 12 of 15 processes; a
    decay after its weight's last reader writes in place), so the schedule
    takes the earliest order, the highest: a copy of every decayed weight.
    The update that follows then writes into a buffer no one else reads.

    ``early_update`` is how many variable-sized results of each trainable
    variable's update need only the optimizer's state (``optimizers.
    early_temporaries``; one count, or one per weight key): an updating step
    makes them all at its start and holds each until its variable's update.
    ``final_update_workspace`` replaces ``update_workspace`` for the updates
    left when the backward pass has ended, whose ops run as soon as they
    are ready (both threads free).
    Once the input gradients are done, the updates whose gradients are
    written run on the free thread beside the weight-gradient jobs still
    running; ``update_time(variable bytes, weight key)`` gives each its
    seconds there (``update_workspace`` too takes the weight's key: a
    ``MultiOptimizer``'s updates differ from variable to variable), and
    an update overlaps a job only when the job outlasts it (its temporaries
    are made at its end). Without it each overlaps the jobs still running.

    With ``worst_case`` a prim's input gradient also holds its
    ``backlog_parts`` (a recurrent loop that ran ahead of its weight-gradient
    sums).
    """
    flats, tensor_bytes, weight_of = _flatten(ops)
    if (forward_time is not None and backward_time is not None and weight_grad_lag > 0
            and not remat):
        # the CPU's executor runs independent forward branches side by side
        seconds = [forward_time(c) for c in _costs(flats, tensor_bytes, weight_of)]
        flats = [flats[k] for k in _two_threads(flats, seconds)]
    weight_trainable = {w.key: w.trainable for op in ops for w in op.weights}
    weight_bytes = {w.key: w.nbytes for op in ops for w in op.weights}
    weight_layer: dict[int, str] = {}
    for op in ops:
        for w in op.weights:
            weight_layer.setdefault(w.key, op.name)
    # Model inputs and weights are held outside the step: never allocated here.
    external = set(model_inputs) | set(weight_of)
    for t in model_inputs:
        tensor_bytes.setdefault(t, 0)

    # Which tensors depend on trainable weights, and which lead to the loss.
    requires_grad: dict[int, bool] = defaultdict(bool)
    for t, key in weight_of.items():
        requires_grad[t] = weight_trainable[key]
    for f in flats:
        rg = any(requires_grad[t] for t in f.grad_ins)
        for t in f.outs:
            requires_grad[t] = requires_grad[t] or rg
    leads_to_loss: dict[int, bool] = defaultdict(bool)
    for t in model_outputs:
        leads_to_loss[t] = True
    for f in reversed(flats):
        if any(leads_to_loss[t] for t in f.outs):
            for t in f.grad_ins:
                leads_to_loss[t] = True

    position = {(f.op.index, pos): i for i, (f, pos) in enumerate(_positions(flats))}
    region_of: dict[int, int] = {}
    regions: list[list[int]] = []
    for members in remat:
        idx = sorted(position[m] for m in members if m in position)
        if not idx:
            continue
        if idx != list(range(idx[0], idx[-1] + 1)):
            raise ValueError("a rematerialized region must be consecutive prims")
        for i in idx:
            region_of[i] = len(regions)
        regions.append(idx)

    # The ops that read nothing but weights (a mixed-precision layer's cast of
    # its kernel, and what reads only such results) are ready when the step
    # starts, and TensorFlow's executor runs them then, beside the first
    # layers: an allocator trace of ResNet-50 under mixed_bfloat16 makes its
    # 53 bfloat16 kernels while the first convolution and its normalization
    # run. Their results wait for their readers.
    from_weights = set(weight_of)
    at_start: dict[int, None] = {}
    for i, f in enumerate(flats):
        if f.ins and f.outs and all(t in from_weights for t in f.ins):
            at_start[i] = None
            from_weights.update(f.outs)

    # A weight whose value an input gradient still reads when its update runs
    # (dx = g @ W^T beside the update of W) is copied before it is written.
    # Whether the input gradient is still pending then is a race between
    # TensorFlow's executor threads (the trace shows it both ways): the copy
    # is assumed, the larger peak (with TIMED_COPIES and times, each
    # simulated order settles it: ``copied``).
    weight_readers: Counter[int] = Counter()  # the input gradients reading each weight
    decayed = [key for key in dict.fromkeys(decayed) if weight_trainable.get(key)]
    tensors_of: dict[int, list[int]] = defaultdict(list)
    for t, key in weight_of.items():
        tensors_of[key].append(t)
    holders0: dict[int, int] = defaultdict(int)
    grad_pending0: dict[int, int] = defaultdict(int)
    for f in flats:
        wants = tuple(dict.fromkeys(t for t in f.grad_ins if requires_grad[t]))
        f.needs_backward = bool(wants) and any(leads_to_loss[t] for t in f.outs)
        if f.needs_backward:
            f.saved = _resolve_saves(f, wants)
            f.input_grads = wants
            if any(t not in weight_of for t in wants):
                f.weight_reads = tuple(dict.fromkeys(
                    t for t in f.ins if t in weight_of and weight_trainable[weight_of[t]]))
                weight_readers.update(weight_of[t] for t in f.weight_reads)
            for t in wants:
                grad_pending0[t] += 1
    # (a decayed weight is already a copy of its own)
    copy_on_write = set(weight_readers).difference(decayed)
    copied: set[int] = set()  # of those, the ones the step being simulated copies
    # A gather's weight gradient is IndexedSlices whose values are the output
    # gradient: nothing is written, the update densifies it. Where several
    # ops read the weight its parts are summed densely, and accumulators
    # hold dense sums: those stay table-sized.
    sparse_weights = ({t for f in flats if f.needs_backward for t in f.sparse
                       if t in f.input_grads and grad_pending0[t] == 1}
                      if sparse_update is not None and accumulation_steps <= 1 else set())
    read_copied = sparse_weights if copy_on_read else set()
    # A trainable weight read through a cast (a mixed precision policy: the
    # layer computes with a float16 or bfloat16 copy of its kernel) has its
    # gradient computed with respect to the copy by a weight-gradient kernel,
    # on the weight-gradient thread, then cast to the weight's type (an
    # allocator trace of a float16 CNN: a convolution's filter gradient and
    # its column buffer alive through the next layers' input gradients).
    cast_weight = {f.outs[0]: f.ins[0] for f in flats
                   if f.prim.name.lower() == "cast" and f.needs_backward
                   and len(f.ins) == 1 and len(f.outs) == 1 and f.ins[0] in weight_of
                   and weight_trainable[weight_of[f.ins[0]]]}
    cast_flats = {id(f) for f in flats if f.outs and f.outs[0] in cast_weight}
    weight_side = {**weight_of, **{t: weight_of[w] for t, w in cast_weight.items()}}
    costs = _costs(flats, tensor_bytes, weight_side, set(region_of))
    two_threads = backward_time is not None and weight_grad_lag > 0
    side_by_side = (products_timed if PRODUCT_GRADIENTS_SIDE_BY_SIDE is None
                    else PRODUCT_GRADIENTS_SIDE_BY_SIDE)
    second_thread = (_second_products(flats, weight_side)
                     if two_threads and side_by_side else {})
    # (the second product's time is the second stream's; the costs reported
    # keep a weight gradient's FLOPs apart from an activation's)
    times = ([backward_time(c) for c in (
        _costs(flats, tensor_bytes, weight_side, set(region_of), second_thread)
        if second_thread else costs)] if two_threads else None)
    # a recomputed prim runs again on the input-gradient stream
    recompute_times = ([forward_time(c) if c.recomputed else 0.0 for c in costs]
                       if times and forward_time is not None else None)
    region_inputs: list[tuple[int, ...]] = []
    for idx in regions:
        made = {t for i in idx for t in flats[i].outs}
        needed = any(flats[i].needs_backward for i in idx)
        region_inputs.append(tuple(dict.fromkeys(
            t for i in idx for t in flats[i].ins
            if t not in made and t not in external)) if needed else ())
    # A region's forward pass runs without the gradient tape
    # (tf.recompute_grad's ``f(*args)`` under ``stop_recording``): only the
    # prims its outputs need, none of the gradient ops that run with a forward
    # pass elsewhere (``Prim.hoisted``: GELU's ``Square``), in the order one
    # thread runs them (``_depth_first``): an allocator trace of the gated MLP
    # under RematScope("activations") makes one 8 MiB buffer per GELU in the
    # forward pass (its ``-x``; the rest is written into it), where the taped
    # pass makes three and a temporary.
    forward_order: list[int] = []
    untaped_skip: set[int] = set()
    first_of = {idx[0]: r for r, idx in enumerate(regions)}
    read_by: dict[int, list[int]] = defaultdict(list)  # tensor -> the prims reading it
    if regions:
        for j, g in enumerate(flats):
            for t in g.ins:
                read_by[t].append(j)
    for i in range(len(flats)):
        r = first_of.get(i)
        if r is None:
            if i not in region_of:
                forward_order.append(i)
            continue
        idx = regions[r]
        made = {t: j for j in idx for t in flats[j].outs}
        inside = set(idx)
        wanted = [t for t in made for j in read_by.get(t, ()) if j not in inside]
        wanted += [t for t in model_outputs if t in made]
        run: set[int] = set()
        while wanted:
            j = made.get(wanted.pop())
            if j is None or j in run or flats[j].prim.hoisted:
                continue
            run.add(j)
            wanted.extend(flats[j].ins)
        order = [j for j in idx if j in run]
        forward_order += _depth_first([flats[j] for j in order], order)
        untaped_skip.update(j for j in idx if j not in run)
    for i, f in enumerate(flats):
        if i not in untaped_skip:  # a region's skipped prims read nothing then
            for t in f.ins:
                holders0[t] += 1
        if i not in region_of:  # a region keeps its inputs instead (below)
            for t in f.saved:
                holders0[t] += 1
        for t in f.weight_reads:
            holders0[t] += 1
    for held in region_inputs:
        for t in held:
            holders0[t] += 1
    # the layers whose gradients read each tensor: one whose only reader is
    # the layer it feeds can take that layer's gradient intermediates
    saved_by: dict[int, set[int]] = defaultdict(set)
    for f in flats:
        for t in f.saved:
            saved_by[t].add(f.op.index)
    shared_input = {t for held in region_inputs for t in held} | set(external)
    for t in model_inputs:
        holders0[t] += 1  # the caller holds its batch
    for t in model_outputs:
        holders0[t] += 1  # the loss reads each output

    sim = _Simulator(make_allocator(allocator))
    weight_buffer: dict[int, int] = {}
    for item in persistent:
        kind, nbytes = item[0], item[1]
        # a random initializer's draw and its scaled copy come before the
        # value the variable keeps, and are freed after it
        temps = [sim.alloc(nbytes, kind, WORKSPACE) for _ in range(item[3] if len(item) > 3 else 0)]
        bid = sim.alloc(nbytes, kind, PERSISTENT)
        for t in reversed(temps):
            sim.free(t)
        if len(item) > 2 and item[2] is not None:
            weight_buffer[item[2]] = bid
    # optimizer slots: the shared starting buffers now, the copies at the
    # first update of each weight
    shared: dict[Any, int] = {}
    sharers: dict[Any, int] = defaultdict(int)
    first_write: dict[int, list[tuple[int, Any]]] = defaultdict(list)
    accumulating = accumulation_steps > 1
    # each accumulator's storage: ("own", buffer), ("shared", key) or ("zeros",)
    accumulator: dict[int, tuple[Any, ...]] = {}
    zeros: set[Any] = set()
    for key, nbytes, share_key, *flag in slots:
        is_accumulator = accumulating and key is not None and bool(flag and flag[0])
        if share_key is None or key is None:
            bid = sim.alloc(nbytes, "optimizer state", PERSISTENT)
            if is_accumulator:
                accumulator[key] = ("own", bid)
            continue
        if share_key not in shared:
            shared[share_key] = sim.alloc(nbytes, "optimizer state", PERSISTENT)
        sharers[share_key] += 1
        if is_accumulator:
            accumulator[key] = ("shared", share_key)
        else:
            first_write[key].append((nbytes, share_key))
    for key, nbytes, share_key, *_ in slots:
        # the zeros an update resets the accumulators to: one constant per
        # shape and dtype, held from the first step on
        if key in accumulator and (share_key, nbytes) not in zeros:
            zeros.add((share_key, nbytes))
            sim.alloc(nbytes, "accumulator reset (zeros)", PERSISTENT)
    zeros_bytes = sum(round_up(nbytes) for _, nbytes in zeros)
    # grappler's folded constants, made when the step's function first runs
    # (each distinct one once: equal constants are merged)
    constants = [nbytes for nbytes, _ in folded_constants(ops, losses).values()]
    for nbytes in constants:
        sim.alloc(nbytes, "constants", PERSISTENT)
    constants_bytes = sum(round_up(nbytes) for nbytes in constants)
    baseline = (sum(round_up(item[1]) for item in persistent)
                + sum(round_up(nbytes) for _, nbytes, *_ in slots) + zeros_bytes
                + constants_bytes)
    layer_saved: dict[int, int] = defaultdict(int)
    layer_workspace: dict[int, int] = defaultdict(int)
    saved_total = 0

    def release_accumulator(key: int) -> None:
        """An accumulator takes new storage: its own buffer is freed, a shared
        starting buffer when its last sharer leaves (``assign`` replaces the
        buffer; nothing writes into it)."""
        storage = accumulator[key]
        if storage[0] == "own":
            sim.free(storage[1])
        elif storage[0] == "shared":
            sharers[storage[1]] -= 1
            if sharers[storage[1]] == 0:
                sim.free(shared.pop(storage[1]))

    def run_step(updating: bool = True) -> None:
        nonlocal saved_total
        holders: dict[int, int] = defaultdict(int, holders0)
        grad_pending: dict[int, int] = defaultdict(int, grad_pending0)
        sparse_grads: set[int] = set()  # gradient buffers that are IndexedSlices values
        buffer_of: dict[int, int] = {}
        outside_views: set[int] = set(model_inputs)  # the batch, and views of it
        layer_saved.clear()
        layer_workspace.clear()

        def attach(t: int, bid: int) -> None:
            buffer_of[t] = bid
            sim.buffers[bid].live_tensors += 1

        def sole_buffer(t: int) -> int | None:
            """The buffer of ``t`` where an op may write into it: ``t`` is its
            only tensor and its last hold is the reader asking (not a model
            input or weight, which the step does not own)."""
            bid = buffer_of.get(t)
            if (bid is None or t in external or holders[t] != 1
                    or sim.buffers[bid].live_tensors != 1):
                return None
            return bid

        def release(t: int) -> None:
            holders[t] -= 1
            if holders[t] == 0 and t in buffer_of:
                bid = buffer_of.pop(t)
                buf = sim.buffers.get(bid)
                if buf is not None:
                    buf.live_tensors -= 1
                    if buf.live_tensors == 0:
                        sim.free(bid)

        def produce(f: _Flat, phase: str) -> None:
            """Run one forward prim: its outputs take over an input's buffer
            where TensorFlow forwards it, else get their own; its inputs are
            released and outputs nobody reads are freed at once."""
            op, p = f.op, f.prim
            pieces = dict(p.output_pieces)
            refs_out = [r for r, _ in p.outputs]
            # a variable in copy-on-read mode is copied by its read
            read_copies = [sim.alloc(tensor_bytes[t], op.name, WORKSPACE)
                           for t in f.ins if t in read_copied]
            for i, (t, nbytes) in enumerate(zip(f.outs, (b for _, b in p.outputs))):
                if i == 0 and p.alias and f.ins and f.ins[0] in buffer_of:
                    attach(t, buffer_of[f.ins[0]])
                    continue
                if i == 0 and p.alias and f.ins and f.ins[0] in outside_views:
                    # a view of the batch (Conv1D's ExpandDims, a Flatten)
                    # is the batch's buffer, held outside the step
                    outside_views.add(t)
                    continue
                if i == 0 and p.inplace:
                    taken = False
                    for ref in p.inplace:
                        bid = sole_buffer(f.ins[p.inputs.index(ref)])
                        if bid is not None and sim.buffers[bid].nbytes == round_up(nbytes, granule):
                            sim.buffers[bid].layer = op.name
                            sim.buffers[bid].kind = ACTIVATION
                            attach(t, bid)
                            taken = True
                            break
                    if taken:
                        continue
                attach(t, sim.alloc(nbytes, op.name, ACTIVATION, pieces.get(refs_out[i], 1)))
            sim.check(phase)
            for bid in read_copies:
                sim.free(bid)
            if p.forward_workspace_bytes:
                ws = sim.alloc(p.forward_workspace_bytes, op.name, WORKSPACE,
                               p.forward_workspace_pieces)
                layer_workspace[op.index] = max(
                    layer_workspace[op.index], sim.buffers[ws].nbytes
                )
                sim.check(phase)
                sim.free(ws)
            for t in f.ins:
                release(t)
            for t in f.outs:
                if holders[t] == 0:
                    holders[t] = 1
                    release(t)
            sim.point(phase, op.name, p.name)

        # Weight decay: each decayed variable is written into a copy at once;
        # the old buffer stays with the step's reads of the weight.
        held_before_decay = []
        for key in decayed:
            nbytes = weight_bytes[key]
            scaled = sim.alloc(nbytes, weight_layer[key], UPDATE)  # variable * wd * lr
            copy = sim.alloc(nbytes, "weights", PERSISTENT)
            sim.free(scaled)
            old = weight_buffer.get(key)
            weight_buffer[key] = copy
            if old is None:
                continue
            readers = [t for t in tensors_of[key] if holders[t] > 0]
            if not readers:
                sim.free(old)
                continue
            sim.buffers[old].kind = UPDATE
            sim.buffers[old].layer = weight_layer[key]
            for t in readers:
                attach(t, old)
            held_before_decay.append(old)
        if decayed:
            sim.check("forward")
            sim.point("forward", "optimizer", "weight decay")
        # An update's products of the optimizer state alone (Lion's m * beta)
        # are ready at once: made now, held until the variable's update.
        early: dict[int, int] = {}
        if early_update and updating:
            for key in weight_layer:
                count = early_update(key) if callable(early_update) else early_update
                if weight_trainable.get(key) and count:
                    early[key] = sim.alloc(count * weight_bytes[key], weight_layer[key],
                                           UPDATE, count)
            if early:
                sim.check("forward")
                sim.point("forward", "optimizer", "state products made before the gradients")

        # Forward pass: first what reads nothing but weights, which is ready
        # when the step starts.
        for i in at_start:
            produce(flats[i], "forward")
        for i in forward_order:
            if i not in at_start:
                produce(flats[i], "forward")

        index_of = {op.name: op.index for op in ops}
        for buf in sim.buffers.values():
            if buf.kind == ACTIVATION and buf.layer in index_of:
                layer_saved[index_of[buf.layer]] += buf.nbytes
        saved_total = sum(
            b.nbytes for b in sim.buffers.values() if b.kind == ACTIVATION
        )

        # Loss: each output's loss keeps a tensor of its size for the gradient,
        # which becomes the output's gradient when the backward pass starts.
        grad_of: dict[int, int] = {}
        loss_buffers = []
        for t, spec in zip(model_outputs, losses):
            # the buffer the output's gradient is written into (None: made by
            # the loss's gradient ops), and what else the loss keeps
            reused = spec.output_reused and sole_buffer(t) is not None
            if reused:  # the output's own buffer
                bid = buffer_of.pop(t)
                holders[t] = 0
                sim.buffers[bid].live_tensors = 0
                sim.buffers[bid].layer = "loss"
                kept = spec.saved_bytes
            elif spec.gradient_bytes and spec.gradient_in_saved:
                bid = sim.alloc(spec.gradient_bytes, "loss", ACTIVATION)
                kept = spec.saved_bytes - spec.gradient_bytes
            elif spec.gradient_bytes:
                bid, kept = None, spec.saved_bytes
            else:
                bid, kept = sim.alloc(spec.saved_bytes, "loss", ACTIVATION), 0
            loss_buffers.append((bid, sim.alloc(kept, "loss", ACTIVATION) if kept > 0
                                 else None))
            if spec.workspace_bytes:
                ws = sim.alloc(spec.workspace_bytes, "loss", WORKSPACE)
                sim.check("loss")
                sim.free(ws)
            sim.check("loss")
            if not reused:
                release(t)
            sim.point("loss", "loss", "loss")
        for t, spec, (bid, rest) in zip(model_outputs, losses, loss_buffers):
            # the loss's gradient ops: the output's gradient, their own
            # temporaries, then what the loss kept is released
            if bid is None:
                bid = sim.alloc(spec.gradient_bytes, "loss", GRADIENT)
            ws = (sim.alloc(spec.backward_bytes, "loss", WORKSPACE) if spec.backward_bytes
                  else None)
            if spec.gradient_bytes:
                sim.check("backward")
            for b in (ws, rest):
                if b is not None:
                    sim.free(b)
            sim.buffers[bid].kind = GRADIENT
            grad_of[t] = bid

        # Backward pass and optimizer updates.
        partial: dict[int, list[int]] = defaultdict(list)
        # a gradient buffer several gradient tensors are (with
        # PASS_THROUGH_GRADIENTS): how many more than one hold it
        grad_shares: dict[int, int] = defaultdict(int)

        def drop_grad(bid: int) -> None:
            """A gradient tensor lets go of ``bid``: freed once none holds it."""
            if grad_shares[bid]:
                grad_shares[bid] -= 1
            else:
                sim.free(bid)
        queue: deque[tuple[int, int]] = deque()
        # updates still running (UPDATES_TAKE_TIME): when each ends, and the
        # buffers it holds till then
        running_updates: list[tuple[float, list[int]]] = []

        def updates_end(now: float) -> None:
            """The updates running (UPDATES_TAKE_TIME) that end by ``now``
            let go of their gradient and temporary."""
            for entry in [e for e in running_updates if e[0] <= now]:
                running_updates.remove(entry)
                for b in entry[1]:
                    sim.free(b)
        # when the updates started during the backward pass leave the
        # second thread (UPDATES_HOLD_THE_THREAD), and the time now
        update_busy = [0.0, 0.0]
        # for the copies: how many input gradients reading each weight are
        # still to run, when the last of them ended, and when each weight's
        # gradient was written
        read_pending = Counter(weight_readers)
        read_until: dict[int, float] = {}
        grad_done: dict[int, float] = {}

        def still_read(key: int) -> bool:
            """Whether an input gradient still reads the weight when its
            update writes it (after the update's own ops)."""
            if not times or not TIMED_COPIES:
                return True
            written = grad_done.get(key, update_busy[1]) + (
                update_time(weight_bytes[key], key) if update_time is not None else 0.0)
            return read_pending[key] > 0 or read_until.get(key, INF) > written

        def run_update(key: int, bid: int, final: bool = False, beside: bool = False) -> None:
            if UPDATES_HOLD_THE_THREAD and update_time is not None and times:
                update_busy[0] = (max(update_busy[0], update_busy[1])
                                  + update_time(weight_bytes[key], key))
            if key in accumulator and not updating:
                # accumulator + gradient, written into the gradient's buffer,
                # which the accumulator keeps
                release_accumulator(key)
                sim.buffers[bid].kind = PERSISTENT
                sim.buffers[bid].layer = "gradient accumulators"
                accumulator[key] = ("own", bid)
                sim.point("update", weight_layer[key], "accumulate gradient")
                return
            if key in accumulator:
                # (gradient + accumulator) / k is written into the gradient's
                # buffer; the reset to the zeros constant, ordered only after
                # that read of the accumulator, frees its buffer before the
                # update's temporaries (a 1024 x 1024 MLP: 8 MiB above the
                # step's start, not 12)
                release_accumulator(key)
                accumulator[key] = ("zeros",)
            nbytes = sim.buffers[bid].nbytes
            dense_done = False
            now = update_busy[1]
            takes_time = (UPDATES_TAKE_TIME and times is not None and update_time is not None
                          and not final and bid not in sparse_grads)
            if takes_time:
                updates_end(now)
            if bid in sparse_grads and sparse_update is not None:
                # the optimizer's code densifies the IndexedSlices (a
                # segment sum per use) and computes on its values, all alive
                # with the values (allocator trace of an Embedding under Adam).
                # Beside a job that holds the other thread the update's ops
                # run one at a time (optimizers.sparse_update_in_order): Adam
                # densifies one moment and writes it before the next segment
                # sum (allocator traces of a text CNN on TensorFlow's kernels:
                # beside the convolution's filter gradient, the values with
                # Square and one 14.6 MiB UnsortedSegmentSum, or with Sqrt_1
                # and the other; never both sums and Square)
                sparse_grads.discard(bid)
                values, tables, in_order = sparse_update(nbytes, weight_bytes[key])
                sizes = [*values, *tables]
                if beside and in_order is not None:
                    # its whole update, dense part included, one op at a time
                    sizes, values_alive = in_order
                    dense_done = True
                    if not values_alive:
                        sim.free(bid)
                        bid = None
                made = [sim.alloc(n, weight_layer[key], UPDATE) for n in sizes if n]
                sim.check("update")
                for b in made:
                    sim.free(b)
                nbytes = weight_bytes[key]
            ws_bytes = 0 if dense_done else (
                # (with both threads free its ops run side by side; an update
                # still running holds one of them)
                (final_update_workspace or update_workspace)(nbytes, key)
                if final and not running_updates else update_workspace(nbytes, key))
            # (each of the update's temporaries is a tensor of its own)
            kept_bytes = min(ws_bytes, nbytes) if takes_time else 0
            kept = sim.alloc(kept_bytes, weight_layer[key], UPDATE) if kept_bytes else None
            ws_bytes -= kept_bytes
            ws = (sim.alloc(ws_bytes, weight_layer[key], UPDATE, max(1, ws_bytes // nbytes))
                  if ws_bytes else None)
            for nbytes, share_key in first_write.pop(key, ()):
                # a slot still sharing its starting buffer is written into its own
                if sharers[share_key] > 1:
                    sharers[share_key] -= 1
                    sim.alloc(nbytes, "optimizer state", PERSISTENT)
            copy = None
            if key in copy_on_write and still_read(key):
                copied.add(key)
                # the variable is written into a copy, which becomes its storage
                copy = sim.alloc(weight_bytes[key], weight_layer[key], UPDATE)
            sim.check("update")
            if ws is not None:
                sim.free(ws)
            if key in early:
                sim.free(early.pop(key))
            if copy is not None:
                old = weight_buffer.get(key)
                if old is not None:
                    sim.free(old)
                    sim.buffers[copy].kind = PERSISTENT
                    sim.buffers[copy].layer = "weights"
                    weight_buffer[key] = copy
                else:
                    sim.free(copy)
            if takes_time:
                # the update runs on, after those before it: its gradient
                # stays till it ends, and its temporary if it starts now
                start = max([now, *(end for end, _ in running_updates)])
                if start > now and kept is not None:
                    sim.free(kept)
                    kept = None
                running_updates.append((start + update_time(weight_bytes[key], key),
                                        [b for b in (bid, kept) if b is not None]))
            elif bid is not None:
                sim.free(bid)
            sim.point("update", weight_layer[key], "apply gradient")

        def settle(ts: Sequence[int]) -> None:
            """Gradients of ``ts`` written: sum the parts of a tensor read by
            several ops, hand weights' gradients to the optimizer."""
            for t in ts:
                grad_pending[t] -= 1
                if grad_pending[t] == 0:
                    parts = partial.pop(t)
                    if len(parts) > 1:
                        # summed in place into the first part nothing else holds
                        own = [b for b in parts if not grad_shares[b]]
                        into = own[0] if own else sim.alloc(
                            tensor_bytes[t], sim.buffers[parts[0]].layer, GRADIENT)
                        for extra in parts:
                            if extra != into:
                                drop_grad(extra)
                        parts = [into]
                    if t in weight_of:
                        grad_done[weight_of[t]] = update_busy[1]
                        queue.append((weight_of[t], parts[0]))
                        while len(queue) > update_lag:
                            run_update(*queue.popleft())
                    elif t in cast_weight:
                        # the cast's gradient: the weight's, in its own type
                        w = cast_weight[t]
                        whole = sim.alloc(tensor_bytes[w], sim.buffers[parts[0]].layer, GRADIENT)
                        sim.check("backward")
                        drop_grad(parts[0])
                        partial[w].append(whole)
                        settle([w])
                    elif t in external:
                        drop_grad(parts[0])
                    else:
                        grad_of[t] = parts[0]

        def workspace(f: _Flat, ts: Sequence[int], extra: int = 0,
                      extra_parts: Sequence[int] = (), unwanted: bool = False) -> int | None:
            p = f.prim
            # each gradient kernel's temporary is an allocation of its own (a
            # convolution's filter and input gradients' column buffers)
            own = [n for ref, n in p.workspace_for
                   if n and ref in p.inputs and f.ins[p.inputs.index(ref)] in ts]
            if unwanted:  # input gradients computed and dropped
                own += [n for ref, n in p.always_grads if n and ref in p.inputs
                        and f.ins[p.inputs.index(ref)] not in f.input_grads]
            ws_bytes = extra + sum(own)
            if not ws_bytes:
                return None
            pieces = (*(extra_parts or ((extra,) if extra else ())), *own)
            parts = pieces if len(pieces) > 1 else ()
            if worst_case and extra and p.backlog_parts:
                parts = (*(parts or (ws_bytes,)), *p.backlog_parts)
                ws_bytes = sum(parts)
            ws = sim.alloc(ws_bytes, f.op.name, WORKSPACE, sizes=parts)
            layer_workspace[f.op.index] = max(layer_workspace[f.op.index],
                                              sim.buffers[ws].nbytes)
            return ws

        def end_job(job: _Job) -> None:
            """A prim's weight gradients are written: free their workspace, the
            output gradients and what they read; hand them on."""
            f = job.flat
            if job.workspace is not None:
                sim.free(job.workspace)
            for bid in job.out_grads:
                drop_grad(bid)
            for t in (*f.saved, *f.weight_reads):
                release(t)
            settle(job.weights)
            sim.point("backward", f.op.name, f.prim.name + " (weight gradients)")

        # The input gradients are on the critical path; the weight-gradient
        # kernels start with them and, with ``weight_grad_lag`` > 0, may end
        # while later ops' gradients run (a second thread; see ``simulate``).
        def recompute(r: int) -> None:
            """Run a region's forward prims again before its gradients, as
            tf.recompute_grad does: only the prims whose outputs the gradients
            read (directly or through another recomputed prim) run, since the
            function runtime prunes the rest; what the gradients read is kept,
            the region's inputs are released after their last reader."""
            nonlocal clock
            idx = regions[r]
            reads: dict[int, int] = defaultdict(int)
            for i in idx:
                for t in flats[i].saved:
                    reads[t] += 1
            needed: list[int] = []
            present: list[int] = []
            for i in reversed(idx):
                g = flats[i]
                if not any(reads.get(t) for t in g.outs):
                    continue
                if any(t in buffer_of for t in g.outs):
                    present.append(i)  # still alive from the forward pass
                    continue
                needed.append(i)
                for t in g.ins:
                    reads[t] += 1
            needed.reverse()
            needed = _depth_first([flats[i] for i in needed], needed)
            for t in region_inputs[r]:
                # the region's hold becomes one per reader in the recomputation
                # and one per gradient that reads it
                holders[t] += reads.get(t, 0) - 1
            for i in present:
                for t in flats[i].outs:
                    holders[t] += reads.get(t, 0)
            for i in needed:
                for t in flats[i].outs:
                    holders[t] = reads.get(t, 0)
            for t in region_inputs[r]:
                if holders[t] == 0 and t in buffer_of:
                    holders[t] = 1
                    release(t)
            for i in needed:
                produce(flats[i], "recompute")
                if recompute_times:
                    # the weight gradients running beside it may end meanwhile
                    clock = share(recompute_times[i])
                    advance(clock)

        jobs: deque[_Job] = deque()
        clock = 0.0  # when the input-gradient stream is free
        loop_on_second = False  # whether a recurrent loop's job is its last

        def share(work: float, keep_waiting: int = -1) -> float:
            return _share(jobs, clock, work, keep_waiting)

        def start_job(job: _Job, with_workspace: bool = True) -> None:
            handed_on = _handed_on(job.flat)
            for t in job.weights:
                if t in sparse_weights and job.out_grads:
                    # IndexedSlices: the values are the output gradient
                    bid = job.out_grads.pop(0)
                    sim.buffers[bid].layer = job.flat.op.name
                    sparse_grads.add(bid)
                    partial[t].append(bid)
                    continue
                if (t in handed_on and len(job.out_grads) == 1
                        and sim.buffers[job.out_grads[0]].nbytes
                        == round_up(tensor_bytes[t], granule)):
                    # a custom gradient hands the output gradient on as it is
                    bid = job.out_grads.pop(0)
                    sim.buffers[bid].layer = job.flat.op.name
                    partial[t].append(bid)
                    continue
                partial[t].append(sim.alloc(tensor_bytes[t], job.flat.op.name, GRADIENT))
            if with_workspace:
                job.workspace = workspace(job.flat, job.weights)
            job.started = True

        def advance(now: float) -> None:
            """Start and end, in time order, the weight-gradient jobs due by
            ``now`` (at one time, ends before starts)."""
            while True:
                due = [(j.end, 0, k, j) for k, j in enumerate(jobs) if j.started and j.end <= now]
                due += [(j.start, 1, k, j) for k, j in enumerate(jobs)
                        if not j.started and j.start <= now]
                if not due:
                    if now < INF:
                        updates_end(now)
                    return
                when, ending, _, job = min(due, key=lambda e: e[:3])
                update_busy[1] = when
                updates_end(when)
                if ending == 0:
                    jobs.remove(job)
                    end_job(job)
                else:
                    start_job(job)
                    sim.check("backward")

        seen_regions: set[int] = set()
        for i_flat in range(len(flats) - 1, -1, -1):
            f = flats[i_flat]
            r = region_of.get(i_flat)
            if r is not None and r not in seen_regions:
                seen_regions.add(r)
                if region_inputs[r]:
                    advance(clock)  # (what ended before the recomputation starts)
                    recompute(r)
            if not f.needs_backward or id(f) in cast_flats:
                continue  # (a weight's cast: its gradient is the weight job's)
            op, p = f.op, f.prim
            advance(clock)
            if second_thread:
                # its output's gradient is still being computed on the second
                # thread (a product's other gradient): the chain waits for it
                pending = [j for j in jobs if any(t in f.outs for t in j.weights)]
                while any(j.left > 0 for j in pending):
                    clock = share(0.0, keep_waiting=sum(j.left > 0 for j in jobs) - 1)
                    advance(clock)
                    pending = [j for j in pending if j in jobs]
                for j in pending:
                    jobs.remove(j)
                    end_job(j)
            update_busy[1] = clock
            out_grads = [grad_of.pop(t) for t in f.outs if t in grad_of]
            on_second = second_thread.get(i_flat)
            xts = [t for t in f.input_grads if t not in weight_side and t != on_second]
            wts = [t for t in f.input_grads if t in weight_side or t == on_second]
            t_in, t_w = times[i_flat] if times else (0.0, 0.0)
            # an XLA-compiled gradient (Prim.always_grads: a grouped
            # convolution's on the CPU) is one op that writes every gradient
            # when it ends: no weight gradient runs on after it
            one_op = bool(times and wts and (p.always_grads or (LOOP_GRADIENT_ONE_OP
                                                                and p.backlog_parts)))
            first_job, ended_first = None, False
            if (times and wts and xts and not one_op
                    and (costs[i_flat].kernel in WEIGHT_GRADIENT_FIRST
                         if weight_first is None
                         else any((f.op.index, weight_side[t]) in weight_first
                                  for t in wts if t in weight_side))
                    and any(j.left > 0 for j in jobs)):
                # the second thread is busy: the weight gradient starts now,
                # beside the job running there, and the input gradient waits
                # for the first of them to end
                first_job = _Job(f, wts, out_grads, clock, INF, left=t_w)
                start_job(first_job)
                sim.check("backward")
                running = next(k for k, j in enumerate(jobs) if j.left > 0)
                jobs.insert(running + 1, first_job)
                clock = share(0.0, keep_waiting=sum(j.left > 0 for j in jobs) - 1)
                # the job that ended lets go of what it held before the input
                # gradient is made; if it is this one, the output gradients
                # wait for the input gradient, which reads them
                ended_first = first_job.left <= 0
                if ended_first:
                    first_job.out_grads = []
                advance(clock)
                update_busy[1] = clock
                loop_on_second = bool(p.backlog_parts)
            # (gradient ops that read the output gradient together run side
            # by side while the second thread is free: neither writes into it)
            side_by_side = (SIDE_BY_SIDE_GRADIENTS and p.grad_read_together
                            and times is not None
                            and not any(j.left > 0 for j in jobs)
                            and update_busy[0] <= clock)
            # (a weight gradient that reads the output gradient has yet to run:
            # the input gradient is not its only reader and writes beside it,
            # as the input and scale products of an additive attention's
            # ``w * tanh(q + k)`` do in the allocator trace, 64 MiB each)
            weight_reads_first = WEIGHT_GRADIENT_READS_FIRST and any(
                f.ins[p.inputs.index(ref)] in wts
                for ref, n in p.workspace_for if n and ref in p.inputs)
            reusable = ([b for b in out_grads if not grad_shares[b]]
                        if p.grad_inplace and not side_by_side and not weight_reads_first
                        else [])
            # the tensors saved for this gradient alone (no weight gradient
            # reads them), which an input gradient may be written into
            donors = ([s for s in dict.fromkeys(f.saved)
                       if s not in shared_input and sole_buffer(s) is not None]
                      if SAVED_INPUTS_DONATE and p.grad_inplace and not wts
                      and not side_by_side else [])
            # (a custom gradient that returns the output gradient as it came
            # hands it on too: Prim.grad_passes)
            handed_on = _handed_on(f)
            passed = ([t for t in xts if round_up(tensor_bytes[t], granule)
                       == sim.buffers[out_grads[0]].nbytes
                       and (p.name in PASS_THROUGH_GRADIENTS or t in handed_on)]
                      if len(out_grads) == 1 else [])
            if passed:
                # the gradient for each input of the output's shape is the
                # output gradient itself: one buffer, nothing written
                bid = out_grads.pop()
                sim.buffers[bid].layer = op.name
                for k, t in enumerate(passed):
                    grad_shares[bid] += k > 0
                    partial[t].append(bid)
                reusable = []
            # a gradient kernel's temporaries live beside the gradients it writes
            extra, parts = p.backward_workspace_bytes, p.backward_workspace_parts
            free_donors = [op.inputs[int(r[2:])] for r in p.backward_donors]
            if free_donors and all(t not in shared_input and saved_by[t] <= {op.index}
                                   and t in buffer_of
                                   and sim.buffers[buffer_of[t]].live_tensors == 1
                                   for t in free_donors):
                extra, parts = sum(p.backward_workspace_parts_if_free), \
                    p.backward_workspace_parts_if_free
            # temporaries written into a saved tensor's buffer where nothing
            # else holds it now, else allocated (MaxPoolGrad's pooled copy)
            temps = [n for r, n in p.grad_forwards
                     if sole_buffer(_tensor_of(f, r)) is None]
            if temps:
                parts = (*temps, *(parts or ((extra,) if extra else ())))
                extra += sum(temps)
            if p.grad_forwards:
                # such a kernel makes its temporaries before its input
                # gradient (allocator traces of MaxPoolGrad: the copy, the
                # index, then the input gradient)
                ws_x = workspace(f, xts, extra, parts, unwanted=True)
            # inputs whose gradient the kernel writes into their own buffer
            # where nothing else holds them now (MaxPoolGrad's)
            into_own = [f.ins[p.inputs.index(r)] for r in p.grad_into_input if r in p.inputs]
            for t in xts:
                if t in passed:
                    continue
                nbytes = round_up(tensor_bytes[t], granule)
                bid = next((b for b in reusable if sim.buffers[b].nbytes == nbytes), None)
                donor = next((s for s in donors if sim.buffers[buffer_of[s]].nbytes == nbytes),
                             None) if bid is None else None
                if (bid is None and donor is None and t in into_own
                        and sole_buffer(t) is not None
                        and sim.buffers[buffer_of[t]].nbytes == nbytes):
                    donor = t
                if bid is not None:
                    reusable.remove(bid)
                    out_grads.remove(bid)
                    sim.buffers[bid].layer = op.name
                elif donor is not None:
                    # (its hold stays, to be let go of at the job's end: the
                    # tensor no longer has the buffer)
                    if donor in donors:
                        donors.remove(donor)
                    bid = buffer_of.pop(donor)
                    sim.buffers[bid].live_tensors = 0
                    sim.buffers[bid].layer, sim.buffers[bid].kind = op.name, GRADIENT
                else:
                    bid = sim.alloc(tensor_bytes[t], op.name, GRADIENT)
                partial[t].append(bid)
            job = first_job or _Job(f, wts, out_grads, clock, clock)
            waits_for_thread = False
            if times and wts and first_job is None and not one_op:
                # the job takes a thread when the jobs before it are done
                # (see ``share``)
                job.left, job.end = t_w, INF
                job.start = clock if not any(j.left > 0 for j in jobs) else INF
                # With no input gradient to compute, the first thread takes
                # the jobs too (a model's first convolution beside the
                # second's filter gradient, both column buffers alive), and
                # the input gradients go on when a thread is free; a
                # recurrent loop sums its weight gradients inside the loop:
                # no separate op holds the second thread after it.
                waits_for_thread = not xts and not loop_on_second
                loop_on_second = bool(p.backlog_parts)
            starts_now = first_job is None and (not times or job.start <= clock)
            if starts_now:
                start_job(job, with_workspace=False)
            sim.check("backward")
            # a loop body's per-thread buffers (Prim.backward_thread_parts):
            # one while a weight gradient still runs on the second thread
            narrow = (len(parts) - p.backward_thread_parts + 1
                      if times and xts and not p.grad_forwards and p.backward_thread_parts > 1
                      and any(j.left > 0 for j in jobs) else 0)
            if not p.grad_forwards:
                ws_x = (workspace(f, xts, sum(parts[:narrow]), parts[:narrow], unwanted=True)
                        if narrow else workspace(f, xts, extra, parts, unwanted=True))
            if starts_now:
                job.workspace = workspace(f, wts)
            sim.check("backward")
            if narrow and (pending := sum(j.left for j in jobs if j.left > 0)) < t_in:
                # the loop runs beside them until they end, then on both
                # threads: every per-thread buffer
                clock = share(pending)
                advance(clock)
                t_in -= pending
                sim.free(ws_x)
                ws_x = workspace(f, xts, extra, parts, unwanted=True)
                sim.check("backward")
            if ws_x is not None:
                sim.free(ws_x)
            settle(xts)
            sim.point("backward", op.name, p.name)
            if times and (not wts or one_op):
                # nothing left to compute: the output gradient and what the
                # gradient read go as soon as the input gradients are written
                end_job(job)
            elif ended_first:
                for bid in out_grads:
                    drop_grad(bid)
            elif first_job is None:
                jobs.append(job)
            if one_op:
                clock = share(t_in + t_w)
            elif xts and times:
                clock = share(t_in)
            elif waits_for_thread:
                clock = share(0.0, keep_waiting=1)
            for t in f.weight_reads:
                read_pending[weight_of[t]] -= 1
                read_until[weight_of[t]] = max(read_until.get(weight_of[t], 0.0), clock)
            if not times:
                while len(jobs) > weight_grad_lag:
                    end_job(jobs.popleft())
            if r is not None and i_flat == regions[r][0]:
                advance(INF)  # the region's gradients are done
        if times:
            # The input gradients are done: the first thread is free while
            # the second may still run a weight gradient (a Conv1D's filter
            # gradient after an Embedding). What the first thread finished is
            # handed on now, and the updates whose gradients are written run
            # on it beside that job, holding what it holds (an allocator
            # trace of a text CNN: the embedding's sparse Adam update beside
            # the convolution's filter gradient, 129.6 MiB against 106.5
            # when the filter gradient ends first).
            advance(clock)
            while queue and jobs:
                # the update's temporaries come at its end: it overlaps the
                # job only if the job outlasts it (a one-channel filter
                # gradient that ends while the embedding's update runs leaves
                # the step's peak where it was, 83.8 MiB in 18 measured steps)
                if update_time is not None:
                    clock = share(update_time(weight_bytes[queue[0][0]], queue[0][0]))
                    advance(clock)  # (a job ending hands on its gradients)
                    if not jobs or not queue:
                        break
                run_update(*queue.popleft(), beside=True)
        if times:
            clock = share(0.0, keep_waiting=0)  # both threads take the jobs left
        advance(INF)
        if all_reduce_bytes:
            # the gradients are packed into one buffer and reduced across devices
            packed = sim.alloc(all_reduce_bytes, "all-reduce", WORKSPACE)
            sim.check("all-reduce")
            sim.free(packed)
            sim.point("all-reduce", "all-reduce", "all-reduce gradients")
        updates_end(update_busy[1])
        while queue:  # after the last gradient: nothing else to run beside them
            run_update(*queue.popleft(), final=True)
        updates_end(INF)
        for bid in held_before_decay:  # a read the step never released
            if bid in sim.buffers:
                sim.free(bid)
        for bid in early.values():  # a variable the step had no gradient for
            sim.free(bid)


    # warm-up: the allocator grows its regions (with accumulation it is the
    # first accumulating step); then the steps measured, the highest kept
    updates = [True] * max(1, steps)
    if accumulating:
        updates = [False, True, False, True] if accumulation_steps > 2 else [True, False, True]
    run_step(not accumulating)
    sim.allocator.reset_peak()
    sim.recording = True
    best: tuple | None = None
    held = None
    for updating in updates:
        sim.peak, sim.timeline, sim.allocated = 0, [], 0
        held = sim.live if held is None else min(held, sim.live)
        copied.clear()
        run_step(updating)
        if best is None or sim.peak > best[0]:
            best = (sim.peak, sim.peak_phase, sim.peak_snapshot, sim.timeline, sim.allocated,
                    dict(layer_saved), dict(layer_workspace), saved_total, frozenset(copied))
    assert best is not None
    peak, peak_phase, snap, timeline, allocated, saved_by_layer, workspace_by_layer, \
        saved_total, copied_at_peak = best
    by_kind: dict[str, int] = defaultdict(int)
    for (_, kind), nbytes in snap.items():
        by_kind[kind] += nbytes
    holders_at_peak = tuple(
        Holder(layer, kind, nbytes)
        for (layer, kind), nbytes in sorted(snap.items(), key=lambda kv: -kv[1])
        if kind != PERSISTENT
    )
    transient = by_kind[ACTIVATION] + by_kind[GRADIENT] + by_kind[WORKSPACE] + by_kind[UPDATE]
    released = max(0, baseline - by_kind[PERSISTENT])
    return StepResult(
        baseline_bytes=baseline,
        peak_bytes=peak,
        peak_phase=peak_phase,
        activations_bytes=by_kind[ACTIVATION],
        gradients_bytes=by_kind[GRADIENT],
        workspace_bytes=by_kind[WORKSPACE] + by_kind[UPDATE],
        allocator_bytes=max(0, peak - baseline + released - transient),
        released_bytes=released,
        saved_activations_bytes=saved_total,
        layer_saved_bytes=saved_by_layer,
        layer_workspace_bytes=workspace_by_layer,
        timeline=tuple(timeline),
        holders=holders_at_peak,
        costs=tuple(costs),
        allocated_bytes=allocated,
        accumulator_zeros_bytes=zeros_bytes,
        constants_bytes=constants_bytes,
        copied_weights=(copied_at_peak if TIMED_COPIES and times
                        else frozenset(copy_on_write)),
        held_bytes=held or 0,
    )


def _second_products(flats: list[_Flat], weight_side: Collection[int]) -> dict[int, int]:
    """For each matrix product of two activations that both want a gradient
    (by its index in ``flats``), the input whose gradient runs on the second
    thread (:data:`PRODUCT_GRADIENTS_SIDE_BY_SIDE`): the one made first in
    the forward pass, whose gradient the backward pass needs last."""
    made_at = {t: i for i, f in enumerate(flats) for t in f.outs}
    out = {}
    for i, f in enumerate(flats):
        grads = list(dict.fromkeys(f.input_grads))
        if (f.needs_backward and f.prim.kernel == "matmul" and f.prim.macs and len(grads) == 2
                and not any(t in weight_side for t in grads)):
            out[i] = min(grads, key=lambda t: made_at.get(t, -1))
    return out


def _costs(flats: list[_Flat], tensor_bytes: dict[int, int],
           weight_of: dict[int, int], recomputed: set[int] = frozenset(),
           second_thread: dict[int, int] | None = None) -> list[PrimCost]:
    """Each flat prim's FLOPs and bytes; the gradients of ``weight_of``'s
    tensors (and of ``second_thread``'s, by prim) are the second stream's."""
    second_thread = second_thread or {}
    out = []
    for i, f in enumerate(flats):
        p = f.prim
        if p.alias:
            out.append(PrimCost(f.op.index, 0, 0, 0, 0, 0, 0))
            continue
        out_bytes = sum(b for _, b in p.outputs)
        elements = out_bytes // max(f.op.itemsize, 1)
        fwd = 2 * p.macs + (p.flops if (p.flops or p.macs) else elements)
        fwd_bytes = int(p.passes * (sum(tensor_bytes.get(t, 0) for t in f.ins) + out_bytes))
        per_grad = 2 * p.macs if p.macs else (p.flops or elements)
        bwd_in = bwd_w = bwd_bytes = 0
        transposed = [0, 0]  # (input, weight) streams
        reads = [0, 0]
        fwd_allocs = () if p.inplace else tuple(b for _, b in p.outputs)
        bwd_allocs: tuple[int, ...] = ()
        if f.needs_backward:
            local_of = dict(zip(p.inputs, f.ins))
            reads_transposed = {local_of[ref]: n for ref, n in p.transposed_reads
                                if ref in local_of}
            operand_reads = {local_of[ref]: n for ref, n in p.operand_reads if ref in local_of}
            for t in f.input_grads:
                second = t in weight_of or second_thread.get(i) == t
                if second:
                    bwd_w += per_grad
                else:
                    bwd_in += per_grad
                transposed[second] += reads_transposed.get(t, 0)
                reads[second] += operand_reads.get(t, 0)
            bwd_bytes = int(p.passes * (out_bytes + sum(tensor_bytes.get(t, 0) for t in f.saved)
                                        + sum(tensor_bytes.get(t, 0) for t in f.input_grads)))
            bwd_allocs = tuple(tensor_bytes.get(t, 0) for t in f.input_grads
                               if t in weight_of or not p.grad_inplace)
        out.append(PrimCost(f.op.index, fwd, fwd_bytes, bwd_in, bwd_w, bwd_bytes, p.macs,
                            p.kernel, p.gemm_min_dim, i in recomputed, fwd_allocs, bwd_allocs,
                            p.out_channels, *transposed, *reads, p.conv_gemm))
    return out


def _positions(flats: list[_Flat]) -> list[tuple[_Flat, int]]:
    """Each flat prim with its position within its layer's prims."""
    out = []
    last, pos = None, 0
    for f in flats:
        if f.op is not last:
            last, pos = f.op, 0
        out.append((f, pos))
        pos += 1
    return out


def _resolve_saves(f: _Flat, wants: tuple[int, ...]) -> tuple[int, ...]:
    """Global ids of what this prim's backward needs, given the wanted grads."""
    p = f.prim
    local = dict(zip(p.inputs, f.ins))
    local.update(zip((r for r, _ in p.outputs), f.outs))
    refs = list(p.save)
    wanted = set(wants)
    for ref, needs in p.save_for:
        if local.get(ref) in wanted:
            refs += needs
    ids = []
    for ref in dict.fromkeys(refs):
        if ref not in local:
            raise ValueError(
                f"rule for {f.op.class_name} saves {ref!r}, which prim "
                f"{p.name!r} neither reads nor writes"
            )
        if local[ref] not in ids:
            ids.append(local[ref])
    return tuple(ids)


def _flatten(
    ops: Sequence[LayerOp],
) -> tuple[list[_Flat], dict[int, int], dict[int, int]]:
    """Give every local reference a global tensor id.

    Returns the flat prims, each tensor's bytes, and the weight key of each
    tensor that stands for a weight.
    """
    next_id = 1 + max(
        [t for op in ops for t in (*op.inputs, *op.outputs)], default=0
    )
    tensor_bytes: dict[int, int] = {}
    weight_tensor: dict[int, int] = {}  # weight key -> tensor id
    flats: list[_Flat] = []
    # what a traced weightless op computed, by its signature and the tensors
    # it read: a later call's same op reads the earlier result (grappler
    # merges common subexpressions across the step)
    computed: dict[tuple[str, tuple[int, ...]], int] = {}
    for op in ops:
        refs: dict[str, int] = {f"in{i}": t for i, t in enumerate(op.inputs)}
        refs.update({f"out{i}": t for i, t in enumerate(op.outputs)})
        for w in op.weights:
            if w.key not in weight_tensor:
                weight_tensor[w.key] = next_id
                tensor_bytes[next_id] = w.nbytes
                next_id += 1
            refs[f"w:{w.name}"] = weight_tensor[w.key]
        for t, nbytes in zip(op.outputs, op.output_bytes):
            tensor_bytes[t] = nbytes
        for p in op.prims:
            ins = []
            for ref in p.inputs:
                if ref not in refs:
                    raise ValueError(
                        f"rule for {op.class_name} reads {ref!r} before any prim "
                        f"writes it (prim {p.name!r}); known: {sorted(refs)}"
                    )
                ins.append(refs[ref])
            if p.signature and not _OUT_REF.match(p.outputs[0][0]):
                earlier = computed.setdefault((p.signature, tuple(ins)), next_id)
                if earlier != next_id:
                    refs[p.outputs[0][0]] = earlier
                    continue
            outs = []
            for ref, nbytes in p.outputs:
                if not _OUT_REF.match(ref):
                    refs[ref] = next_id
                    next_id += 1
                elif ref not in refs:
                    raise ValueError(
                        f"rule for {op.class_name} writes {ref!r} but the call "
                        f"has {len(op.outputs)} output(s)"
                    )
                t = refs[ref]
                tensor_bytes[t] = nbytes
                outs.append(t)
            grad_ins = tuple(refs[r] for r in p.grad_inputs())
            flats.append(
                _Flat(op=op, prim=p, ins=tuple(ins), outs=tuple(outs), grad_ins=grad_ins,
                      sparse=tuple(refs[r] for r in p.sparse_grad if r in refs))
            )
    weight_of = {t: key for key, t in weight_tensor.items()}
    return flats, tensor_bytes, weight_of
