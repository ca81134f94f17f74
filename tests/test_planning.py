"""fits, max_batch_size, suggestions, devices and the picture."""

import json

import keras
import pytest

import keras_memscope as memscope
from keras_memscope import devices, planning
from keras_memscope.planning import binsearch_trials, fits, max_batch_size

from .models import seed_mlp, small_cnn


def test_fits_against_explicit_limits():
    model = small_cnn()
    est = memscope.estimate(model, 64, optimizer="adam", device="cpu")
    roomy = fits(model, 64, device="cpu", memory_bytes=est.peak_bytes * 2, optimizer="adam")
    assert roomy.fits and roomy.required_bytes == est.peak_bytes
    assert roomy.headroom_bytes == est.peak_bytes * 2 - est.peak_bytes
    tight = fits(model, 64, device="cpu", memory_bytes=est.peak_bytes, optimizer="adam")
    assert not tight.fits  # within the limit, but not within the 5% safety margin
    assert fits(model, 64, device="cpu", memory_bytes=est.peak_bytes, safety_margin=0,
                optimizer="adam").fits


def test_max_batch_size_is_the_boundary_of_the_estimate():
    model = small_cnn()
    limit = 64 << 20
    best = max_batch_size(model, device="cpu", memory_bytes=limit, safety_margin=0,
                          optimizer="adam")
    assert best > 1
    assert memscope.estimate(model, best, optimizer="adam", device="cpu").peak_bytes <= limit
    assert memscope.estimate(model, best + 1, optimizer="adam", device="cpu").peak_bytes > limit


def test_max_batch_size_zero_when_nothing_fits():
    assert max_batch_size(seed_mlp(), device="cpu", memory_bytes=1 << 20) == 0


def test_suggestions_are_ranked_and_each_estimated():
    model = seed_mlp()  # at this batch, memory grows with the batch
    est = memscope.estimate(model, 4096, optimizer="adam", device="cpu")
    report = fits(model, 4096, device="cpu", memory_bytes=int(est.peak_bytes * 0.6),
                  optimizer="adam")
    assert not report.fits
    singles = [s for s in report.suggestions if s.cost != "combined"]
    assert all(s.required_bytes < est.peak_bytes for s in singles)
    # ranked by memory saved per compute added
    scores = [(est.peak_bytes - s.required_bytes) / (1 + max(s.extra_compute, 0))
              for s in singles]
    assert scores == sorted(scores, reverse=True)
    titles = " | ".join(s.title for s in report.suggestions)
    assert "accumulation" in titles
    # SGD with momentum holds m * momentum of every weight from the step's
    # start (optimizers.early_update): beside the momentum, a weights' worth,
    # as Adam's two slots; no saving at this peak, so not offered
    sgd = memscope.whatif(model, 4096, device="cpu", optimizer=keras.optimizers.SGD(momentum=0.9))
    assert sgd.peak_bytes >= est.peak_bytes * 0.98
    assert "SGD with momentum" not in titles
    acc = next(s for s in report.suggestions if "accumulation" in s.title)
    steps = acc.change["accumulation_steps"]
    assert 4096 % steps == 0  # the same effective batch
    micro = 4096 // steps
    assert f"batch {micro} x {steps} accumulation steps" in acc.title
    assert acc.fits
    # the accumulation suggestion is exactly the estimate of that configuration
    opt = keras.optimizers.Adam(gradient_accumulation_steps=steps)
    again = memscope.estimate(model, micro, optimizer=opt, device="cpu")
    assert again.peak_bytes == acc.required_bytes


def test_bad_inputs():
    with pytest.raises(ValueError, match="no known memory size"):
        fits(seed_mlp(), 8, device="gpu")
    with pytest.raises(ValueError, match="memory_bytes must be a positive integer"):
        fits(seed_mlp(), 8, device="cpu", memory_bytes=-1)
    with pytest.raises(ValueError, match="safety_margin"):
        max_batch_size(seed_mlp(), device="cpu", memory_bytes=1 << 30, safety_margin=1.5)


