"""MemScopeCallback: real TensorFlow on the CPU, and faked GPU readings."""

import csv
import json
import os
import sys
import textwrap
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_memscope as memscope

from . import forked

ROOT = Path(__file__).resolve().parents[1]


def small_model():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile("adam", "mse")
    return model


def data(n=64):
    return np.zeros((n, 8), "float32"), np.zeros((n, 1), "float32")


class FakeSource:
    """Readings for fake GPUs: peaks grow each read; resets are counted."""

    def __init__(self, devices, peak=1000, current=100):
        self._devices = devices
        self.peak = peak
        self.current = current
        self.resets = []
        self.reads = []

    def devices(self, model):
        return list(self._devices)

    def read(self, device):
        self.reads.append(device)
        return self.current, self.peak + 10 * self._devices.index(device)

    def reset(self, device):
        self.resets.append(device)


class BrokenSource(FakeSource):
    def read(self, device):
        raise ValueError("memory stats unavailable")

    def reset(self, device):
        raise ValueError("cannot reset")


def test_keys_reach_history_and_are_positive():
    model = small_model()
    x, y = data()
    cb = memscope.MemScopeCallback(memory_source=FakeSource(["GPU:0"]), device="gpu",
                                   print_fn=lambda s: None)
    hist = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb])
    assert cb.batch_size == 16
    for key in ("memscope_peak_bytes", "memscope_estimate_bytes", "memscope_ratio"):
        assert len(hist.history[key]) == 2
        assert all(v > 0 for v in hist.history[key])
    assert cb.estimate.batch_size == 16


def test_reusable_across_fits_and_infers_new_batch_size():
    model = small_model()
    x, y = data()
    cb = memscope.MemScopeCallback(print_fn=lambda s: None)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[cb])
    assert cb.batch_size == 32 and len(cb.history) == 1


def test_dataset_batch_size_and_explicit_fallback():
    import tensorflow as tf

    model = small_model()
    x, y = data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)
    cb = memscope.MemScopeCallback(print_fn=lambda s: None)
    model.fit(ds, epochs=1, verbose=0, callbacks=[cb])
    assert cb.batch_size == 8
    gen = ((x[i:i + 4], y[i:i + 4]) for i in range(0, 64, 4))
    cb2 = memscope.MemScopeCallback(print_fn=lambda s: None)
    with pytest.warns(UserWarning, match="cannot tell the batch size"):
        model.fit(gen, epochs=1, steps_per_epoch=4, verbose=0, callbacks=[cb2])
    assert cb2.estimate is None


def test_several_fake_gpus_reset_and_per_device_keys():
    model = small_model()
    x, y = data()
    source = FakeSource(["GPU:0", "GPU:1"])
    cb = memscope.MemScopeCallback(batch_size=16, device="gpu", memory_source=source,
                                   print_fn=lambda s: None)
    hist = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb])
    assert hist.history["memscope_peak_bytes_gpu0"] == [1000.0, 1000.0]
    assert hist.history["memscope_peak_bytes_gpu1"] == [1010.0, 1010.0]
    assert hist.history["memscope_peak_bytes"] == [1010.0, 1010.0]
    # reset at train begin and after every reading, for each device
    assert source.resets.count("GPU:0") == 3 and source.resets.count("GPU:1") == 3
    # the estimate is per replica: the global batch split over two devices
    assert cb.estimate.batch_size == 8


