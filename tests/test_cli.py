"""The memscope command end to end."""

import json
import subprocess
import sys

import pytest

from keras_memscope import cli


def run(*args):
    return subprocess.run([sys.executable, "-m", "keras_memscope.cli", *args],
                          capture_output=True, text=True)


def test_summary_from_module_function_as_json(capsys):
    code = cli.main(["summary", "tests.models:seed_mlp", "--batch-size", "256",
                     "--optimizer", "adam", "--device", "cpu", "--format", "json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["params"] == 131_410
    assert data["method"] == "graph"  # the default on TensorFlow
    assert data["peak_bytes"] == sum(data[k] for k in (
        "weights_bytes", "optimizer_bytes", "input_bytes", "constants_bytes",
        "activations_bytes", "gradients_bytes", "workspace_bytes", "allocator_bytes"))


def test_summary_with_the_rules_method(capsys):
    code = cli.main(["summary", "tests.models:seed_mlp", "--batch-size", "256",
                     "--device", "cpu", "--format", "json", "--method", "rules"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["method"] == "rules"


def test_summary_from_keras_file_as_csv(tmp_path, capsys):
    from tests.models import small_cnn

    path = tmp_path / "m.keras"
    small_cnn().save(path)
    assert cli.main(["summary", str(path), "--batch-size", "4", "--format", "csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("name,class_name") and len(out) > 3


def test_summary_from_application_table(capsys):
    assert cli.main(["summary", "--app", "MobileNetV2", "--input-shape", "96,96,3",
                     "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "allocator peak" in out and "Conv1" in out


@pytest.mark.parametrize("args, message", [
    (["summary", "missing.keras"], "no such file"),
    (["summary", "--app", "ResNet5"], "unknown application 'ResNet5'"),
    (["summary", "tests.models:nothing"], "has no callable 'nothing'"),
    (["summary", "what"], "cannot tell what 'what' is"),
    (["summary", "tests.models:seed_mlp", "--device", "tpu"], "unknown device 'tpu'"),
    # the library's hint, in the command line's own words
    (["fit", "tests.models:seed_mlp", "--batch-size", "8", "--device", "gpu"],
     "no known memory size: name a device (e.g. --device a100-40gb) or give --memory SIZE"),
    (["summary", "tests.models:unbuilt_mlp", "--device", "cpu"],
     "give --input-shape without the batch dimension, e.g. --input-shape 28,28,1"),
])
def test_errors_are_one_line_with_exit_code_2(args, message, capsys):
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_bad_batch_size_is_an_argparse_error():
    proc = run("summary", "tests.models:seed_mlp", "--batch-size", "0")
    assert proc.returncode == 2 and "must be positive" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_fit_exit_codes(capsys):
    assert cli.main(["fit", "tests.models:small_cnn", "--batch-size", "8", "--device", "h200",
                     "--optimizer", "adam"]) == 0
    assert "FITS" in capsys.readouterr().out
    code = cli.main(["fit", "tests.models:seed_mlp", "--batch-size", "4096", "--device", "cpu",
                     "--memory", "8MiB", "--optimizer", "adam", "--format", "json"])
    assert code == 1
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] is False and data["available_bytes"] == 8 * 1024**2
    assert data["suggestions"]


def test_fit_shows_the_estimates_notes(capsys):
    # no optimizer given and the model is not compiled: the estimate says
    # what it assumed, and so does `memscope fit`
    assert cli.main(["fit", "tests.models:small_cnn", "--batch-size", "8",
                     "--device", "h200"]) == 0
    assert "Note: no optimizer given" in capsys.readouterr().out


def test_max_batch_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "m.png"
    code = cli.main(["max-batch", "tests.models:small_cnn", "--device", "cpu", "--memory",
                     "200MiB", "--format", "json", "--plot", str(png)])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["predicted"] > 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_devices_lists_catalogue_and_this_machine(capsys):
    assert cli.main(["devices", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = {d["name"] for d in data["catalogue"]}
    assert {"t4", "a100-40gb", "a100-80gb", "h100-80gb", "h200", "rtx-4090"} <= names
    assert data["local"][-1]["name"] == "cpu"


def test_bad_memory_size_is_one_line():
    proc = run("fit", "tests.models:seed_mlp", "--memory", "lots")
    assert proc.returncode == 2 and "bad memory size" in proc.stderr


def test_memory_size_needs_a_unit():
    proc = run("fit", "tests.models:seed_mlp", "--memory", "12")
    assert proc.returncode == 2 and "has no unit: use e.g. 12GiB" in proc.stderr


def test_max_batch_when_nothing_fits(capsys):
    # batch 1 needs 0.14 MiB where TensorFlow runs oneDNN's kernels (no
    # column buffers) and more without them: 64 KiB fits neither
    code = cli.main(["max-batch", "tests.models:small_cnn", "--device", "cpu",
                     "--memory", "64KiB"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_NO_FIT
    assert "largest batch that fits: 0" in out and "not even batch 1 fits" in out