def test_verify_on_the_cpu_under_a_real_limit():
    """The predicted batch is confirmed by real steps with the CPU allocator
    limited: the verified batch ran within the limit and the next one's
    estimate does not fit."""
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(10)], name="verify_mlp")
    limit = 24 << 20
    result = max_batch_size(model, device="cpu", memory_bytes=limit, safety_margin=0,
                            optimizer="adam", verify=True)
    assert result.verified is not None and result.verified > 0
    assert len(result.trials) <= 8
    assert any(r == "fits" for b, r in result.trials if b == result.verified)
    assert abs(result.verified - result.predicted) / result.predicted < 0.25
    nxt = memscope.estimate(model, result.predicted + 1, optimizer="adam", device="cpu")
    assert nxt.peak_bytes > limit
    assert result.halving_trials == binsearch_trials(result.verified)


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_a_trial_step_over_its_limit_is_out_of_memory(onednn, monkeypatch):
    """Over the allocator limit TensorFlow's own kernels raise
    ResourceExhausted and oneDNN's crash the process (SIGSEGV): both mean
    the batch does not fit, and neither may end ``verify=True`` with an
    error (it did, with oneDNN's kernels). 59 MiB of activations under 16."""
    from .models import pooled_cnn

    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", onednn)
    cpu = devices.get_device("cpu")
    assert planning.trial_step(pooled_cnn(), 512, 16 << 20, cpu, {}) == "out of memory"
    assert planning.trial_step(pooled_cnn(), 2, 256 << 20, cpu, {}) == "fits"


def test_binsearch_trials_by_hand():
    # largest 5: 2 ok, 4 ok, 8 fails (3), then 6 fails, 5 ok (5)
    assert binsearch_trials(5) == 5
    assert binsearch_trials(1) == 1


def test_device_names_are_forgiving():
    for name in ("a100-40gb", "A100 40GB", "NVIDIA A100-SXM4-40GB", "a100_40gb"):
        assert devices.get_device(name).name == "a100-40gb"
    h = devices.get_device("h200")
    # TensorFlow keeps 1800 MiB from its allocator on compute capability 9.x
    assert h.reserved_bytes == 1800 * 1024**2
    assert h.available_bytes == h.memory_bytes - h.overhead_bytes - h.reserved_bytes
    with pytest.raises(ValueError, match="unknown device"):
        devices.get_device("b300")


def test_user_profiles_from_dict_and_file(tmp_path):
    p = devices.get_device({"name": "my-card", "memory_gib": 12, "compute_capability": [7, 5]})
    assert p.kind == "gpu" and p.memory_bytes == 12 * 1024**3
    assert p.reserved_bytes == 1050 * 1024**2
    path = tmp_path / "card.json"
    path.write_text(json.dumps({"name": "box", "kind": "cpu", "memory_bytes": 8 << 30}))
    assert devices.get_device(str(path)).memory_bytes == 8 << 30
    with pytest.raises(ValueError, match="unknown device profile field"):
        devices.get_device({"name": "x", "memry": 1})


def test_plot_file_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    from keras_memscope.plot import memory_vs_batch

    out = tmp_path / "mem.png"
    ests = memory_vs_batch(small_cnn(), str(out), device="t4", optimizer="adam",
                           batch_sizes=[1, 64, 256])
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
    assert [e.batch_size for e in ests] == [1, 64, 256]


def test_scaled_graphs_equal_traced_ones():
    from keras_memscope.estimator import batch_scaler, estimate

    model = small_cnn()
    scaler = batch_scaler(model)
    for b in (1, 5, 40):
        assert estimate(model, b, optimizer="adam", device="cpu", _graphs=scaler) == \
            estimate(model, b, optimizer="adam", device="cpu")
    assert planning._with_scaler(model, {})["_graphs"].ok
