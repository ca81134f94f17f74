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
    assert data["peak_bytes"] == sum(data[k] for k in (
        "weights_bytes", "optimizer_bytes", "input_bytes", "activations_bytes",
        "gradients_bytes", "workspace_bytes", "allocator_bytes"))


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
])
def test_errors_are_one_line_with_exit_code_2(args, message, capsys):
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_bad_batch_size_is_an_argparse_error():
    proc = run("summary", "tests.models:seed_mlp", "--batch-size", "0")
    assert proc.returncode == 2 and "must be positive" in proc.stderr
    assert "Traceback" not in proc.stderr
