"""Records and reports without TensorFlow."""

import json
import subprocess
import sys

from keras_memscope.records import Holder, LayerRecord, Measurement, MemoryEstimate, TimelinePoint
from keras_memscope.units import human_bytes, human_count, round_up, tensor_bytes


def make_estimate() -> MemoryEstimate:
    layer = LayerRecord("dense", "Dense", ((4, 3),), ((4, 2),), ("float32",), 8, 8, 256,
                        256, 0, 24, rule="Dense")
    return MemoryEstimate(
        model_name="m", batch_size=4, method="rules", device="cpu", optimizer="SGD",
        dtype_policy="float32", params=8, trainable_params=8, weights_bytes=512,
        optimizer_bytes=512, input_bytes=256, activations_bytes=256, gradients_bytes=512,
        workspace_bytes=0, allocator_bytes=256, overhead_bytes=1000,
        saved_activations_bytes=256, forward_macs=24, peak_phase="backward",
        layers=(layer,), unsupported={"Foo": 1},
        timeline=(TimelinePoint(0, "forward", "dense", "matmul", 2048),),
        peak_holders=(Holder("dense", "gradient", 512),), notes=("a note",))


def test_peak_is_the_sum_of_its_parts():
    est = make_estimate()
    assert est.persistent_bytes == 512 + 512 + 256
    assert est.peak_bytes == 512 + 512 + 256 + 256 + 512 + 0 + 256
    assert est.total_bytes == est.peak_bytes + 1000


def test_json_round_trip_is_lossless():
    est = make_estimate()
    again = MemoryEstimate.from_json(est.to_json())
    assert again == est
    assert json.loads(est.to_json())["peak_bytes"] == est.peak_bytes


def test_records_are_immutable():
    est = make_estimate()
    try:
        est.unsupported["Bar"] = 2  # type: ignore[index]
    except TypeError:
        pass
    else:
        raise AssertionError("unsupported should be read-only")


def test_measurement_spread_and_round_trip():
    m = Measurement("m", 8, "cpu", "Adam", 100, 50, (80, 100, 90), 10, "BFC", True)
    assert m.spread == (100 - 80) / 100
    assert Measurement.from_dict(m.to_dict()) == m


def test_units():
    assert tensor_bytes((256, 1000), "float32") == 1_024_000
    assert tensor_bytes((2, 3), "bfloat16") == 12
    assert round_up(1) == 256 and round_up(256) == 256 and round_up(0) == 0
    assert human_bytes(1536) == "1.5 KiB"
    assert human_count(86_704_128) == "86.70 M"


def test_reports_import_without_tensorflow():
    code = ("import sys; import keras_memscope.records, keras_memscope.report, "
            "keras_memscope.units; assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_measure_stays_the_function_after_its_module_is_imported():
    """``max_batch_size(verify=True)`` imports the submodule
    ``keras_memscope.measure``; the package's ``measure`` must stay the
    function (it had become the module: "'module' object is not callable")."""
    code = ("import sys, types; import keras_memscope.measure; import keras_memscope as m; "
            "assert isinstance(m.measure, types.FunctionType), m.measure; "
            "assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_summary_rendering_lists_layers_and_totals():
    from keras_memscope.report import render_summary, to_csv

    text = render_summary(make_estimate())
    assert "dense" in text and "allocator peak" in text and "Foo x1" in text
    assert to_csv(make_estimate()).splitlines()[1].startswith("dense,Dense")
