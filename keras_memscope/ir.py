"""The small op language that cost rules speak and the step simulator runs.

A rule describes one layer call as a short list of :class:`Prim` operations,
each naming the tensors it reads and writes by local reference: ``"in0"``,
``"in1"`` ... are the call's inputs, ``"out0"`` ... its outputs, ``"w:NAME"``
the layer's weight called NAME (``"w:kernel"``), any other name a tensor
private to the call. A weight is an input like any other, whose gradient goes
to the optimizer. A prim also says which tensors its gradient needs (so they
stay alive until the backward pass), which inputs receive a gradient, and
whether its output may take over an input's buffer (TensorFlow forwards the
buffer of an element-wise op's input when nothing else holds it).

No framework import: rules build these from shapes and dtypes only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Prim:
    """One primitive operation of a layer's forward pass.

    Attributes:
        name: what the op is, for reports (``"matmul"``, ``"relu"``).
        inputs: local references of the tensors it reads.
        outputs: ``(reference, bytes)`` of the tensors it creates.
        save: references its backward needs whatever gradients are wanted.
        save_for: ``(input, references)`` pairs: what the gradient with respect
            to that input needs (a matmul's weight gradient needs its input).
        differentiable: inputs that receive a gradient (``None``: all inputs).
        inplace: inputs whose buffer output 0 may take over when nothing else
            holds it (element-wise ops).
        alias: output 0 is a view of input 0 (reshape): no allocation at all.
        forward_workspace_bytes: temporary bytes alive only while it runs.
        forward_workspace_pieces: how many equal allocations those bytes are
            (a list's elements, each its own: a loop layer's input list).
        backward_workspace_bytes: temporary bytes alive only while its gradient runs.
        backward_workspace_parts: the sizes of the allocations those bytes
            are (a gradient's intermediates are separate tensors, not one
            block); empty: one allocation.
        backward_workspace_parts_if_free, backward_donors: the parts of its
            backward workspace when nothing but this layer holds the inputs
            named in ``backward_donors`` (its gradient ops write into them,
            as TensorFlow forwards a buffer whose last reader they are).
        backlog_parts: allocations its gradient may hold beside its workspace
            at worst, which the estimate does not assume (a recurrent loop
            running ahead of its weight-gradient sums: one partial gradient of
            every kernel per timestep ahead); ``simulate(worst_case=True)``
            holds them, which gives the estimate's ``possible_extra_bytes``.
        backward_thread_parts: how many of the last ``backward_workspace_parts``
            are one per CPU thread running its gradient's kernels at once (a
            loop body's column buffers): while a weight gradient still runs on
            the second thread, one of them.
        workspace_for: ``(input, bytes)`` pairs: more temporary bytes while the
            gradient with respect to that input is computed.
        always_grads: ``(input, bytes)`` pairs: input gradients its gradient
            computes whether they are wanted or not (an XLA-compiled gradient
            returns every one of them): where one is not wanted (a model
            input's), a temporary of its size while the gradient runs.
        output_pieces: ``(output, n)`` pairs: that output is n equal
            allocations (what a loop pushes one timestep at a time).
        grad_inplace: its input gradient may take over the buffer of its output
            gradient (element-wise gradients).
        grad_read_together: two of its gradient ops read the output gradient
            and become ready together (a product's ``dy * b`` and ``dy * a``).
            TensorFlow's CPU executor runs them side by side when its second
            thread is free, and neither writes into the output gradient then;
            with the second thread busy (a weight gradient running) they run
            one after the other and the second can write into it.
        macs: multiply-accumulates of the forward op, whole batch (matmuls,
            convolutions); each input's gradient costs as many again.
        flops: other floating-point operations of the forward op (pooling
            compares, reductions, element-wise math); when neither ``macs``
            nor ``flops`` is given, one per output element is assumed.
        passes: how many times the op's kernels stream its data through
            memory (a normalization's moments read the input twice and write a
            temporary): multiplies its bytes moved, for the time model.
        kernel: the kernel family for the time model: ``"matmul"``,
            ``"conv"``, ``"conv_transpose"`` (a transposed convolution),
            ``"reduce"``, or ``""`` (element-wise).
        gemm_min_dim: for a matmul, its smallest dimension (rows, contraction
            or columns): skinny matrix products run far below peak speed.
        out_channels: for a convolution, its output channels (oneDNN's
            kernels take as long for fewer than one vector of them as for
            one: ``timing.conv_lane_factor``).
        conv_gemm: for a 2-D convolution (channels last), ``(batch, image,
            filter_total, out_channels)``: the products its gradients are on
            TensorFlow's own CPU kernels (``timing.conv_gradient_products``).
        signature: what computes its one output apart from the tensors it
            reads (op type, attributes, constant inputs), for a traced op
            that reads no weight; two such prims of different calls with one
            signature on the same tensors compute one tensor, which
            grappler's common-subexpression pass merges (two causal Conv1D
            layers on one input pad it once). Empty: never merged.
        role: ``"activation"`` for the prims of a layer's activation function
            (what Keras' ``RematScope("activations")`` recomputes).
        compute_dtype, upcast_workspace: a matmul in float16 or bfloat16 on a
            device without kernels for that type (``DeviceProfile.upcast_dtypes``:
            TensorFlow's own CPU kernels) computes in float32 through float32
            copies of its operands and result: ``(input, bytes)`` pairs of
            those copies while the gradient with respect to that input runs,
            and ``("", bytes)`` while the forward kernel runs (see
            :func:`with_upcast`).
        accumulate_workspace: the same pairs for a device whose kernels
            multiply that type natively into a float32 buffer of the result
            (``DeviceProfile.accumulate_dtypes``: oneDNN's bfloat16 kernels
            on a CPU with AVX512_BF16): a matmul fused with its bias add, and
            the gradient with respect to the second operand (``a^T @ dy``,
            a reduction over the rows).
        sparse_grad: weights whose gradient is ``IndexedSlices`` made of output
            0's gradient (a gather's: one row per looked-up id, a view of the
            output gradient): no table-sized gradient is written; the
            optimizer's update densifies it as its code does.
        grad_passes: inputs whose gradient is output 0's gradient itself, no
            buffer of its own (a ``tf.custom_gradient`` function whose
            gradient returns the upstream gradient as it came: a
            straight-through estimator, Keras' float8 quantize-dequantize).
        transposed_reads: ``(input, bytes)`` pairs: the bytes the kernel of
            the gradient with respect to that input reads transposed (a
            batched product's ``adj_x`` or ``adj_y`` operand, and with
            ``tfgraph.DENSE_TRANSPOSED_READS`` a ``MatMul``'s kernel in its
            input gradient ``dy @ W^T``, as the gradient op in the traced
            step has it), which TensorFlow's own
            CPU kernels read about half as fast (``timing.op_time``'s
            ``transposed_read`` rate; ``benchmarks/matmul_forms.py``).
        operand_reads: ``(input, bytes)`` pairs: the bytes of its operands
            the kernel of the gradient with respect to that input reads (a
            product of two activations: the output gradient and the other
            operand), for ``timing``'s ``gemm_read`` rate where a profile
            has one.
        grad_forwards: ``(tensor, bytes)`` pairs: a temporary of its gradient
            kernel written into the buffer of that tensor (an input or output
            it saved) where nothing else holds the tensor then, and allocated
            where something does (TensorFlow's ``MaxPoolGrad`` copies the
            pooled output: ``forward_input_or_allocate_temp``).
        grad_into_input: inputs whose gradient is written into their own
            buffer where nothing else holds them then (``MaxPoolGrad``'s
            ``forward_input_or_allocate_output`` on the pooling's input).
        hoisted: a gradient op that runs with the forward pass, as TensorFlow's
            executor runs it once the forward tensors it reads exist (GELU's
            ``Square``; ``tfgraph._hoist``): not part of a forward pass run
            without the gradient tape (a recomputed region's).
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, int], ...]
    save: tuple[str, ...] = ()
    save_for: tuple[tuple[str, tuple[str, ...]], ...] = ()
    differentiable: tuple[str, ...] | None = None
    inplace: tuple[str, ...] = ()
    alias: bool = False
    forward_workspace_bytes: int = 0
    forward_workspace_pieces: int = 1
    backward_workspace_bytes: int = 0
    backward_workspace_parts: tuple[int, ...] = ()
    backward_workspace_parts_if_free: tuple[int, ...] = ()
    backward_donors: tuple[str, ...] = ()
    backlog_parts: tuple[int, ...] = ()
    backward_thread_parts: int = 0
    workspace_for: tuple[tuple[str, int], ...] = ()
    always_grads: tuple[tuple[str, int], ...] = ()
    output_pieces: tuple[tuple[str, int], ...] = ()
    grad_inplace: bool = False
    grad_read_together: bool = False
    macs: int = 0
    flops: int = 0
    passes: float = 1.0
    kernel: str = ""
    gemm_min_dim: int = 0
    out_channels: int = 0
    conv_gemm: tuple[int, ...] = ()
    signature: str = ""
    role: str = ""
    compute_dtype: str = ""
    upcast_workspace: tuple[tuple[str, int], ...] = ()
    accumulate_workspace: tuple[tuple[str, int], ...] = ()
    sparse_grad: tuple[str, ...] = ()
    grad_passes: tuple[str, ...] = ()
    hoisted: bool = False
    transposed_reads: tuple[tuple[str, int], ...] = ()
    operand_reads: tuple[tuple[str, int], ...] = ()
    grad_forwards: tuple[tuple[str, int], ...] = ()
    grad_into_input: tuple[str, ...] = ()

    def grad_inputs(self) -> tuple[str, ...]:
        return self.inputs if self.differentiable is None else self.differentiable

    def renamed(self, names: Mapping[str, str] | Callable[[str], str],
                name: str | None = None) -> Prim:
        """This prim with every reference ``x`` replaced by ``names(x)``, or
        by ``names[x]`` where a mapping has it."""
        r = (lambda x: names.get(x, x)) if isinstance(names, Mapping) else names
        return dataclasses.replace(
            self,
            name=self.name if name is None else name,
            inputs=tuple(map(r, self.inputs)),
            outputs=tuple((r(x), n) for x, n in self.outputs),
            save=tuple(map(r, self.save)),
            save_for=tuple((r(k), tuple(map(r, v))) for k, v in self.save_for),
            differentiable=None if self.differentiable is None
            else tuple(map(r, self.differentiable)),
            inplace=tuple(map(r, self.inplace)),
            workspace_for=tuple((r(k), v) for k, v in self.workspace_for),
            output_pieces=tuple((r(k), v) for k, v in self.output_pieces),
            upcast_workspace=tuple((r(k) if k else k, v) for k, v in self.upcast_workspace),
            transposed_reads=tuple((r(k), v) for k, v in self.transposed_reads),
            operand_reads=tuple((r(k), v) for k, v in self.operand_reads),
            grad_forwards=tuple((r(k), v) for k, v in self.grad_forwards),
            grad_into_input=tuple(map(r, self.grad_into_input)),
            accumulate_workspace=tuple((r(k) if k else k, v)
                                       for k, v in self.accumulate_workspace),
            sparse_grad=tuple(map(r, self.sparse_grad)),
            grad_passes=tuple(map(r, self.grad_passes)),
            backward_donors=tuple(map(r, self.backward_donors)),
        )


def with_upcast(p: Prim, dtypes: Sequence[str], accumulate: Sequence[str] = (),
                gradient_buffers: Sequence[str] | None = None) -> Prim:
    """``p`` on a device that computes matmuls of ``dtypes`` in float32 (its
    float32 copies join its forward and gradient workspaces) and those of
    ``accumulate`` into a float32 buffer of the result (that buffer joins
    them: the fused forward's, and the weight gradient's for the types in
    ``gradient_buffers``, all of ``accumulate`` where None)."""
    if p.compute_dtype in dtypes:
        pairs = p.upcast_workspace
    elif p.compute_dtype in accumulate:
        pairs = p.accumulate_workspace
        if gradient_buffers is not None and p.compute_dtype not in gradient_buffers:
            pairs = tuple((k, n) for k, n in pairs if not k)
    else:
        return p
    if not pairs:
        return p
    forward = sum(n for k, n in pairs if not k)
    extra = dict(p.workspace_for)
    for k, n in pairs:
        if k:
            extra[k] = extra.get(k, 0) + n
    return dataclasses.replace(p, forward_workspace_bytes=p.forward_workspace_bytes + forward,
                               workspace_for=tuple(extra.items()), upcast_workspace=(),
                               accumulate_workspace=())


def upcast_bytes(a_elements: int, b_elements: int, out_elements: int) -> int:
    """The float32 copies a matmul of a lower-precision type holds while it
    runs where the device computes it in float32: its two operands and its
    result."""
    return 4 * (a_elements + b_elements + out_elements)


def matmul_upcast(dtype: str, a: tuple[str, int], b: tuple[str, int],
                  out_elements: int, fused_bias: bool = False) -> dict[str, object]:
    """The ``compute_dtype``, ``upcast_workspace`` and ``accumulate_workspace``
    of a matmul ``a @ b`` (each operand as ``(reference, elements)``).

    Upcast (TensorFlow's own kernels): the forward kernel and each gradient
    kernel hold float32 copies of two operands and their result, the three
    matrices of the product, ``4 x (|a| + |b| + |out|)`` bytes.

    Accumulate (oneDNN's bfloat16 kernels; allocator traces of a Dense MLP
    and of a Transformer at batch 2048 rows): a matmul fused with its bias
    add holds a float32 buffer of its result while it runs (8 MiB beside a 4
    MiB bfloat16 output); the gradient with respect to ``b`` (``a^T @ dy``)
    holds a float32 buffer of that gradient and some 0.2-0.4 MiB more; the
    unfused forward matmul and the gradient with respect to ``a`` hold
    under 0.3 MiB (not modelled)."""
    if dtype not in ("float16", "bfloat16"):
        return {}
    total = upcast_bytes(a[1], b[1], out_elements)
    accumulate = ((("", 4 * out_elements),) if fused_bias else ()) + ((b[0], 4 * b[1]),)
    return {"compute_dtype": dtype,
            "upcast_workspace": (("", total), (a[0], total), (b[0], total)),
            "accumulate_workspace": accumulate}


def max_pool_grad(pooled: str, pooled_bytes: int, pooled_elements: int,
                  source: str | None) -> dict[str, object]:
    """The gradient fields of a max pooling that TensorFlow's own CPU kernel
    (``MaxPoolingGradOp``) differentiates: an int64 index per pooled
    element, always; a copy of the pooled output ``pooled``, in its buffer
    where nothing else holds it then; the input gradient, in the buffer of
    the pooling's input ``source`` (if known) where nothing else holds that
    (profiled alone: exactly those three allocations, in that order)."""
    return {"backward_workspace_bytes": 8 * pooled_elements,
            "grad_forwards": ((pooled, pooled_bytes),),
            "grad_into_input": (source,) if source is not None else ()}


def prim(
    name: str,
    inputs: Sequence[str],
    outputs: Sequence[tuple[str, int]],
    **kwargs: object,
) -> Prim:
    """Build a :class:`Prim` from lists (a convenience for rules)."""
    for key in ("save", "inplace", "upcast_workspace", "accumulate_workspace", "backlog_parts",
                "sparse_grad", "grad_passes", "grad_into_input"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])  # type: ignore[arg-type]
    for key in ("workspace_for", "output_pieces", "always_grads",
                "transposed_reads", "operand_reads", "grad_forwards"):  # (reference, count) pairs
        if key in kwargs:
            given = kwargs[key]
            items = given.items() if isinstance(given, dict) else given  # type: ignore[union-attr]
            kwargs[key] = tuple((k, int(v)) for k, v in items)  # type: ignore[union-attr]
    if "save_for" in kwargs:
        given = kwargs["save_for"]
        items = given.items() if isinstance(given, dict) else given  # type: ignore[union-attr]
        kwargs["save_for"] = tuple((k, tuple(v)) for k, v in items)  # type: ignore[union-attr]
    if kwargs.get("differentiable") is not None:
        kwargs["differentiable"] = tuple(kwargs["differentiable"])  # type: ignore[arg-type]
    return Prim(name=name, inputs=tuple(inputs), outputs=tuple(outputs), **kwargs)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class WeightUse:
    """A variable read by a layer call; ``key`` identifies it model-wide."""

    key: int
    name: str
    nbytes: int
    trainable: bool
    dtype: str = "float32"
    shape: tuple[int, ...] = ()
    path: str = ""


@dataclasses.dataclass(frozen=True)
class LayerOp:
    """One layer call lowered to prims, with its tensors named globally.

    ``inputs``/``outputs`` are global tensor ids; ``output_bytes`` the bytes of
    each output. The simulator maps ``"inN"``/``"outN"`` to them.
    ``constants`` are ``(key, bytes)`` of the constants grappler folds the
    call's forward and gradient ops into, held between steps (graph method:
    ``tfgraph.folded_constants``; equal keys are one constant).
    """

    index: int
    name: str
    class_name: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    output_bytes: tuple[int, ...]
    prims: tuple[Prim, ...]
    weights: tuple[WeightUse, ...]
    itemsize: int = 4  # bytes per element of the call's outputs
    constants: tuple[tuple[str, int], ...] = ()
