"""Estimates against the real allocator, measured in fresh processes."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import keras
import pytest

import keras_memscope as memscope

from . import forked
from .models import Gated, gated_mlp, raw_text, seed_mlp, small_cnn, two_views, wide_mlp

# The rule engine's target on the CPU allocator is 25% worst case
# (benchmarks/RESULTS.md records the zoo); these small models must meet it.
RULES_WORST = 0.25


@pytest.mark.parametrize("make, batch, optimizer, processes", [
    # How many updates run at once varies from process to process for the MLP
    # (FINDINGS: compare with the band of several processes' maxima); the
    # estimate is for the worst case, the highest maximum.
    (seed_mlp, 256, "adam", 3),
    (small_cnn, 32, "sgd", 1),
])
def test_rules_estimate_against_measurement(make, batch, optimizer, processes):
    model = make()
    runs = [memscope.measure(model, batch, optimizer=optimizer, steps=4, device="cpu")
            for _ in range(processes)]
    # what stays between steps: the weights, the optimizer's slots and the
    # input batch, which every process counts (measure.synthetic_tensor)
    held = (model.count_params() * (1 + {"adam": 2, "sgd": 0}[optimizer])
            + batch * math.prod(model.inputs[0].shape[1:])) * 4
    for measured in runs:
        assert measured.in_subprocess and measured.allocator == "BFC"
        assert len(measured.step_peak_bytes) == 4
        assert held <= measured.persistent_bytes < measured.peak_bytes, (
            held, [m.persistent_bytes for m in runs])
    worst = max(m.peak_bytes for m in runs)
    est = memscope.estimate(model, batch, optimizer=optimizer, device="cpu")
    error = (est.peak_bytes - worst) / worst
    assert abs(error) <= RULES_WORST, (est.peak_bytes, [m.step_peak_bytes for m in runs])


#: Prints a profile's (``path``) BFC allocations and frees in time order:
#: [event, op, bytes, address].
ALLOCS_AND_FREES = r"""
events = _xspace_events(path, ("MemoryAllocation", "MemoryDeallocation"))
print(json.dumps([[n, s.get("tf_op", ""), s.get("requested_bytes", 0), s.get("addr")]
                  for n, s in events]))
"""


PROFILE_ONE_OP = r"""
import glob, json, sys, tempfile
import tensorflow as tf
from keras_memscope.measure import _xspace_events

@tf.function
def step(x):
    return tf.reduce_sum(x * 2.0)

x = tf.ones([512, 1024])
step(x)
logdir = tempfile.mkdtemp()
tf.profiler.experimental.start(logdir)
step(x)
tf.profiler.experimental.stop()
path = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0]
""" + ALLOCS_AND_FREES


def test_profiler_memory_events_in_time_order():
    """The profiler reader used by benchmarks/lstm_schedule.py: the step's 2 MiB
    product is allocated by its op and freed after, in that order."""
    events = _in_fresh_process(PROFILE_ONE_OP)
    product = [e for e in events if e[0] == "MemoryAllocation" and e[2] == 512 * 1024 * 4]
    assert product and product[0][1].endswith("mul"), events
    addr = product[0][3]
    order = [e[0] for e in events if e[3] == addr]
    assert order[:2] == ["MemoryAllocation", "MemoryDeallocation"]


SHARED_SLOTS = r"""
import json
import keras, tensorflow as tf
current = lambda: tf.config.experimental.get_memory_info("CPU:0")["current"]
weights = [keras.Variable(initializer="glorot_uniform", shape=(512, 1024)) for _ in range(3)]
grads = [tf.ones((512, 1024)) for _ in weights]
opt = keras.optimizers.Adam()

@tf.function
def step():
    opt.apply(grads, weights)  # builds the optimizer while tracing, as fit does

start = current()
step.get_concrete_function()
built = current()
step()
first = current()
step()
print(json.dumps([built - start, first - built, current() - first]))
"""


def test_optimizer_slots_start_shared_and_are_copied_at_first_update():
    """What ``optimizers.Slot`` models: Adam built while tracing the step gives
    its six 2 MiB slots (3 variables x 2 moments, all of one shape) one
    starting buffer; the first step writes five copies, the second none."""
    built, first, second = _in_fresh_process(SHARED_SLOTS)
    slot = 512 * 1024 * 4
    assert slot <= built < 2 * slot  # one buffer (and the step counter)
    assert 5 * slot <= first < 6 * slot
    assert second == 0


#: One training step of ``{model}`` profiled after a first: its trace at ``path``.
PROFILED = r"""
import glob, json, sys, tempfile
import numpy as np, keras, tensorflow as tf
from keras_memscope.measure import _xspace_events
{model}
model.train_on_batch(x, y)
logdir = tempfile.mkdtemp()
tf.profiler.experimental.start(logdir)
model.train_on_batch(x, y)
tf.profiler.experimental.stop()
path = glob.glob(f"{{logdir}}/**/*.xplane.pb", recursive=True)[0]
"""

PROFILED_STEP = PROFILED + r"""
events = _xspace_events(path, ("MemoryAllocation",))
print(json.dumps([[s.get("tf_op", ""), s.get("requested_bytes", 0)] for _, s in events]))
"""


def _model_of(model_code: str):
    """The model a snippet of this module builds, in this process."""
    namespace = {"keras": keras, "np": __import__("numpy"), "tf": __import__("tensorflow")}
    exec(model_code, namespace)
    return namespace["model"]


def _rises(est, phase: str, layer: str | None = None) -> list[tuple[str, int]]:
    """(event, change of the live bytes) at each point of the estimate's
    timeline in ``phase`` (of ``layer``)."""
    points = list(est.timeline)
    return [(p.event, p.live_bytes - q.live_bytes) for q, p in zip(points, points[1:])
            if p.phase == phase and (layer is None or p.layer == layer)]


#: The environment of a process that runs oneDNN's kernels on any x86 CPU,
#: for the tests of mechanisms traced with them (TensorFlow turns them on by
#: itself only on some CPUs: ``devices.cpu_uses_onednn``).
ONEDNN = {"TF_ENABLE_ONEDNN_OPTS": "1"}


def _in_fresh_process(code: str, *args: str, env: dict | None = None) -> Any:
    """What ``code`` (with ``args``) prints last, as JSON, run in a fresh
    process with the BFC allocator (and ``env`` beside it): forked from one
    that has imported TensorFlow (``tests/forked.py``)."""
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="3",
               **(env or {}))
    proc = forked.run([sys.executable, "-c", code, *args], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _profiled_allocations(model_code: str, *args: str, env: dict | None = None) -> list:
    """[op, requested bytes] of every allocation in one profiled training
    step (after a first), in a fresh process with the BFC allocator."""
    return _in_fresh_process(PROFILED_STEP.format(model=model_code), *args, env=env)


BATCHES_COUNTED = r"""
import json
import tensorflow as tf
from keras_memscope.measure import synthetic_tensor
def added(make):
    kept, rises = [], []
    for _ in range(12):
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        kept.append(make())
        rises.append(tf.config.experimental.get_memory_info("CPU:0")["current"] - before)
    return rises
print(json.dumps([added(lambda: synthetic_tensor((256, 1000), "float32")),
                  added(lambda: synthetic_tensor((256, 1000), "int32"))]))
"""


def test_every_synthetic_batch_is_in_the_allocator():
    """``measure.synthetic_tensor`` makes a batch the allocator counts, every
    time, in one allocation: ``tf.constant`` of a NumPy array, which
    ``measure()`` used before, sometimes keeps the array's buffer (about one
    in six here), and then a measured peak lacked the batch."""
    ones, zeros = _in_fresh_process(BATCHES_COUNTED)
    size = 256 * 1000 * 4
    # a chunk may be up to twice the request, where BFC does not split it
    assert all(size <= rise < 2 * size for rise in ones + zeros), (ones, zeros)


WEIGHT_DECAY = r"""
model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512, activation="relu"),
                          keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
model.compile(optimizer=keras.optimizers.AdamW(), loss="sparse_categorical_crossentropy")
x, y = tf.ones((64, 256), "float32"), tf.zeros((64,), "int32")
"""


def test_weight_decay_copies_the_weights_gradients_still_read():
    """What ``schedule.simulate`` models for ``decayed`` weights: AdamW's
    ``assign_sub(variable * wd * lr)`` waits for nothing but the forward
    pass's read of the variable, computes one decay product per weight, and
    writes into a new buffer (a copy) when a reader of the weight is still
    pending. When the decays run varies from process to process (all before
    the first gradient op in 12 of 15 processes; otherwise some run after
    their weight's last reader and need no copy), so what always holds is
    that TensorFlow copies no weight the schedule does not: the schedule
    takes the earliest order, a copy of every decayed weight."""
    events = _profiled_allocations(WEIGHT_DECAY)
    kernels, biases = [256 * 512 * 4, 512 * 512 * 4, 512 * 10 * 4], [512 * 4, 512 * 4, 10 * 4]
    weights = Counter(kernels + biases)
    products = Counter(n for op, n in events if op.startswith("adam_w/mul") and n > 4)
    assert products == weights, events
    # (none where every decay ran after its weight's last reader: seen on an
    # Intel Xeon in one process of five)
    copies = Counter(n for op, n in events if "AssignSubVariableOp" in op)
    assert not copies - weights, copies


DENSE_RELU = r"""
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1000, activation="relu"),
                          keras.layers.Dense(1000, activation="relu"), keras.layers.Dense(10)])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((97, 64), "float32"), tf.zeros((97,), "int32")
