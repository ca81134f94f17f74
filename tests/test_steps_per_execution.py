"""``compile(steps_per_execution=N)``: fit's loop fetches the next batch
while a step runs."""

from __future__ import annotations

import keras

import keras_memscope as memscope
from benchmarks import zoo
from benchmarks.steps_per_execution import TRACED
from keras_memscope.measure import synthetic_batch
from keras_memscope.report import totals_rows
from tests.test_measure import _in_fresh_process


def _compiled_mlp(per_call: int) -> keras.Model:
    model = zoo.mlp()
    _, _, loss = synthetic_batch(model, 8)
    model.compile(optimizer="adam", loss=loss, steps_per_execution=per_call)
    return model


def test_a_model_compiled_to_run_several_steps_per_call_counts_the_next_batch():
    one = memscope.estimate(_compiled_mlp(1), 2048, device="cpu")
    four = memscope.estimate(_compiled_mlp(4), 2048, device="cpu")
    batch = one.input_bytes  # 2048 x 1000 float32 inputs, and labels
    assert 2048 * 1000 * 4 < batch < 2048 * 1000 * 4 + 2048 * 8 + 256
    assert (one.input_batches, four.input_batches) == (1, 2)
    assert four.input_bytes == 2 * batch
    # the second batch is alive through the whole step
    assert four.peak_bytes - one.peak_bytes >= batch
    assert any("steps_per_execution=4" in note for note in four.notes)
    assert not any("steps_per_execution" in note for note in one.notes)
    table = totals_rows(four)
    assert any(row[0].startswith("input batches and labels (2") for row in table)
    # an uncompiled model trains one step per call
    assert memscope.estimate(zoo.mlp(), 2048, device="cpu").input_batches == 1


def test_the_next_batch_against_fit():
    """In ``fit`` (a ``tf.data`` pipeline that makes each batch anew, fresh
    processes with the BFC allocator, a profiled epoch), four steps per
    call have one batch more alive at once than one: the MLP at b2048
    Adam, a batch of 7.83 MiB (inputs and labels): the epoch's tensors
    alive at once rose by +7.82 and +8.63 MiB in two runs of ``python -m
    benchmarks.steps_per_execution --traced`` (27.6 -> 35.4 and 36.2 MiB;
    a 0.78 MiB layer output more or less alive at the highest moment), so
    within 15% of a batch. Compared in requested bytes, which leave the
    allocator's layout out: its peaks rose by +8.2 MiB lowest process
    against lowest (six each), and by up to twice that where a batch sits
    in a chunk the allocator did not split."""
    one, four = (_in_fresh_process(TRACED, "mlp", "2048", "adam", str(n)) for n in (1, 4))
    batch = one["batch_bytes"]
    est = memscope.estimate(_compiled_mlp(4), 2048, device="cpu")
    assert est.input_bytes == 2 * batch
    rise = four["live_peak"] - one["live_peak"]
    assert abs(rise - batch) <= 0.15 * batch, (rise / 2**20, batch / 2**20)


def test_a_remedy_keeps_the_steps_per_call():
    """``apply`` compiles the changed model with the user's
    ``steps_per_execution`` (it had compiled it with one step per call), so
    that the changed model holds the next batch as the what-if counted."""
    model = _compiled_mlp(4)
    predicted = memscope.whatif(model, 2048, device="cpu", optimizer="sgd")
    applied = memscope.apply(model, optimizer="sgd")
    assert applied.steps_per_execution == 4
    rebuilt = memscope.estimate(applied, 2048, device="cpu")
    assert predicted.input_batches == rebuilt.input_batches == 2
    assert predicted.peak_bytes == rebuilt.peak_bytes