def test_exceed_warns_once_and_stop_stops():
    model = small_model()
    x, y = data()
    est = memscope.estimate(model, 16, device="gpu")
    big = FakeSource(["GPU:0"], peak=3 * est.peak_bytes, current=10)
    cb = memscope.MemScopeCallback(batch_size=16, device="gpu", memory_source=big,
                                   print_fn=lambda s: None)
    with pytest.warns(UserWarning, match=r"exceeds the estimate .* by 200%: the step's") as rec:
        model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[cb])
    assert sum("exceeds" in str(w.message) for w in rec) == 1
    stop = memscope.MemScopeCallback(batch_size=16, device="gpu", on_exceed="stop",
                                     memory_source=FakeSource(["GPU:0"], 3 * est.peak_bytes),
                                     print_fn=lambda s: None)
    with pytest.warns(UserWarning, match="stopping training"):
        hist = model.fit(x, y, batch_size=16, epochs=5, verbose=0, callbacks=[stop])
    assert len(hist.history["loss"]) == 1


def test_persistent_cause_named():
    model = small_model()
    x, y = data()
    est = memscope.estimate(model, 16, device="gpu")
    src = FakeSource(["GPU:0"], peak=3 * est.peak_bytes, current=3 * est.peak_bytes)
    cb = memscope.MemScopeCallback(batch_size=16, device="gpu", memory_source=src,
                                   print_fn=lambda s: None)
    with pytest.warns(UserWarning, match="held between steps"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])


def test_arrays_given_to_fit_are_named_among_what_is_held():
    """``fit`` holds the NumPy arrays it is given as tensors in the
    allocator the step uses (``python -m benchmarks.fit_inputs``: a CNN on
    24 MiB of images at b128 Adam held 36.3-36.4 MiB between epochs against
    5.9 estimated, 9.2-10.5 fed by a generator prefetching two batches): where
    the held memory exceeds the estimate, the warning says how much of it
    those arrays are."""
    model = small_model()
    x, y = data(4096)
    est = memscope.estimate(model, 16, device="gpu")
    src = FakeSource(["GPU:0"], peak=3 * est.peak_bytes, current=3 * est.peak_bytes)
    cb = memscope.MemScopeCallback(batch_size=16, device="gpu", memory_source=src,
                                   print_fn=lambda s: None)
    with pytest.warns(UserWarning, match=r"arrays fit\(\) was given \(144.0 KiB of x, y"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    assert cb.data_bytes == x.nbytes + y.nbytes


def test_an_input_pipelines_batches_are_named_among_what_is_held():
    """A ``tf.data`` pipeline that makes each batch anew holds the batches it
    has made and not handed over (``python -m
    benchmarks.steps_per_execution``: the zoo's MLP at b4096 SGD peaked at
    86.7-88.3 MiB in ``fit`` in six processes against 26.0 estimated, 3.9-4.0
    batches of 15.7 MiB more): where the held memory exceeds the estimate,
    the warning names the pipeline and says how many batches the excess is."""
    import tensorflow as tf

    model = small_model()
    x, y = data(256)
    est = memscope.estimate(model, 16, device="gpu")
    batch = est.input_bytes
    held = est.held_bytes or est.persistent_bytes
    src = FakeSource(["GPU:0"], peak=3 * est.peak_bytes + 3 * batch,
                     current=held + 3 * batch)
    cb = memscope.MemScopeCallback(batch_size=16, device="gpu", memory_source=src,
                                   print_fn=lambda s: None)
    pipeline = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).map(lambda a, b: (a + 0, b))
    with pytest.warns(UserWarning, match=r"input pipeline \(a tf.data.Dataset\).*"
                                         r"about 3.0 batches of .* at batch 16"):
        model.fit(pipeline, epochs=1, verbose=0, callbacks=[cb])
    assert cb.data_source == "a tf.data.Dataset" and cb.data_bytes == 0