"""


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_an_activation_gradient_allocates_nothing(onednn, monkeypatch):
    """What ``tfgraph`` models for an element-wise gradient: the ReLU's
    gradient is written into the incoming gradient (nothing else reads it),
    with oneDNN's kernels and without. The gradient ops of the two hidden
    layers allocate their input and weight gradients and nothing of the
    ReLU-output size beyond one input gradient each."""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", onednn)
    events = _profiled_allocations(DENSE_RELU)
    grads = [(op, n) for op, n in events if op.startswith("gradient_tape/")]
    assert grads, events
    assert not [op for op, _ in grads if "Relu" in op], grads
    hidden = 97 * 1000 * 4
    # the input gradients of the second and third layers: one each
    assert sum(1 for _, n in grads if n == hidden) == 2, grads


BRANCHES = r"""
inp = keras.Input((32, 32, 8))
h = keras.layers.Conv2D(16, 3, padding="same")(inp)
branches = [keras.layers.Conv2D(8, 3, padding="same")(keras.layers.Activation("relu")(h))
            for _ in range(3)]
out = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(keras.layers.Add()(branches)))
model = keras.Model(inp, out)
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((16, 32, 32, 8), "float32"), tf.zeros((16,), "int32")
"""


def test_the_same_computation_in_three_layers_runs_once():
    """What ``graph._without_duplicates`` models: three ReLU layers applied to
    one tensor are one op in the function TensorFlow runs (grappler's
    arithmetic optimizer). Run separately, the first two could not write
    into the tensor the others still read: two allocations or more."""
    events = _profiled_allocations(BRANCHES)
    relu_output = 16 * 32 * 32 * 16 * 4
    relus = [(op, n) for op, n in events if op.endswith("/Relu") and n == relu_output]
    assert len(relus) <= 1, events


NORMALIZED = r"""
inp = keras.Input((32, 32, 16))
x = keras.layers.Conv2D(16, 1)(inp)
{before}
out = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(
    keras.layers.BatchNormalization()(x)))
model = keras.Model(inp, out)
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((16, 32, 32, 16), "float32"), tf.zeros((16,), "int32")
"""


@pytest.mark.parametrize("relu", [False, True])
def test_a_gradient_writes_into_an_input_nobody_else_holds(relu):
    """What the schedule models with ``backward_donors``: the
    normalization's gradient computes ``x - mean`` (the variance's
    gradient); after a convolution, which keeps its input and not its
    output, TensorFlow writes it into ``x``; after a ReLU, which keeps its
    output (``x``), it allocates a tensor of its own."""
    events = _profiled_allocations(NORMALIZED.format(
        before="x = keras.layers.ReLU()(x)" if relu else ""))
    size = 16 * 32 * 32 * 16 * 4
    subs = [op for op, n in events if op.startswith("gradient_tape") and n == size
            and op.endswith("moments/sub")]
    assert len(subs) == (1 if relu else 0), events


SPARSE = r"""
model = keras.Sequential([keras.Input((200,), dtype="int32"), keras.layers.Embedding(20000, 64),
                          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(10)])
model.compile(optimizer=sys.argv[1], loss="sparse_categorical_crossentropy")
x, y = tf.ones((64, 200), "int32"), tf.zeros((64,), "int32")
"""


@pytest.mark.parametrize("optimizer, tables", [("adam", 2), ("sgd", 0)])
def test_embedding_gradient_is_densified_only_by_the_update(optimizer, tables):
    """What ``Prim.sparse_grad`` and ``optimizers.sparse_update`` model: an
    Embedding's gradient is IndexedSlices, the output gradient's 64 x 200
    rows, and no table-sized tensor exists until the optimizer's update,
    which under Adam densifies it once per moment (a segment sum each) and
    under SGD scatters it, after which each read of the table is a copy;
    the traced counts say the same."""
    from keras_memscope import optimizers

    events = _profiled_allocations(SPARSE, optimizer)
    table = 20000 * 64 * 4
    made = [op for op, n in events if n == table]
    densified = [op for op in made if "UnsortedSegmentSum" in op]
    assert len(densified) == tables and all(op.startswith(optimizer) for op in densified)
    # a scatter leaves the variable in copy-on-read mode: the next read copies it
    copies = [op for op in made if op.endswith("GatherV2/ReadVariableOp")]
    assert len(copies) == (tables == 0), made
    assert len(made) == len(densified) + len(copies) + 2 * (tables > 0), made  # Mul, Sqrt
    opt = keras.optimizers.get(optimizer)
    assert optimizers.sparse_update(opt)[1:] == (tables, tables == 0)


ACCUMULATORS = r"""
import json
import keras, tensorflow as tf
current = lambda: tf.config.experimental.get_memory_info("CPU:0")["current"]
weights = [keras.Variable(initializer="glorot_uniform", shape=(512, 1024)) for _ in range(3)]
grads = [tf.ones((512, 1024)) for _ in weights]
opt = keras.optimizers.Adam(gradient_accumulation_steps=2)

@tf.function
def step():
    opt.apply(grads, weights)

start = current()
step.get_concrete_function()
held = [current() - start]
for _ in range(4):
    step()
    held.append(current() - start)
print(json.dumps(held))
"""


def test_gradient_accumulators_between_steps():
    """What ``schedule.simulate`` models for ``gradient_accumulation_steps=2``,
    in 2 MiB buffers (3 variables of one shape, Adam): after tracing, one
    starting buffer shared by the moments and accumulators; after the first
    (accumulating) step, each accumulator's own buffer and the zeros constant
    an update resets them to; after the update, the moments' own buffers and
    no accumulator buffer; the next accumulating step brings the three back."""
    held = _in_fresh_process(ACCUMULATORS)
    slot = 512 * 1024 * 4
    assert [round(h / slot) for h in held] == [1, 1 + 3 + 1, 6 + 1, 6 + 1 + 3, 6 + 1]
    assert all(h - round(h / slot) * slot < 64 * 1024 for h in held)  # counters only


def test_highest_order_of_the_gradient_threads_against_measurement():
    """The CPU's two gradient threads interleave as op times fall, and one
    gated MLP step at batch 8 (Adam) peaks at one of a few levels 16 MiB
    apart (one Dense kernel's gradient more or less waiting for its
    update). The eleven simulated orders reach two: 144.5 and 160.5 MiB.
    Which the real steps reach depends on the machine and the run: both, in
    each of three processes, on an AMD EPYC running oneDNN's kernels; on
    an AMD EPYC with AVX2 only and TensorFlow's own kernels 144.4 in most
    steps, 160.4 in one of 18 steps of three processes and in none of 12 of
    two, and once 128.7 (a level no simulated order has). So the highest
    measured step must be one of the simulated orders' levels, and none
    above the estimate, the highest of them: what has to fit."""
    assert Gated  # the measuring process imports tests.models
    model = gated_mlp()
    runs = [memscope.measure(model, 8, optimizer="adam", steps=6, device="cpu")
            for _ in range(2)]
    est = memscope.estimate(model, 8, optimizer="adam", device="cpu")
    assert est.peak_bytes == max(est.history_peaks)
    assert min(est.history_peaks) < 0.95 * est.peak_bytes  # the orders differ here
    steps = [s for r in runs for s in r.step_peak_bytes]
    highest = max(steps)
    nearest = min(est.history_peaks, key=lambda h: abs(h - highest))
    assert abs(highest / nearest - 1) <= 0.02, (steps, est.history_peaks)
    assert highest <= 1.02 * est.peak_bytes, (steps, est.peak_bytes)


def test_accumulation_against_measurement():
    """Every other step starts with the accumulators' own buffers, and an
    update frees each one before its temporaries: the estimate is the highest
    of the two kinds of step. Measured 48.1-48.4 MiB; the estimate is 52.0,
    +7.5%: the simulated allocator puts one 4 MiB moment copy into a free
    7.9 MiB chunk and does not split it, where the real run interleaves the
    two kernels' updates and places it elsewhere."""
    model = wide_mlp()
    opt = lambda: keras.optimizers.Adam(gradient_accumulation_steps=2)  # noqa: E731
    measured = memscope.measure(model, 32, optimizer=opt(), steps=6, device="cpu")
    est = memscope.estimate(model, 32, optimizer=opt(), device="cpu")
    assert abs(est.peak_bytes - measured.peak_bytes) <= 0.10 * measured.peak_bytes, (
        est.peak_bytes, measured.step_peak_bytes)
    assert any("gradient accumulation over 2 steps" in n for n in est.notes)


@pytest.mark.skipif(not hasattr(keras.optimizers, "MultiOptimizer"),
                    reason="Keras without MultiOptimizer")
