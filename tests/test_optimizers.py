"""Optimizer state equals the bytes of the real optimizer's variables."""

import keras
import numpy as np
import pytest

import keras_memscope as memscope
from keras_memscope.units import dtype_bytes, round_up


def tiny_model():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3)])


def real_state_bytes(model, optimizer):
    optimizer.build(model.trainable_variables)
    return sum(round_up(int(np.prod(v.shape)) * dtype_bytes(keras.backend.standardize_dtype(
        v.dtype))) for v in optimizer.variables)


OPTIMIZERS = [
    lambda: keras.optimizers.SGD(),
    lambda: keras.optimizers.SGD(momentum=0.9),
    lambda: keras.optimizers.SGD(momentum=0.9, nesterov=True),
    lambda: keras.optimizers.Adam(),
    lambda: keras.optimizers.Adam(amsgrad=True),
    lambda: keras.optimizers.AdamW(),
    lambda: keras.optimizers.Adamax(),
    lambda: keras.optimizers.Adadelta(),
    lambda: keras.optimizers.Adagrad(),
    lambda: keras.optimizers.Ftrl(),
    lambda: keras.optimizers.Lamb(),
    lambda: keras.optimizers.Lion(),
    lambda: keras.optimizers.Nadam(),
    lambda: keras.optimizers.RMSprop(),
    lambda: keras.optimizers.RMSprop(momentum=0.9, centered=True),
    lambda: keras.optimizers.Adafactor(),
    lambda: keras.optimizers.Adam(use_ema=True),
    lambda: keras.optimizers.Adam(gradient_accumulation_steps=4),
    lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()),
]
if hasattr(keras.optimizers, "Muon"):
    OPTIMIZERS.append(lambda: keras.optimizers.Muon())


@pytest.mark.parametrize("make", OPTIMIZERS)
def test_state_matches_built_optimizer(make):
    model = tiny_model()
    est = memscope.estimate(model, batch_size=2, optimizer=make(), device="cpu")
    assert est.optimizer_bytes == real_state_bytes(model, make()) + reset_zeros_bytes(
        model, make())


def reset_zeros_bytes(model, optimizer):
    """With gradient accumulation, the zeros each accumulator is reset to
    after an update: one buffer per distinct shape and dtype, held from the
    first step on (measured: ``test_measure.test_gradient_accumulators_between_steps``)."""
    if not optimizer.gradient_accumulation_steps:
        return 0
    shapes = {(tuple(v.shape), v.dtype) for v in model.trainable_variables}
    return sum(round_up(int(np.prod(shape)) * dtype_bytes(dtype)) for shape, dtype in shapes)


def test_adam_is_two_slots_per_variable():
    model = tiny_model()
    est = memscope.estimate(model, batch_size=2, optimizer="adam", device="cpu")
    per_var = [round_up(4 * int(np.prod(v.shape))) for v in model.trainable_variables]
    # two moments per variable, iterations (int64) and learning rate (float32)
    assert est.optimizer_bytes == 2 * sum(per_var) + round_up(8) + round_up(4)


def test_compiled_optimizer_is_used_and_user_optimizer_untouched():
    model = tiny_model()
    opt = keras.optimizers.SGD(momentum=0.9)
    model.compile(optimizer=opt, loss="mse")
    est = memscope.estimate(model, batch_size=2, device="cpu")
    assert est.optimizer.startswith("SGD(momentum=0.9")
    assert not opt.built  # the estimate built a copy, weightlessly


def test_estimate_leaves_no_deferred_variables():
    from keras.src.backend.common import global_state

    memscope.estimate(tiny_model(), batch_size=2, optimizer="adam", device="cpu")
    assert not global_state.get_global_attribute("uninitialized_variables")



def test_slots_name_their_variable_and_what_they_share():
    from keras_memscope.optimizers import optimizer_state

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(6), keras.layers.Dense(6)])
    state = optimizer_state(keras.optimizers.Adam(), model)
    followed = [s.follows for s in state.slots if s.follows is not None]
    paths = [v.path for v in model.trainable_variables]
    assert sorted(followed) == sorted(paths * 2)  # a momentum and a velocity each
    by_key = {}
    for s in state.slots:
        if s.follows is not None:
            by_key.setdefault(s.share_key, set()).add(s.follows)
    # the two 6x6 kernels' four moments start as one buffer, the biases' as another
    assert sorted(len(v) for v in by_key.values()) == [2, 2]
    unshared = [s for s in state.slots if s.follows is None]  # iterations, learning rate
    assert len(unshared) == 2 and all(s.share_key is None for s in unshared)
    assert sum(s.nbytes for s in state.slots) == sum(
        int(np.prod(shape)) * dtype_bytes(dtype) for _, shape, dtype in state.variables)


def test_slots_of_different_starting_values_do_not_share():
    from keras_memscope.optimizers import optimizer_state

    model = tiny_model()
    keys = {s.share_key for s in optimizer_state(keras.optimizers.Adagrad(), model).slots
            if s.follows is not None}
    zeros = {s.share_key for s in optimizer_state(keras.optimizers.RMSprop(), model).slots
             if s.follows is not None}
    assert len(keys) == len(zeros) == 4  # four shapes
    assert not keys & zeros  # Adagrad starts from 0.1, RMSprop from zeros
