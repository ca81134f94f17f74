"""Models too big to build: weightless estimates, configs, per-device memory."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import pytest
from keras.src.backend.common import global_state

import keras_memscope as memscope

from . import forked, models

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.parametrize("name", sorted(set(models.ZOO) - {"subclassed"}))
def test_weightless_build_gives_the_same_estimate(name):
    build = models.ZOO[name]
    keras.utils.clear_session()
    real = memscope.estimate(build(), 8, optimizer="adam", device="cpu")
    keras.utils.clear_session()
    weightless = memscope.estimate(build, 8, optimizer="adam", device="cpu")
    assert weightless == real
    assert not global_state.get_global_attribute("uninitialized_variables")


def test_configs_json_and_keras_files(tmp_path):
    model = models.small_cnn()
    model.compile("sgd", "sparse_categorical_crossentropy")
    real = memscope.estimate(model, 8, device="cpu")
    path = tmp_path / "m.keras"
    model.save(path)
    from_file = memscope.estimate(str(path), 8, device="cpu")
    assert from_file.optimizer == "SGD"  # from the file's compile config
    assert from_file.peak_bytes == real.peak_bytes
    from_dict = memscope.estimate(keras.saving.serialize_keras_object(model), 8,
                                  optimizer="sgd", device="cpu")
    from_json = memscope.estimate(json.dumps(model.get_config()), 8, optimizer="sgd",
                                  device="cpu")
    assert from_dict.weights_bytes == from_json.weights_bytes == real.weights_bytes
    assert not global_state.get_global_attribute("uninitialized_variables")


def test_keras_file_loss_sizes_the_labels(tmp_path):
    """A .keras file's compile config carries its loss (serialized): a sparse
    cross-entropy's labels are class ids, not values shaped like the output."""
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy())
    path = tmp_path / "sparse.keras"
    model.save(path)
    est = memscope.estimate(str(path), 32, device="cpu")
    assert est.input_bytes == 32 * 8 * 4 + 32 * 8
    assert not any("not compiled" in n for n in est.notes)


def test_bad_sources():
    with pytest.raises(ValueError, match="no such file"):
        memscope.estimate("missing.keras", 2)
    with pytest.raises(TypeError, match="cannot tell what model"):
        memscope.estimate("resnet", 2)
    with pytest.raises(ValueError, match="not valid JSON"):
        memscope.estimate("{oops", 2)
    with pytest.raises(TypeError, match="returned int"):
        memscope.estimate(lambda: 3, 2)


def test_later_stateless_scope_allocates_nothing_of_ours():
    """The trap: deferred variables are allocated by the next top-level
    stateless scope; the ones the tool made are no longer waiting."""
    memscope.estimate(models.seed_mlp, 4, optimizer="adam", device="cpu")
    assert not global_state.get_global_attribute("uninitialized_variables")
    with keras.StatelessScope():
        pass