def test_a_multi_optimizers_updates_against_measurement():
    """A MultiOptimizer updates each variable with its own optimizer: here
    SGD for the three kernels (no slots, nothing made beside the gradient)
    and Adam for the biases. The estimate's orders reach two levels, 16.2
    and 20.3 MiB (one kernel's gradient more or less waiting for its
    update; the estimate the higher); with Adam for every variable it is
    40.3. Which level the real steps reach is a matter of the machine and
    the process: 16.2-20.3 MiB over six processes on an AVX2 EPYC (two of
    them never above 16.7), 16.2-16.6 in all 36 steps of six processes on
    another machine. So the highest measured step must be one of the
    simulated levels (within 5%: they are 25% apart) and none above the
    estimate, the highest of them: what has to fit."""
    def multi():
        return keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(
            keras.optimizers.Adam(), {".*/kernel": keras.optimizers.SGD()}))

    model = wide_mlp()
    runs = [memscope.measure(model, 32, optimizer=multi(), steps=6, device="cpu")
            for _ in range(3)]
    est = memscope.estimate(model, 32, optimizer=multi(), device="cpu")
    assert est.optimizer.startswith("MultiOptimizer")
    assert est.peak_bytes == max(est.history_peaks)
    steps = [s for r in runs for s in r.step_peak_bytes]
    highest = max(steps)
    nearest = min(est.history_peaks, key=lambda h: abs(h - highest))
    assert abs(highest / nearest - 1) <= 0.05, (steps, est.history_peaks)
    assert highest <= 1.05 * est.peak_bytes, (steps, est.peak_bytes)


@pytest.mark.skipif(not hasattr(keras.optimizers, "MultiOptimizer"),
                    reason="Keras without MultiOptimizer")
def test_an_embedding_mapped_to_sgd_is_scattered_under_a_multi_optimizer():
    """An Embedding of 50,000 x 64 under a MultiOptimizer that maps it to
    SGD (Adam for the rest): its sparse gradient is scattered into the
    table, as plain SGD does, not densified twice as Adam's update would.
    Measured 32.6-32.7 MiB in every step; estimated 32.4. Modelled with the
    default optimizer's (Adam's) sparse update it was 56.4, +72%."""
    tokens = keras.Input((64,), dtype="int32")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50000, 64)(tokens))
    model = keras.Model(tokens, keras.layers.Dense(10)(keras.layers.Dense(256, "relu")(x)))

    def multi():
        return keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(
            keras.optimizers.Adam(), {".*embedding.*": keras.optimizers.SGD()}))

    measured = memscope.measure(model, 256, optimizer=multi(), steps=4, device="cpu")
    est = memscope.estimate(model, 256, optimizer=multi(), device="cpu")
    assert abs(est.peak_bytes / measured.peak_bytes - 1) <= 0.05, (
        est.peak_bytes, measured.step_peak_bytes)


EINSUM = r"""
import json, sys
import tensorflow as tf
info = lambda: tf.config.experimental.get_memory_info("CPU:0")
eq, a, b = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
x, y = tf.random.uniform(a), tf.random.uniform(b)
f = tf.function(lambda x, y: tf.einsum(eq, x, y))
f(x, y)
tf.config.experimental.reset_memory_stats("CPU:0")
before = info()["current"]
r = f(x, y)
print(info()["peak"] - before - r.shape.num_elements() * r.dtype.size)
"""


@pytest.mark.parametrize("equation,a,b", [
    ("BTNH,BSNH->BNTS", [32, 64, 4, 32], [32, 64, 4, 32]),  # both operands copied
    ("BNTS,BSNH->BTNH", [16, 4, 64, 64], [16, 64, 4, 32]),  # one, and the result
    ("BTNH,BSNH->BNTS", [8, 128, 4, 32], [8, 64, 4, 32]),
    ("abc,cd->abd", [16, 64, 128], [128, 256]),  # EinsumDense: none
])
def test_einsum_kernel_workspace_against_measurement(equation, a, b):
    """``tfgraph.einsum_workspace`` against one Einsum op run alone in a fresh
    process: the bytes its kernel holds beside its output. The contraction's
    own packing blocks (Eigen, a few hundred KiB) are not modelled."""
    from keras_memscope.tfgraph import einsum_workspace

    measured = _in_fresh_process(EINSUM, equation, json.dumps(a), json.dumps(b))
    model = einsum_workspace(equation, [a, b], 4)
    assert model <= measured <= model + 512 * 1024, (model, measured)


CHAINED_EINSUMS = r"""
class Mix(keras.layers.Layer):
    def build(self, shapes):
        self.w = self.add_weight(shape=(4, 16, 256), initializer="glorot_uniform", name="w")
    def call(self, inputs):
        h, gate = inputs
        y = keras.ops.einsum("bteh,ehd->bted", h, self.w)
        return keras.ops.einsum("bted,bte->btd", y, gate)
tokens = keras.Input((32, 64))
h = keras.layers.Reshape((32, 4, 16))(keras.layers.Dense(64)(tokens))
gate = keras.layers.Dense(4, activation="softmax")(tokens)
out = keras.layers.GlobalAveragePooling1D()(Mix()([h, gate]))
model = keras.Model(tokens, keras.layers.Dense(10)(out))
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((16, 32, 64), "float32"), tf.zeros((16,), "int32")
"""


def test_a_tensor_lives_until_its_last_gradient_reader():
    """Two einsums in one custom layer: ``y = einsum(h, w)`` (2 MiB at batch
    16) is read by the second einsum's gradient (for the gate's) and not by
    its own. TensorFlow frees it once the second einsum's gradient has run;
    the estimate kept it with the einsum that made it, through that einsum's
    gradient (``tfgraph._keep_for_readers``). The gradient the second
    einsum hands the first (``bted``, 2 MiB) is the schedule's allocation
    and no longer also a gradient intermediate (``tfgraph._internal_gradients``).
    The step's most requested bytes alive in a profiled step against the
    estimate's tensors at its peak (activations, gradients, workspace), the
    higher of two processes: within 10%, the spread of three processes here
    (6.4-7.1 MiB); the estimate was 10.8 MiB with both faults, 8.8 with the
    second."""
    from keras_memscope.graph import trace_model
    from keras_memscope.tfgraph import traced_prims

    model = _model_of(CHAINED_EINSUMS)
    call = next(c for c in trace_model(model, 16).calls if type(c.layer).__name__ == "Mix")
    first, second = [p for p in traced_prims(call) if p.name == "Einsum"]
    made = first.outputs[0][0]
    assert made not in first.save and made in second.save
    est = memscope.estimate(model, 16, device="cpu")
    step = est.activations_bytes + est.gradients_bytes + est.workspace_bytes
    most = max(_in_fresh_process(PROFILED_PEAK.format(model=CHAINED_EINSUMS))[0]
               for _ in range(2))
    assert abs(step / most - 1) <= 0.10, (step, most)


BROADCAST_MATMUL = r"""
class Experts(keras.layers.Layer):
    def build(self, shape):
        self.w = self.add_weight(shape=(4, 64, 128), initializer="glorot_uniform", name="w")
    def call(self, x):
        return keras.ops.einsum("btd,edh->bteh", x, self.w)
inputs = keras.Input((32, 64))
h = keras.layers.Reshape((32, 512))(Experts()(keras.layers.Dense(64)(inputs)))
model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(h)))
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((32, 32, 64), "float32"), tf.zeros((32,), "int32")
"""


def test_a_broadcast_matmul_gradient_is_made_for_every_batch_element():
    """Keras runs ``btd,edh->bteh`` as one batched product of the ``(32, 32,
    64)`` input with the ``(64, 512)`` kernel, broadcast over the batch. Its
    gradient with respect to the kernel is the product for every batch
    element, ``(32, 64, 512)`` (4 MiB for a 128 KiB kernel), summed down
    afterwards: one 4 MiB allocation in the profiled step, in the estimate
    the workspace of that operand's gradient (it was missing)."""
    from keras_memscope.graph import trace_model
    from keras_memscope.tfgraph import traced_prims

    size = 32 * 64 * 512 * 4
    events = _profiled_allocations(BROADCAST_MATMUL)
    assert [op for op, n in events if n == size and op.endswith("MatMul/MatMul_1")], events
    model = _model_of(BROADCAST_MATMUL)
    call = next(c for c in trace_model(model, 32).calls
                if type(c.layer).__name__ == "Experts")
    product = next(p for p in traced_prims(call) if p.name == "BatchMatMulV2")
    assert dict(product.workspace_for).get(product.inputs[1]) == size, product
    est = memscope.estimate(model, 32, optimizer="sgd", device="cpu")
    experts = next(r for r in est.layers if r.class_name == "Experts")
    assert experts.workspace_bytes >= size, experts


DEPTHWISE_INIT = r"""
import glob, json, tempfile
import keras, tensorflow as tf
from keras_memscope.measure import _xspace_events
logdir = tempfile.mkdtemp()
tf.profiler.experimental.start(logdir)
layer = keras.layers.DepthwiseConv2D(5)
layer.build((None, 16, 16, 128))
tf.profiler.experimental.stop()
path = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0]
print(json.dumps([s.get("tf_op") for _, s in _xspace_events(path, ("MemoryAllocation",))
                  if str(s.get("allocator_name", "")).startswith("bfc_cpu")
                  and s.get("requested_bytes") == 5 * 5 * 128 * 4]))
"""


def test_depthwise_kernel_initializer_draws():
    """DepthwiseConv2D names its kernel ``kernel`` and its initializer
    ``depthwise_initializer``: building it draws the kernel's random values
    and scales them before the value it keeps, three allocations of the
    kernel's size (a fresh process's allocator), which the estimate's
    persistent allocations now make too (ConvMixer -14.1% -> -9.5%; before,
    the lookup by name found no initializer and made none)."""
    from keras_memscope.estimator import _initializer_temporaries

    ops = _in_fresh_process(DEPTHWISE_INIT)
    assert len(ops) == 3, ops
    model = keras.Sequential([keras.Input((16, 16, 128)), keras.layers.DepthwiseConv2D(5)])
    kernel, bias = model.layers[0].weights
    found = _initializer_temporaries(model)
    assert found[id(kernel)] == len(ops) - 1 and found[id(bias)] == 0