def test_held_memory_in_the_allocators_chunks_is_not_blamed():
    """Between steps the allocator counts the persistent tensors in its
    chunks (``held_bytes``), more than their requests: such a reading is
    not taken for other tensors alive in the process."""
    from benchmarks import zoo

    model = zoo.upconv1d()
    model.compile(optimizer="adagrad", loss="mse")  # 1.64 MiB requested, 2.04 held (b64)
    est = memscope.estimate(model, 64, device="cpu")
    assert est.held_bytes > 1.1 * est.persistent_bytes
    src = FakeSource(["CPU:0"], peak=3 * est.peak_bytes, current=est.held_bytes)
    cb = memscope.MemScopeCallback(batch_size=64, device="cpu", memory_source=src,
                                   tolerance=0.1, print_fn=lambda s: None)
    x, y = np.zeros((128, 250, 8), "float32"), np.zeros((128, 250, 8), "float32")
    with pytest.warns(UserWarning, match="transient memory") as rec:
        model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=[cb])
    assert not any("held between steps" in str(w.message) for w in rec)


def test_broken_source_never_breaks_training(tmp_path):
    model = small_model()
    x, y = data()
    cb = memscope.MemScopeCallback(batch_size=16, memory_source=BrokenSource(["GPU:0"]),
                                   print_fn=lambda s: None)
    log = tmp_path / "log.csv"
    with pytest.warns(UserWarning, match="cannot read memory of GPU:0"):
        hist = model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                         callbacks=[cb, keras.callbacks.CSVLogger(str(log))])
    assert len(hist.history["loss"]) == 2
    assert all(v != v for v in hist.history["memscope_peak_bytes"])  # NaN
    assert len(list(csv.DictReader(log.open()))) == 2


def test_real_cpu_in_process_never_breaks_training():
    """This process did not set TF_CPU_ALLOCATOR_USE_BFC: readings may be
    unavailable or partial; training goes on and the keys are there."""
    model = small_model()
    x, y = data()
    cb = memscope.MemScopeCallback(print_fn=lambda s: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hist = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb])
    assert len(hist.history["memscope_peak_bytes"]) == 2
    assert cb.estimate is not None and cb.devices == ["CPU:0"]


def test_default_strategy_lists_its_device_without_a_warning():
    """No distribution strategy is the usual case: the device is read without
    a warning (the default strategy has no worker list to ask)."""
    cb = memscope.MemScopeCallback(print_fn=lambda s: None)
    model = small_model()
    x, y = data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    assert cb.devices == ["CPU:0"]
    assert not [w for w in caught if "cannot list devices" in str(w.message)]


def test_model_built_by_its_first_batch_is_estimated():
    """A Sequential model without an Input is built by fit's first batch,
    after on_train_begin: the estimate waits for it instead of giving up."""
    model = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    x, y = data()
    lines = []
    cb = memscope.MemScopeCallback(memory_source=FakeSource(["GPU:0"]), device="gpu",
                                   print_fn=lines.append)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb])
    assert not [w for w in caught if "could not estimate" in str(w.message)]
    assert cb.estimate is not None and cb.estimate.batch_size == 16
    assert len(hist.history["memscope_estimate_bytes"]) == 2
    built = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    assert cb.estimate.peak_bytes == memscope.estimate(built, 16, optimizer="adam",
                                                       device="gpu").peak_bytes
    assert len(lines) == 1 and "estimated training-step peak" in lines[0]


def test_per_batch_logging():
    model = small_model()
    x, y = data()
    cb = memscope.MemScopeCallback(log_every="batch", memory_source=FakeSource(["GPU:0"]),
                                   device="gpu", print_fn=lambda s: None)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    assert [h["batch"] for h in cb.history] == [0, 1, 2, 3]


@pytest.mark.parametrize("kwargs, message", [
    ({"log_every": "step"}, "log_every"), ({"on_exceed": "crash"}, "on_exceed"),
    ({"batch_size": 0}, "batch_size"), ({"tolerance": -1}, "tolerance")])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        memscope.MemScopeCallback(**kwargs)


def _bfc_env():
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