def test_30_gb_model_without_allocating_it():
    """A 6.7-billion-parameter decoder (27 GB of float32 weights, more than this
    machine's memory with Adam's state) estimated in a fresh process: its peak
    resident memory stays under 2 GB."""
    script = textwrap.dedent("""
        import json, time
        import keras_memscope as memscope
        from benchmarks.zoo import decoder_7b
        from keras_memscope.measure import peak_rss_bytes
        t = time.time()
        est = memscope.estimate(decoder_7b, 1, optimizer="adam", device="h200")
        print(json.dumps({"params": est.params, "weights": est.weights_bytes,
                          "peak": est.peak_bytes, "seconds": time.time() - t,
                          "rss": peak_rss_bytes()}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["params"] == 6_738_415_616
    assert out["weights"] > 26 * 10**9  # float32 weights alone
    assert out["rss"] < 2 * 1024**3, out
    assert out["seconds"] < 30


def test_mirrored_strategy_on_two_logical_cpus():
    """Two logical CPU devices share one allocator, so the measurement is their
    total: memory held between steps is twice the per-device persistent
    estimate, and the peak lies between two persistent parts plus one step's
    transient and twice the per-device peak (the replicas' transients may or
    may not coincide)."""
    script = textwrap.dedent("""
        import json, numpy as np, tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras, keras_memscope as memscope
        def build():
            return keras.Sequential([keras.Input((256,)),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
        strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
        with strategy.scope():
            model = build()
            model.compile("adam", "sparse_categorical_crossentropy")
        x = np.random.rand(256, 256).astype("float32")
        ds = tf.data.Dataset.from_tensor_slices((x, np.zeros(256, "int32"))).batch(256)
        model.fit(ds.repeat(), steps_per_epoch=2, epochs=1, verbose=0)
        peaks = []
        for _ in range(4):
            tf.config.experimental.reset_memory_stats("CPU:0")
            model.fit(ds, epochs=1, verbose=0)
            peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
        current = tf.config.experimental.get_memory_info("CPU:0")["current"]
        est = memscope.estimate(build(), 256, optimizer="adam", device="cpu",
                                distribution=strategy)
        print(json.dumps({"peak": max(peaks), "current": current, "devices": est.devices,
                          "device_batch": est.device_batch_size,
                          "persistent": est.persistent_bytes, "est_peak": est.peak_bytes}))
    """)
    proc = forked.run([sys.executable, "-c", script], env=_env(TF_CPU_ALLOCATOR_USE_BFC="true"),
                      timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 2 and out["device_batch"] == 128
    # persistent_bytes counts requested bytes; the allocator counts chunks, and
    # variables the optimizer rewrites by copy move into chunks of up to twice
    # their size (measured 3% and 16% over in two runs): within 25%, the
    # estimates' target
    assert abs(out["current"] / (2 * out["persistent"]) - 1) < 0.25
    low = 2 * out["persistent"] + (out["est_peak"] - out["persistent"])
    assert 0.9 * low <= out["peak"] <= 2 * out["est_peak"]


def test_model_parallel_layout_bytes_on_tensorflow():
    from keras_memscope.distribution import per_device_variable_bytes, sharding_of

    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"],
                                         devices=[f"cpu:{i}" for i in range(8)])
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*d1.*kernel"] = (None, "model")
    layout_map[".*d2.*kernel"] = ("model", None)
    dist = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, name="d1"),
                              keras.layers.Dense(32, name="d2")], name="mp")
    sharding = sharding_of(model, distribution=dist)
    # kernels split 4 ways along their "model" dimension, biases replicated
    assert per_device_variable_bytes(model, sharding) == {
        "mp/d1/kernel": 64 * 128 // 4 * 4, "mp/d1/bias": 128 * 4,
        "mp/d2/kernel": 128 // 4 * 32 * 4, "mp/d2/bias": 32 * 4}
    est = memscope.estimate(model, 16, optimizer="adam", device="cpu", distribution=dist)
    assert est.devices == 8 and est.device_batch_size == 8  # batch split over 2
    full = memscope.estimate(model, 8, optimizer="adam", device="cpu")
    assert est.weights_bytes < full.weights_bytes
    assert est.optimizer_bytes < full.optimizer_bytes  # slots follow their variable


def test_model_parallel_bytes_equal_jax_shards():
    """On the JAX backend, with 8 CPU devices: the per-device bytes equal the
    size of each variable's addressable shard."""
    pytest.importorskip("jax", reason="JAX is not installed (pip install jax)")
    script = textwrap.dedent("""
        import json, keras
        from keras_memscope.distribution import per_device_variable_bytes, sharding_of
        devices = keras.distribution.list_devices()
        mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], devices=devices)
        lm = keras.distribution.LayoutMap(mesh)
        lm[".*d1.*kernel"] = (None, "model")
        lm[".*d2.*kernel"] = ("model", None)
        lm[".*emb.*embeddings"] = ("model", None)
        dist = keras.distribution.ModelParallel(layout_map=lm, batch_dim_name="batch")
        keras.distribution.set_distribution(dist)
        x = keras.Input((10,), dtype="int32")
        h = keras.layers.Embedding(1000, 64, name="emb")(x)
        h = keras.layers.Dense(128, name="d1")(h)
        model = keras.Model(x, keras.layers.Dense(30, name="d2")(h), name="jm")
        ours = per_device_variable_bytes(model, sharding_of(model, distribution=dist))
        jax = {v.path: v.value.addressable_shards[0].data.nbytes for v in model.weights}
        print(json.dumps({"ours": ours, "jax": jax}))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
        env=_env(KERAS_BACKEND="jax", XLA_FLAGS="--xla_force_host_platform_device_count=8"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ours"] == out["jax"]
    d2 = next(k for k in out["ours"] if k.endswith("d2/kernel"))
    assert out["ours"][d2] == 128 // 4 * 30 * 4  # sharded along its 128 rows


def test_keras_hub_backbone_from_constructor_arguments():
    keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is not installed "
                                    "(pip install 'keras-memscope[hub]')")

    def build():
        return keras_hub.models.LlamaBackbone(
            vocabulary_size=1000, num_layers=2, num_query_heads=4, hidden_dim=64,
            intermediate_dim=128, num_key_value_heads=4)

    est = memscope.estimate(build, 2, optimizer="adam", device="cpu",
                            input_shape=[(16,), (16,)])
    assert est.params == build().count_params()
    assert not est.unsupported
    assert not global_state.get_global_attribute("uninitialized_variables")