def test_convolution_at_batch_one_against_measurement():
    """The filter gradient's column buffer (24 MiB with TensorFlow's own
    kernels) is as large at batch 1 as at any batch: the estimate had left it
    out at batch 1. With oneDNN's kernels there is none and the step is about
    150 KiB, whose steps vary from process to process (143-169 KiB in 15
    steps of five processes of 3 steps; one process's steps all lay at
    161-169): the estimate (138 KiB) lies within the measured steps' spread,
    give or take 10% (issue 3's criterion), over three processes' steps as
    `benchmarks.accuracy` takes them."""
    model = small_cnn()
    steps = [step for _ in range(3)
             for step in memscope.measure(model, 1, optimizer="adam", steps=3,
                                          device="cpu").step_peak_bytes]
    est = memscope.estimate(model, 1, optimizer="adam", device="cpu")
    assert 0.9 * min(steps) <= est.peak_bytes <= 1.1 * max(steps), (est.peak_bytes, steps)


ESTIMATE_POOLED_CNN = r"""
import json
import keras_memscope as memscope
from keras_memscope.devices import cpu_uses_onednn
from tests.models import pooled_cnn
est = memscope.estimate(pooled_cnn(), 32, optimizer="sgd", device="cpu")
print(json.dumps([cpu_uses_onednn(), est.history_peaks]))
"""


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_convolution_kernels_with_and_without_onednn(onednn, monkeypatch):
    """TensorFlow runs oneDNN's kernels on some CPUs and not on others
    (``TF_ENABLE_ONEDNN_OPTS`` decides where set): the convolution gradients'
    column buffers exist only without them (about 60 MiB of this step's 74),
    and oneDNN's max pooling keeps a workspace. The estimate follows the
    setting of the process it runs in."""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", onednn)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", ESTIMATE_POOLED_CNN], capture_output=True,
                          text=True, env=env, timeout=300, cwd=os.path.dirname(__file__) + "/..")
    assert proc.returncode == 0, proc.stderr[-2000:]
    uses_onednn, orders = json.loads(proc.stdout.strip().splitlines()[-1])
    assert uses_onednn == (onednn == "1")
    from .models import pooled_cnn

    measured = memscope.measure(pooled_cnn(), 32, optimizer="sgd", steps=8, device="cpu")
    # The estimate is the highest of its simulated orders and lies within the
    # measured steps' spread, give or take 10% (issue 3's criterion). The
    # steps vary more than the orders: with oneDNN's kernels 760 steps here
    # (600 of them under the profiler) measured 10.8-16.7 MiB (median about
    # 13.4; 2 steps above 15.6), the
    # orders 12.9-14.2. Traces of the two highest steps: 10.1 MiB of the
    # step's tensors in 14.3 MiB of chunks (the first convolution's 3.5 MiB
    # output in a 6.0 MiB free chunk, which BFC does not split below twice
    # the request), a layout that the steps before left. Without them:
    # 72.3-74.3 MiB, and a few steps at 40-53; the orders 42.0-73.7.
    steps = measured.step_peak_bytes
    estimate = max(orders)
    assert 0.9 * min(steps) <= estimate <= 1.1 * max(steps), (orders, steps)