PROFILED_EXAMPLE = r"""
import glob, json, runpy, sys
import tensorflow as tf
from keras_memscope.measure import _xspace_events
example, log, trace = sys.argv[1:4]
sys.argv = [example, log]
tf.profiler.experimental.start(trace)
runpy.run_path(example, run_name="__main__")
tf.profiler.experimental.stop()
events = _xspace_events(glob.glob(trace + "/**/*.xplane.pb", recursive=True)[-1],
                        ("MemoryAllocation", "MemoryDeallocation"))
live, requested, most_requested, most_in_use = {}, 0, 0, 0
for name, stats in events:
    if not str(stats.get("allocator_name", "")).startswith("bfc_cpu"):
        continue
    if name == "MemoryAllocation":
        live[stats["addr"]] = stats.get("requested_bytes") or 0
        requested += live[stats["addr"]]
    else:
        requested -= live.pop(stats["addr"], 0)
    most_requested = max(most_requested, requested)
    most_in_use = max(most_in_use, stats.get("bytes_allocated") or 0)
print(json.dumps([most_requested, most_in_use]))
"""


def test_example_csv_is_the_allocators_reading(tmp_path):
    """The example's CSV carries the keys, the estimate for fit's batch size,
    and peaks that are the allocator's.

    The example runs under TensorFlow's profiler, whose allocator events give,
    over the whole of ``fit``, the most bytes its tensors requested at once
    and the most bytes the allocator had in use (whole chunks: BFC splits a
    free chunk only when it is at least twice the request, so a 7.0 MiB
    activation can take a 10.0 MiB chunk). The busiest epoch's logged peak is
    at least the former, and no epoch's exceeds the latter.

    Not compared with ``memscope.measure``: fit's input pipeline allocates
    between the steps (prefetched batches; in some processes a 6 MiB copy of
    the training array, alive during the steps), so which chunks the step's
    tensors get differs from measure()'s loop of train_on_batch on one held
    batch. Measured on this CPU with oneDNN's kernels: fit's epochs 26-31 MB
    above what is held between them, measure()'s step 24.9 MB; without
    oneDNN's kernels 71-72 against 84.0."""
    log = tmp_path / "log.csv"
    proc = forked.run([sys.executable, "-c", PROFILED_EXAMPLE,
                       str(ROOT / "examples" / "train_with_callback.py"), str(log),
                       str(tmp_path / "trace")], env=_bfc_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "memscope: estimated training-step peak" in proc.stdout
    requested, in_use = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = list(csv.DictReader(log.open()))
    assert len(rows) == 3
    peaks = [float(r["memscope_peak_bytes"]) for r in rows]
    currents = [float(r["memscope_current_bytes"]) for r in rows]
    assert requested <= max(peaks), (peaks, requested)
    assert all(c <= p <= in_use for p, c in zip(peaks, currents)), (peaks, currents, in_use)
    model = keras.Sequential([
        keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    # the example's loss: the callback estimates the model as compiled (an
    # uncompiled model's default loss takes the outputs as probabilities)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    estimate = memscope.estimate(model, 64, device="cpu")
    assert all(float(r["memscope_estimate_bytes"]) == estimate.peak_bytes for r in rows)


def test_mirrored_strategy_two_logical_cpus(tmp_path):
    script = textwrap.dedent("""
        import json, numpy as np, tensorflow as tf, keras
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras_memscope as memscope
        strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
        with strategy.scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                      keras.layers.Dense(1)])
            model.compile("adam", "mse")
        cb = memscope.MemScopeCallback(print_fn=lambda s: None)
        hist = model.fit(np.zeros((64, 8)), np.zeros((64, 1)), batch_size=16, epochs=2,
                         verbose=0, callbacks=[cb])
        print(json.dumps({"devices": cb.devices, "keys": sorted(hist.history),
                          "batch": cb.estimate.batch_size}))
    """)
    proc = forked.run([sys.executable, "-c", script], env=_bfc_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == ["CPU:0", "CPU:1"]
    assert {"memscope_peak_bytes_cpu0", "memscope_peak_bytes_cpu1"} <= set(out["keys"])
    assert out["batch"] == 8  # each replica gets half of the global batch