def test_measure_a_model_with_named_outputs_and_a_loss_per_output():
    """Targets follow the outputs' names and each output's loss (class indices
    for a sparse cross-entropy); the losses travel item by item."""
    from .models import named_outputs

    model = named_outputs()
    model.compile(optimizer="adam", loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"})
    compiled = memscope.measure(model, 16, steps=2, device="cpu")
    import keras

    given = memscope.measure(named_outputs(), 16, steps=2, device="cpu", loss={
        "cls": keras.losses.SparseCategoricalCrossentropy(), "reg": "mse"})
    for measured in (compiled, given):
        assert measured.in_subprocess and measured.peak_bytes > measured.persistent_bytes > 0


def test_measure_an_unregistered_subclassed_model():
    """A subclassed model whose class Keras cannot find by name, and that has no
    ``compute_output_shape``, is rebuilt in the measuring process from its
    module and measured."""
    from .models import unregistered

    measured = memscope.measure(unregistered(), 32, steps=2, device="cpu")
    assert measured.in_subprocess and measured.model_name == "unregistered"
    assert measured.peak_bytes > measured.persistent_bytes > 0


PROFILED_PEAK = PROFILED + r"""
def peak(path):
    live, now, most, made = {{}}, 0, 0, []
    for name, s in _xspace_events(path, ("MemoryAllocation", "MemoryDeallocation")):
        if not str(s.get("allocator_name", "")).startswith("bfc_cpu"):
            continue
        if name == "MemoryAllocation":
            live[s["addr"]] = s.get("requested_bytes") or 0
            now += live[s["addr"]]
            made.append([s.get("tf_op", ""), live[s["addr"]]])
        else:
            now -= live.pop(s["addr"], 0)
        most = max(most, now)
    return [most, made]
# the highest of three profiled steps: which ops run beside which varies
# from step to step
from keras_memscope.measure import _profiled
steps = [peak(path)]
for _ in range(2):
    steps.append(_profiled(lambda: model.train_on_batch(x, y), peak))
print(json.dumps(max(steps, key=lambda s: s[0])))
"""

PRELU = r"""
model = keras.Sequential([keras.Input((32, 32, 16)), keras.layers.Conv2D(32, 3, padding="same"),
                          keras.layers.PReLU(), keras.layers.AveragePooling2D(2),
                          keras.layers.Flatten(), keras.layers.Dense(10)])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((32, 32, 32, 16), "float32"), tf.zeros((32,), "int32")
"""


#: The highest of the three profiled steps of PROFILED_PEAK, and the
#: estimate's tensors at its peak, in the same process.
PEAK_AND_ESTIMATE = r"""
import keras_memscope as memscope
est = memscope.estimate(model, {batch}, device="cpu")
print(json.dumps(max(steps, key=lambda s: s[0])
                 + [est.activations_bytes + est.gradients_bytes + est.workspace_bytes]))
"""


def test_gradient_intermediates_held_beside_all_a_layer_keeps():
    """What ``tfgraph`` models by holding a layer's gradient intermediates
    where its gradient starts as well as where it ends: PReLU keeps both
    ReLU outputs, and its gradient's first ops multiply the incoming
    gradient by each, so five PReLU-sized tensors are alive at the step's
    peak (the highest of three profiled steps: in an occasional step the
    executor orders the products so that only four are). The estimate's
    tensors at its peak (without the allocator's chunks, the weights and the
    batch) are the step's most requested bytes alive; held only where the
    layer's gradient ends, one kept output was already freed (four
    tensors). Traced and estimated with oneDNN's kernels: with TensorFlow's
    own the convolution's gradient column buffers make the step's peak
    (7.05 PReLU-sized tensors in 24 profiled steps here, 10.1 in one of
    them; 7.27 estimated), not the PReLU gradient."""
    most, made, step = _in_fresh_process(
        PROFILED_PEAK.format(model=PRELU) + PEAK_AND_ESTIMATE.format(batch=32), env=ONEDNN)
    size = 32 * 32 * 32 * 32 * 4
    products = [op for op, n in made if n == size and op.startswith("gradient_tape")
                and "/mul/" in op]
    assert len(products) == 2, made
    assert most >= 5 * size, (most, made)
    assert abs(step - most) <= 0.05 * most, (step, most)


UNIT_NORM = r"""
model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024),
                          keras.layers.UnitNormalization(), keras.layers.Dense(10)])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((1024, 512), "float32"), tf.zeros((1024,), "int32")
"""


def test_a_broadcast_products_gradient_is_made_at_full_size():
    """UnitNormalization multiplies its input by one scale a row, ``x *
    inv`` with ``inv`` of shape ``(b, 1)``: TensorFlow's gradient with
    respect to ``inv`` is the input-sized product of the incoming gradient
    with ``x``, summed over the row afterwards. In the profiled steps it is
    made beside the incoming gradient, the layer's input and its output
    (still read by the last Dense layer's kernel gradient): four 4 MiB
    tensors at the step's peak. The estimate holds it at the product's own
    prim (``tfgraph._broadcast_gradients``); before, where it stood among
    the layer's gradient intermediates, the estimate's tensors at its peak
    were three (12.1 against 16.1 MiB)."""
    most, made, step = _in_fresh_process(
        PROFILED_PEAK.format(model=UNIT_NORM) + PEAK_AND_ESTIMATE.format(batch=1024))
    size = 1024 * 1024 * 4
    assert [op for op, n in made if n == size and op.startswith("gradient_tape")
            and "unit_normalization" in op and "/mul/" in op], made
    assert most >= 4 * size, (most, made)
    assert abs(step - most) <= 0.05 * most, (step, most)


GELU_NORM = r"""
model = keras.Sequential([keras.Input((64, 128)), keras.layers.Dense(512, activation="gelu"),
                          keras.layers.Dense(128), keras.layers.LayerNormalization(),
                          keras.layers.Lambda(lambda t: tf.sigmoid(tf.square(t)) * t),
                          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(10)])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((16, 64, 128), "float32"), tf.zeros((16,), "int32")
"""


def test_gradient_ops_that_read_only_forward_tensors_run_in_the_forward_pass():
    """What ``tfgraph`` models by running such gradient ops with the forward
    pass: TensorFlow runs GELU's ``Square`` (of its erfc's argument, for
    the gradient) before any other gradient op that allocates, while
    LayerNormalization's ``x - mean``, held back by a control dependency that
    grappler keeps, waits for the backward pass, and so does a square's
    gradient ``x * 2``, whose constant 2 carries the dependency. (Where the
    ``Square`` runs after the erfc, as on one CI machine, it takes over its
    argument's buffer and allocates nothing: the executed ops, not the
    allocations, show when it ran.) The traced GELU layer computes the
    square with the forward prims, as a prim with no gradient of its own,
    and keeps its result (for the erfc's gradient); the normalization and
    the square keep nothing of the kind."""
    from keras_memscope.graph import trace_model
    from keras_memscope.tfgraph import traced_prims

    events = _in_fresh_process(PROFILED_OPS.format(model=GELU_NORM))
    first_gradient = next(name for kind, name, _ in events if kind == "alloc" and
                          name.startswith("gradient_tape/") and "Gelu/Square" not in name)
    ran = [name for kind, name, _ in events if kind == "op"]
    before = ran[:ran.index(first_gradient)]
    assert [op for op in before if "Gelu/Square" in op], (first_gradient, ran)
    assert not [op for op in ran[ran.index(first_gradient):] if "Gelu/Square" in op], ran
    assert not [op for op in before if "moments/sub" in op], ran
    assert not [op for op in before if "lambda" in op and op.startswith("gradient_tape/")], ran

    model = _model_of(GELU_NORM)
    calls = trace_model(model, 16).calls
    dense, norm, square = ([c for c in calls if c.layer is model.layers[i]][0]
                           for i in (0, 2, 3))
    prims = traced_prims(dense)
    early = [i for i, p in enumerate(prims) if p.differentiable == ()]
    assert early, prims
    kept = {r for i in early for r, _ in prims[i].outputs} & {
        r for p in prims[early[-1] + 1:] for r in p.save}
    assert kept, prims
    for call in (norm, square):
        assert not [p for p in traced_prims(call) if p.differentiable == ()]


GATED = r"""
inputs = keras.Input((1024, 32))
t = keras.layers.Conv1D(32, 2, dilation_rate=2, padding="causal", activation="tanh")(inputs)
s = keras.layers.Conv1D(32, 2, dilation_rate=2, padding="causal", activation="sigmoid")(inputs)
model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Multiply()([t, s])))
model.compile(optimizer="sgd", loss="mse")
x = tf.ones((64, 1024, 32), "float32")
y = tf.zeros((64, 1024, 1), "float32")
"""


def test_identical_ops_of_sibling_layers_computed_once():
    """What ``schedule._flatten`` models with prims' signatures: two causal
    dilated Conv1D layers on one input pad it and rearrange it
    (SpaceToBatchND) the same way, and TensorFlow computes that once (the
    forward pass of a profiled step allocates one rearranged input, which
    both filter gradients read). The estimate keeps it with the first
    convolution and not again with the second: 8 MiB less. (Measured peaks
    of this step fall on 56.5, 64.5 or 72.5 MiB from process to process, the
    allocator's chunks; the estimate is 64.5.)"""
    events = _profiled_allocations(GATED)
    forward = [op for op, n in events if not op.startswith("gradient_tape/")]
    assert sum(1 for op in forward if op.endswith("SpaceToBatchND")) == 1, events
    model = _model_of(GATED)
    est = memscope.estimate(model, 64, optimizer="sgd", device="cpu",
                            method="graph")
    first, second = [r for r in est.layers if r.class_name == "Conv1D"]
    rearranged = 64 * 513 * 2 * 32 * 4  # (batch x 2, 513, 32) after padding by 2
    assert first.activation_bytes - second.activation_bytes >= rearranged * 0.99


TOKENS = r"""
model = keras.Sequential([keras.Input((64,), dtype="int32"), keras.layers.Embedding(2000, 32),
                          keras.layers.Dense(4000)])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x = tf.zeros((16, 64), "int32")
y = tf.zeros((16, 64), "int32")
"""


def test_loss_on_logits_taken_as_probabilities():
    """What ``tfgraph.trace_loss`` models: logits trained with a sparse
    cross-entropy that takes them as probabilities (``measure``'s default for
    an uncompiled model) are clipped (``Minimum`` then ``clip_by_value``),
    their logarithm taken, and the clip's two masks made with the forward
    pass, in TensorFlow's profiled step. ``clip_by_value`` and ``Log`` each
    allocate a new tensor; ``Minimum`` does too, unless the first mask
    (``LessEqual``, on the logits) has finished reading the logits before it
    starts: then it is written into them (which of the two happens is the
    timing of the two threads, from process to process). The loss keeps the
    clipped values, the logarithm (the softmax's gradient is written into
    it) and the masks: 2.5 logits' worth, where the rules keep one. (The
    measured peaks of this step fall on 56.6 or 68-99 MiB from process to
    process, the allocator's chunks; the estimate is 56.0.)"""
    events = _profiled_allocations(TOKENS)
    logits = 16 * 64 * 4000 * 4
    loss = Counter(op.rsplit("/", 1)[-1] for op, n in events
                   if "compile_loss/" in op and n == logits)
    assert loss in ({"Minimum": 1, "clip_by_value": 1, "Log": 1},
                    {"clip_by_value": 1, "Log": 1}), events
    if "Minimum" not in loss:
        order = [op for op, _ in events]
        first_mask = next(i for i, op in enumerate(order) if op.endswith("LessEqual"))
        clipped = next(i for i, op in enumerate(order)
                       if op.endswith("sparse_categorical_crossentropy/clip_by_value"))
        assert first_mask < clipped, events
    masks = [op for op, n in events if n == logits // 4]
    assert len(masks) == 2 and all(op.startswith("gradient_tape/") for op in masks), events
    model = _model_of(TOKENS)
    graph = memscope.estimate(model, 16, optimizer="sgd", device="cpu", method="graph")
    rules = memscope.estimate(model, 16, optimizer="sgd", device="cpu", method="rules")
    assert graph.peak_bytes - rules.peak_bytes >= logits


BFLOAT16_MLP = r"""
keras.mixed_precision.set_global_policy("mixed_bfloat16")
model = keras.Sequential([keras.Input((384,)), keras.layers.Dense(1024, name="fc"),
                          keras.layers.Dense(10, dtype="float32")])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((1000, 384), "float32"), tf.zeros((1000,), "int32")
"""


def _estimated_fc(policy: str, rows: int, depth: int, units: int):
    """The graph estimate's record of the Dense layer ``fc`` of the
    ``BFLOAT16_MLP`` model built under ``policy`` (SGD, on this CPU)."""
    keras.config.set_dtype_policy(policy)
    try:
        model = keras.Sequential([keras.Input((depth,)), keras.layers.Dense(units, name="fc"),
                                  keras.layers.Dense(10, dtype="float32")])
    finally:
        keras.config.set_dtype_policy("float32")
    est = memscope.estimate(model, rows, optimizer="sgd", device="cpu", method="graph")
    return next(r for r in est.layers if r.name == "fc")


@pytest.mark.skipif(not memscope.devices.cpu_native_bfloat16(),
                    reason="oneDNN's bfloat16 kernels: a CPU with AVX512_BF16")
def test_bfloat16_matmul_holds_a_float32_result_not_copies():
    """What ``DeviceProfile.accumulate_dtypes`` models: with oneDNN's kernels
    on this CPU a bfloat16 Dense layer's fused matmul and bias add holds a
    float32 buffer of its result beside its bfloat16 output, its kernel
    gradient a float32 buffer of the kernel (not with AMX: an Intel Xeon's
    trace has the 0.75 MiB gradient and 1.40 MiB of scratch,
    ``DeviceProfile.gradient_buffer_dtypes``), and there are no float32
    copies of the input or the kernel (which TensorFlow's own kernels
    make); the estimate holds the same buffers."""
    events = _profiled_allocations(BFLOAT16_MLP)
    # (the Casts: the kernel's bfloat16 copy, its gradient's float32 one)
    fc = [n for op, n in events if "/fc" in op and "Cast" not in op and n >= 2**18]
    grad = [n for op, n in events
            if "gradient_tape" in op and "/fc" in op and "MatMul" in op]
    rows, depth, units = 1000, 384, 1024
    out16, out32, kernel32 = 2 * rows * units, 4 * rows * units, 4 * depth * units
    assert fc.count(out16) >= 1, fc
    assert [n for n in fc if out32 <= n < out32 + 4096], fc
    amx = memscope.devices.cpu_amx_bfloat16()
    buffers = [n for n in grad if kernel32 <= n < kernel32 + 2**20]
    assert (not buffers) if amx else buffers, grad
    assert memscope.get_device("cpu").gradient_buffer_dtypes == (() if amx else ("bfloat16",))
    assert 4 * rows * depth not in fc and kernel32 not in fc, fc  # no copies
    record = _estimated_fc("mixed_bfloat16", rows, depth, units)
    assert record.workspace_bytes == max(out32, kernel32)


FLOAT16_MLP = BFLOAT16_MLP.replace("mixed_bfloat16", "mixed_float16")


def test_float16_matmul_copies_only_where_onednn_does_not_run_float16():
    """``DeviceProfile.upcast_dtypes`` for float16: TensorFlow's own float16
    MatMul holds float32 copies of both operands and the result; where
    oneDNN runs float16 (a CPU with AVX512_FP16, ``devices.cpu_onednn_runs``)
    it multiplies natively (``ONEDNN_VERBOSE``: ``brg_matmul`` with float16
    operands), and neither the trace nor the estimate has the copies."""
    events = _profiled_allocations(FLOAT16_MLP)
    fc = [n for op, n in events if "/fc" in op and "Cast" not in op and n >= 2**18]
    rows, depth, units = 1000, 384, 1024
    copies = [4 * rows * depth, 4 * depth * units]
    native = memscope.devices.cpu_onednn_runs("float16")
    found = [n for n in fc if n in copies]
    assert (not found) if native else found, fc
    assert fc.count(2 * rows * units) >= 1, fc  # the float16 output
    record = _estimated_fc("mixed_float16", rows, depth, units)
    assert (record.workspace_bytes == 0) == native, record.workspace_bytes


BFLOAT16_CNN = r"""
keras.mixed_precision.set_global_policy("mixed_bfloat16")
inp = keras.Input((32, 32, 8))
h = inp
for i in range(4):
    h = keras.layers.Conv2D(32 * (i + 1), 3, padding="same", activation="relu", name=f"c{i}")(h)
out = keras.layers.Dense(10, dtype="float32")(keras.layers.GlobalAveragePooling2D()(h))
model = keras.Model(inp, out)
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((16, 32, 32, 8), "float32"), tf.zeros((16,), "int32")
"""


def test_ops_reading_only_weights_run_when_the_step_starts():
    """What ``schedule.simulate`` models for ops that read nothing but
    weights: under mixed_bfloat16 every convolution's bfloat16 copy of its
    kernel is made when the step starts (TensorFlow's executor runs an op
    once its inputs are ready, and a variable is ready at once): in this
    trace all four before the first layer's output or just after it (the
    executor's two threads race), and so before the second layer's output,
    not each beside its own layer. The estimate's forward pass makes them
    first. Traced with oneDNN's kernels: with TensorFlow's own, grappler
    leaves no kernel casts in this step to watch."""
    events = _profiled_allocations(BFLOAT16_CNN, env=ONEDNN)
    ops = [op for op, _ in events]
    # the second layer's output: its ReLU's, or its convolution's where
    # grappler fused the two (oneDNN's kernels on a CPU without AVX-512)
    relu = [i for i, op in enumerate(ops) if op.endswith("c1_1/Relu")]
    second_output = relu[0] if relu else next(
        i for i, op in enumerate(ops) if op.endswith("c1_1/convolution"))
    casts = [i for i, op in enumerate(ops) if op.endswith("convolution/Cast")]
    assert len(casts) == 4 and max(casts) < second_output, ops[:second_output + 1]
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        inp = keras.Input((32, 32, 8))
        h = inp
        for i in range(4):
            h = keras.layers.Conv2D(32 * (i + 1), 3, padding="same", activation="relu",
                                    name=f"c{i}")(h)
        out = keras.layers.Dense(10, dtype="float32")(keras.layers.GlobalAveragePooling2D()(h))
        model = keras.Model(inp, out)
    finally:
        keras.config.set_dtype_policy("float32")
    est = memscope.estimate(model, 16, optimizer="sgd", device="cpu", method="graph")
    forward = [(p.layer, p.event) for p in est.timeline if p.phase == "forward"]
    first_conv = forward.index(("c0", "Conv2D"))
    early = {layer for layer, event in forward[:first_conv] if event == "Cast"}
    assert {"c0", "c1", "c2", "c3"} <= early, forward[:first_conv + 1]


GELU_DENSE = r"""
model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="gelu",
                                                                  name="fc"),
                          keras.layers.Dense(10)])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((512, 256), "float32"), tf.zeros((512,), "int32")
"""


def test_an_erfc_gradient_is_written_in_place():
    """What ``tfgraph.FORWARDING_OPS`` and the hoisted ops' reads model for
    GELU's ``erfc``: its gradient multiplies the incoming gradient by the
    erfc it kept (one new tensor), and the rest of it (the erfc's gradient,
    products with the square kept from the forward pass and with constants)
    is written into tensors nobody reads after it: in the profiled step one
    GELU-sized allocation in the backward pass besides the input gradient
    of the Dense after it and the Dense's own. In the forward pass the erfc
    allocates its result: the square its gradient keeps reads the same
    input and runs beside it. The estimate's gradient ops of the GELU (the
    layer's prims other than its MatMul and BiasAdd) allocate no more than
    that: the rises of the step's live bytes at them add up to one such
    tensor (and the next Dense's 40 KiB kernel gradient, on the other
    thread); before, the erfc's gradient allocated a second. Its forward
    erfc does not write into its input. TensorFlow's forward erfc made no
    tensor of its own in 3 of 20 processes here (in 5 of 12 profiled steps
    on an AVX2 EPYC with 1 MiB of L2, where three tries missed it in one CI
    run), and its gradient's product none in one clean-clone run of the
    suite (each reused a freed buffer, as the order of the ops let it): the
    estimate takes the worst case, no step may show more than one product,
    and each allocation is looked for in up to twelve profiled steps."""
    size = 512 * 1024 * 4

    def erfc_allocations(step: list) -> list:
        return [op for op, n in step if op.endswith("Gelu/Erfc") and n == size]

    def backward_products(step: list) -> list:
        # the GELU-sized allocations of its gradient but the hoisted square
        # (forward pass): the one product
        return [op for op, n in step if op.startswith("gradient_tape/") and "Gelu" in op
                and n == size and "Square" not in op]

    erfc_made, products = [], []
    for _ in range(12):
        events = _profiled_allocations(GELU_DENSE)
        assert len(backward_products(events)) <= 1, events
        erfc_made = erfc_made or erfc_allocations(events)
        products = products or backward_products(events)
        if erfc_made and products:
            break
    assert len(products) == 1, events
    model = _model_of(GELU_DENSE)
    est = memscope.estimate(model, 512, optimizer="sgd", device="cpu",
                            method="graph")
    rises = [(event, n) for event, n in _rises(est, "backward", "fc")
             if n > 0 and not event.startswith(("MatMul", "BiasAdd"))]
    assert sum(n for _, n in rises) <= size + 1024 * 10 * 4, rises
    assert erfc_made, events
    from keras_memscope.graph import trace_model
    from keras_memscope.tfgraph import traced_prims

    fc = trace_model(model, 512).calls[0]
    erfc = [p for p in traced_prims(fc) if p.name == "Erfc"]
    assert len(erfc) == 1 and not erfc[0].inplace, erfc


#: The op starts and BFC allocations of one profiled step, in time order.
PROFILED_OPS = PROFILED + r"""
from keras_memscope.measure import _load_xspace
events = []
for plane in _load_xspace(path).planes:
    names = {{k: v.name for k, v in plane.event_metadata.items()}}
    stats = {{k: v.name for k, v in plane.stat_metadata.items()}}
    for line in plane.lines:
        for ev in line.events:
            name = names.get(ev.metadata_id, "")
            at = line.timestamp_ns * 1000 + ev.offset_ps
            if name == "MemoryAllocation":
                st = {{stats.get(s.metadata_id): s.str_value or s.int64_value or s.uint64_value
                      or (stats.get(s.ref_value) if s.ref_value else None) for s in ev.stats}}
                if str(st.get("allocator_name", "")).startswith("bfc_cpu"):
                    events.append((at, "alloc", st.get("tf_op", ""), st.get("requested_bytes", 0)))
            elif name.count(":") == 1 and (line.name.startswith("tf_Compute")
                                           or "Executor" in line.name):
                events.append((at, "op", name.split(":")[0], 0))
events.sort()
print(json.dumps([e[1:] for e in events]))
"""

RECOMPUTED_GELU = r"""
with keras.RematScope(mode="activations"):
    model = keras.Sequential([keras.Input((256,)),
                              keras.layers.Dense(1024, activation="gelu", name="fc"),
                              keras.layers.Dense(10)])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((512, 256), "float32"), tf.zeros((512,), "int32")
"""


def test_a_recomputed_gelu_runs_depth_first():
    """What ``schedule._depth_first`` models: the recomputation of GELU's
    ``0.5 * x * erfc(-x / sqrt(2))`` (its ops are named without the model's
    scope in the profiled step) runs the ``-x`` chain first and ``0.5 * x``
    after it, writing into ``x``, which nothing reads then: it allocates
    nothing. The forward pass made ``0.5 * x`` first, in a buffer of its own.
    The estimate recomputes in that order: ``Neg`` first, the multiply last,
    adding nothing to the step's live bytes."""
    events = _in_fresh_process(PROFILED_OPS.format(model=RECOMPUTED_GELU))
    ran = [name for kind, name, _ in events if kind == "op" and name.startswith("Gelu/")]
    assert "Gelu/Neg" in ran and "Gelu/mul" in ran, ran
    assert ran.index("Gelu/Neg") < ran.index("Gelu/mul"), ran
    made = [name for kind, name, n in events if kind == "alloc" and n >= 512 * 1024 * 4]
    assert "Gelu/Neg" in made and "Gelu/mul" not in made, made

    model = _model_of(RECOMPUTED_GELU)
    est = memscope.estimate(model, 512, optimizer="sgd", device="cpu",
                            method="graph")
    again = _rises(est, "recompute", "fc")
    assert again[0] == ("Neg", 512 * 1024 * 4), again
    assert again[-1] == ("Mul", 0), again


DENSE_ON_SEQUENCES = r"""
model = keras.Sequential([keras.Input((64, 128)), keras.layers.Dense(512, name="fc"),
                          keras.layers.Dense(256, name="fc2"),
                          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(10)])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((32, 64, 128), "float32"), tf.zeros((32,), "int32")
"""


def test_a_reshape_gradient_is_a_view():
    """What ``tfgraph.VIEW_GRADIENT_OPS`` models: a Dense layer on a 3-D
    input reshapes it to 2-D for its matmul and the result back, and the
    gradient of each Reshape is a Reshape of the incoming gradient, which
    TensorFlow's kernel makes by sharing the buffer. In the profiled step no
    gradient op named Reshape allocates; in the estimate the Reshapes'
    gradients add nothing to the step's live bytes (they had a buffer of
    their own before)."""
    events = _profiled_allocations(DENSE_ON_SEQUENCES)
    assert any(op.startswith("gradient_tape/") and "Tensordot/MatMul" in op
               for op, _ in events), events
    assert not [op for op, n in events if op.startswith("gradient_tape/") and "Reshape" in op]
    model = _model_of(DENSE_ON_SEQUENCES)
    est = memscope.estimate(model, 32, optimizer="sgd", device="cpu",
                            method="graph")
    reshapes = [(event, n) for event, n in _rises(est, "backward") if event == "Reshape"]
    assert reshapes and all(rise <= 0 for _, rise in reshapes), reshapes


POOLED = r"""
model = keras.Sequential([keras.Input((32, 32, 1)),
                          keras.layers.Conv2D(16, 3, activation=activation),
                          keras.layers.MaxPooling2D(), keras.layers.GlobalAveragePooling2D(),
                          keras.layers.Dense(10)])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((16, 32, 32, 1), "float32"), tf.zeros((16,), "int32")
"""


@pytest.mark.parametrize("activation", [None, "relu"])
def test_max_pooling_gradient_takes_over_what_nothing_else_holds(activation, monkeypatch):
    """What ``Prim.grad_forwards`` and ``Prim.grad_into_input`` model:
    TensorFlow's ``MaxPoolGrad`` allocates an int64 index per pooled element
    always, and copies the pooled output and writes the input gradient into
    the buffers of the tensors they copy where nothing else holds those: here
    nothing reads the pooled output after the pooling (the average pooling's
    gradient needs its shape), and the convolution's output is held only by
    the pooling's gradient, unless a ReLU's gradient reads it too. The
    estimate's pooling gradient makes the same allocations (graph and
    rules). (TensorFlow's
    own kernels, on any CPU: oneDNN's max pooling keeps a workspace instead.)"""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    monkeypatch.setattr(memscope.devices, "cpu_uses_onednn", lambda: False)
    pooled = 16 * 15 * 15 * 16
    code = f"activation = {activation!r}" + POOLED
    made = sorted(n for op, n in _profiled_allocations(code) if "MaxPoolGrad" in op)
    expected = sorted([8 * pooled] + ([4 * 16 * 30 * 30 * 16] if activation else []))
    assert made == expected, made

    # (the allocator model that counts what is asked for: BFC gives a chunk
    # of up to twice the request whole)
    exact = dataclasses.replace(memscope.devices.get_device("cpu"), allocator="exact")
    model = _model_of(code)
    for method, event in (("graph", "MaxPool"), ("rules", "max_pool")):
        est = memscope.estimate(model, 16, optimizer="sgd", device=exact, method=method)
        points = list(est.timeline)
        at = [(q, p) for q, p in zip(points, points[1:])
              if p.phase == "backward" and p.event == event]
        assert len(at) == 1, (method, [(p.phase, p.event) for p in points])
        before, after = at[0]
        assert after.live_bytes - before.live_bytes == sum(expected) - 8 * pooled, method
        assert after.high_bytes - before.live_bytes == sum(expected), method


GROUPED = r"""
inputs = keras.Input((256, 16))
x = keras.layers.Conv1D(32, 5, padding="same", groups=4, activation="relu")(inputs)
x = keras.layers.MaxPooling1D(2)(x)
x = keras.layers.Conv1D(64, 5, padding="same", groups=4, activation="relu", name="grouped")(x)
model = keras.Model(inputs, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(x)))
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((32, 256, 16), "float32"), tf.zeros((32,), "int32")
"""

#: One profiled step's BFC allocations and frees: [event, op, bytes, address].
PROFILED_FREES = PROFILED + ALLOCS_AND_FREES


def test_an_xla_compiled_gradient_writes_every_gradient_at_once(monkeypatch):
    """What ``schedule.simulate`` models for a prim with ``always_grads`` (a
    gradient XLA compiles: a grouped convolution's on the CPU): one op
    computes the input and the filter gradient, so nothing of it runs on
    beside the layers' gradients before it. In the profiled step the
    grouped convolution's output gradient (the average pooling's ``Tile``)
    is freed before the max pooling's gradient allocates; in the estimate
    the convolution's weight gradients are written before the max pooling's
    gradient too, in every simulated order (a weight-gradient job outlasting
    the input gradient in some orders put the Poisson net's estimate 20%
    above its measured peak)."""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    events = _in_fresh_process(PROFILED_FREES.format(model=GROUPED))
    tile = next(e[3] for e in events if e[0] == "MemoryAllocation" and e[1].endswith("Tile"))
    freed = next(i for i, e in enumerate(events) if e[0] == "MemoryDeallocation" and e[3] == tile)
    pooling = next(i for i, e in enumerate(events) if "MaxPoolGrad" in e[1])
    assert freed < pooling, events

    est = memscope.estimate(_model_of(GROUPED), 32, optimizer="sgd", device="cpu",
                            method="graph")
    done = [(p.layer, p.event) for p in est.timeline if p.phase == "backward"]
    written = done.index(("grouped", "PartitionedCall (weight gradients)"))
    assert written < next(i for i, (layer, _) in enumerate(done) if layer == "max_pooling1d"), done


TOWERS = r"""
encoder = keras.Sequential([keras.Input((48, 48, 1)), keras.layers.Conv2D(32, 3, activation="relu"),
                            keras.layers.MaxPooling2D(), keras.layers.GlobalAveragePooling2D()],
                           name="encoder")
a, b = keras.Input((48, 48, 1)), keras.Input((48, 48, 1))
diff = keras.layers.Subtract()([encoder(a), encoder(b)])
model = keras.Model([a, b], keras.layers.Dense(1, activation="sigmoid")(diff))
model.compile(optimizer="sgd", loss="binary_crossentropy")
x = [tf.ones((64, 48, 48, 1), "float32") for _ in range(2)]
y = tf.zeros((64, 1), "float32")
"""


def test_independent_towers_run_side_by_side():
    """What ``schedule._two_threads`` models: TensorFlow's executor runs the
    two towers of a shared encoder on its two threads, so the profiled step
    makes both towers' convolution outputs (16.5 MiB each) before either
    tower's pooling. The estimate's forward pass makes them in the same
    order (it ran one tower after the other before). A step that ran one
    tower after the other was seen in one of nine processes here: the order
    is looked for in up to three processes."""
    seen = []
    for _ in range(3):
        events = _profiled_allocations(TOWERS)
        forward = [op for op, n in events
                   if n >= (1 << 20) and not op.startswith("gradient_tape")]
        seen.append(forward[:3])
        if (len(forward) > 2 and all("Relu" in op for op in forward[:2])
                and "MaxPool" in forward[2]):
            break
    else:
        raise AssertionError(f"no process ran the towers side by side: {seen}")
    model = _model_of(TOWERS)
    est = memscope.estimate(model, 64, optimizer="sgd", device="cpu", method="graph")
    forward = [(p.layer, p.event) for p in est.timeline if p.phase == "forward"]
    convs = [i for i, (_, event) in enumerate(forward) if event == "Conv2D"]
    pools = [i for i, (_, event) in enumerate(forward) if event == "MaxPool"]
    assert len(convs) == 2 and max(convs) < min(pools), forward


SKIP_SUM = r"""
inp = keras.Input((1024, 16))
branches = [keras.layers.Conv1D(32, 3, padding="same", name=f"c{i}")(inp) for i in range(4)]
h = keras.layers.Add(name="total")(branches)
model = keras.Model(inp, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(h)))
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
x, y = tf.ones((32, 1024, 16), "float32"), tf.zeros((32,), "int32")
"""


def test_a_sum_of_more_than_two_waits_for_all_its_inputs():
    """Grappler's arithmetic optimizer turns an ``Add`` of four tensors (three
    additions) into one ``AddN``: no partial sum is made while a branch is
    still to run, so all four branch outputs (4 MiB each) are alive together
    before the sum. In the profiled step the sum allocates (if at all) only
    after the fourth branch's output; the estimate, whose two threads would
    otherwise add the first two branches as soon as they exist, holds all
    four at once in its forward pass."""
    events = _profiled_allocations(SKIP_SUM)
    forward = [op for op, n in events if not op.startswith("gradient_tape")]
    last_branch = max(i for i, op in enumerate(forward) if "/c3_" in op or "/c3/" in op)
    assert not [op for op in forward[:last_branch] if "total" in op], forward
    model = _model_of(SKIP_SUM)
    est = memscope.estimate(model, 32, optimizer="sgd", device="cpu", method="graph")
    forward_points = [p for p in est.timeline if p.phase == "forward"]
    first_sum = next(i for i, p in enumerate(forward_points) if p.layer == "total")
    convs = {p.layer for p in forward_points[:first_sum] if p.layer.startswith("c")}
    assert convs == {"c0", "c1", "c2", "c3"}, [(p.layer, p.event) for p in forward_points]


TEXT_CONV = r"""
model = keras.Sequential([keras.Input((300,), dtype="int32"),
                          keras.layers.Embedding(20000, 128, name="emb"),
                          keras.layers.Conv1D(filters, 5, activation="relu", name="conv"),
                          keras.layers.GlobalMaxPooling1D(), keras.layers.Dense(5)])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
x, y = tf.ones((64, 300), "int32"), tf.zeros((64,), "int32")
"""

#: Whether the Embedding's update starts before its output (which the
#: convolution's filter gradient reads) is freed, in each of twelve profiled
#: steps (a race: on an Intel Xeon 3 and 12 of 16 steps in two processes).
UPDATE_BESIDE = r"""
import json
import numpy as np, keras, tensorflow as tf
from keras_memscope.measure import _profiled, _xspace_events
{model}
model.train_on_batch(x, y)
beside = []
for _ in range(12):
    events = [(n == "MemoryAllocation", s.get("tf_op", ""), s.get("addr"))
              for n, s in _profiled(lambda: model.train_on_batch(x, y), lambda path: _xspace_events(
                  path, ("MemoryAllocation", "MemoryDeallocation")))]
    gather = next(i for i, (a, op, _) in enumerate(events) if a and op.endswith("emb_1/GatherV2"))
    freed = next(i for i, (a, _, addr) in enumerate(events)
                 if i > gather and not a and addr == events[gather][2])
    densified = next(i for i, (a, op, _) in enumerate(events) if a and "UnsortedSegmentSum" in op)
    beside.append(densified < freed)
print(json.dumps(beside))
"""


#: What the estimate's peak holds for the text convolution with 1 and 128
#: output channels (the model's code follows, from TEXT_CONV).
UPDATE_HELD = r"""
import json
import keras, tensorflow as tf
import keras_memscope as memscope
held = {}
for filters in (1, 128):
    exec(MODEL)
    est = memscope.estimate(model, 64, optimizer="adam", device="cpu", method="graph")
    held[filters] = sorted({(h.layer, h.kind) for h in est.peak_holders})
print(json.dumps(held))
"""


def test_an_update_runs_beside_the_last_filter_gradient():
    """What ``schedule.simulate`` models once the input gradients are done:
    the first thread is free, and the updates whose gradients are written run
    on it beside a weight gradient still running on the second. An
    Embedding's gradient is ready when the next convolution's input gradient
    is, and in some of the profiled steps Adam densifies it (a table-sized
    segment sum) before the convolution's filter gradient has freed the
    embedding's output it reads. Whether the filter gradient is still running when the
    update makes the rest of its temporaries depends on their times: with one
    output channel the filter gradient is short, and the estimate does not
    hold the embedding's output at its peak (83.5 MiB; 83.7-83.8 measured in
    three processes); with 128 channels it outlasts the update in the
    highest simulated order, whose peak holds it (94.0 MiB, the update's
    ops run one at a time on the free thread; 85.0-94.1 measured; 102.6 with
    its two segment sums and Square held together, 82.6 before the update
    ran beside the job). Traced and estimated with oneDNN's
    kernels: TensorFlow's own give the filter gradient a column buffer (31.8
    MiB with one channel), at whose peak the update has not started (115.8
    MiB estimated, 113.8 measured in two processes). Whether it does is a
    race of two threads that differs from process to process: 2-4 of the
    twelve profiled steps of most processes, none in about one of five
    (six processes here: 4, 4, 2, 3, 4, 3 of 12); up to two processes are
    profiled."""
    code = UPDATE_BESIDE.format(model="filters = 1\n" + TEXT_CONV)
    beside = _in_fresh_process(code, env=ONEDNN)
    if not any(beside):
        beside += _in_fresh_process(code, env=ONEDNN)
    assert any(beside), beside
    held = {int(k): {tuple(h) for h in v}
            for k, v in _in_fresh_process(f"MODEL = {TEXT_CONV!r}\n" + UPDATE_HELD,
                                           env=ONEDNN).items()}
    for filters in (1, 128):
        assert ("emb", "optimizer update") in held[filters], held
    assert ("emb", "activation") not in held[1], held
    assert ("emb", "activation") in held[128], held


def test_held_between_steps_in_the_allocators_chunks():
    """What the allocator counts between steps is the persistent tensors in
    the chunks it gave them: the 1-D autoencoder (b64, Adagrad) requests
    1.64 MiB of weights, slots and batch, and a fresh process holds 2.05
    MiB; the simulated allocator's count between steps (``held_bytes``)
    is 2.04 MiB, within 5%."""
    from benchmarks import zoo

    est = memscope.estimate(zoo.upconv1d(), 64, optimizer="adagrad", device="cpu")
    assert est.held_bytes >= est.persistent_bytes
    measured = memscope.measure(zoo.upconv1d(), 64, optimizer="adagrad", steps=2,
                                device="cpu")
    assert abs(est.held_bytes / measured.persistent_bytes - 1) <= 0.05, (
        est.held_bytes, est.persistent_bytes, measured.persistent_bytes)
    # the requests alone are far below it
    assert est.persistent_bytes < 0.9 * measured.persistent_bytes


def test_a_models_own_train_step_is_noted_and_measured():
    """A model that overrides ``train_step`` (here two forward passes under
    one tape) trains with its own step; the estimate, of Keras' step, says
    so, and ``measure`` runs the model's own. The two-pass step measured
    25.0 MiB (b32 Adam) against 12.6 estimated, the estimate of the same
    layers as a plain Functional model. The own step's second pass keeps a
    second copy of the activations (8 MiB): on a CPU without oneDNN's
    kernels both steps also hold the convolutions' column buffers (27 MiB
    at most), once each (measured 76.0 MiB against 46-58)."""
    own, plain = two_views(), two_views(own_step=False)
    est = memscope.estimate(own, 32, optimizer="adam", device="cpu")
    (note,) = [n for n in est.notes if "train_step" in n]
    assert note.startswith("TwoViews.train_step replaces Keras' training step")
    baseline = memscope.estimate(plain, 32, optimizer="adam", device="cpu")
    assert not [n for n in baseline.notes if "train_step" in n]
    assert est.peak_bytes == baseline.peak_bytes
    measured = memscope.measure(own, 32, optimizer="adam", steps=3, device="cpu")
    keras_step = memscope.measure(plain, 32, optimizer="adam", steps=3, device="cpu")
    activations = sum(r.activation_bytes for r in baseline.layers)
    assert measured.peak_bytes >= keras_step.peak_bytes + activations, (
        activations, measured.step_peak_bytes, keras_step.step_peak_bytes)


def test_a_model_that_vectorizes_raw_text_is_estimated_and_measured():
    """TextVectorization inside the model: TensorFlow cannot infer the
    first dimension of its padded tokens (ragged strings made dense), which
    the estimate takes as the batch's and says so; its adapted vocabulary,
    which the layer's config does not hold, travels to the measuring
    process in a saved model (before, the estimate refused the model and
    the measurement failed on an empty lookup table). The training step is
    that of the same layers over int tokens."""
    model = raw_text()
    est = memscope.estimate(model, 64, optimizer="adam", device="cpu")
    assert any("could not infer the first dimension" in n for n in est.notes), est.notes
    tokens = memscope.estimate(raw_text(vectorize=False), 64, optimizer="adam", device="cpu")
    assert abs(est.peak_bytes - tokens.peak_bytes) <= 0.01 * tokens.peak_bytes
    measured = [memscope.measure(model, 64, optimizer="adam", steps=4, device="cpu")
                for _ in range(2)]
    highest = max(m.peak_bytes for m in measured)
    # the CPU's two gradient threads take either order from step to step:
    # the highest step lies within the simulated orders' peaks
    low, high = min(est.history_peaks), max(est.history_peaks)
    assert 0.9 * low <= highest <= 1.1 * high, (
        est.history_peaks, [m.step_peak_bytes for m in measured])


RAW_TEXT_IN_PROCESS = r"""
import json
import keras_memscope as memscope
from tests.models import raw_text
m = memscope.measure(raw_text(), 64, optimizer="adam", steps=2, device="cpu", in_process=True)
print(json.dumps([m.in_subprocess, list(m.step_peak_bytes)]))
"""


def test_a_model_that_vectorizes_raw_text_is_measured_in_process():
    """In a process started with the BFC allocator the measurement trains a
    copy of the model: saved and loaded where a layer keeps a vocabulary
    (a clone's lookup table would be empty)."""
    in_subprocess, peaks = _in_fresh_process(RAW_TEXT_IN_PROCESS)
    assert not in_subprocess and len(peaks) == 2 and min(peaks) > 0


def test_an_allocator_without_statistics_is_named_not_a_tensorflow_error(monkeypatch):
    """Measuring in this process where the CPU's allocator keeps no
    statistics (TensorFlow's default one on a CPU without oneDNN's, the BFC
    variable unset) says what to set, not TensorFlow's "Cannot reset memory
    stats"."""
    import tensorflow as tf

    def refuse(device):
        raise ValueError(f"Cannot reset memory stats for device '{device}'")

    monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", refuse)
    with pytest.raises(RuntimeError, match="TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow"):
        memscope.measure(seed_mlp(), 4, optimizer="sgd", steps=1, device="cpu", in_process=True)
