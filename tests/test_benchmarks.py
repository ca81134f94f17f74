"""The benchmarks' own arithmetic (their measurements are in benchmarks/RESULTS.md)."""

import pytest


def test_halves_of_a_saving():
    """Two processes each: the halves are single processes, so the four
    pairings give savings 10-4, 12-5 / 10-5, 12-4 / 12-4, 10-5 / 12-5, 10-4."""
    from benchmarks.remedies import halves

    low, high, differ = halves([10, 12], [4, 5])
    assert (low, high) == (5, 8)
    # |6 - 7| / 6.5 twice and |5 - 8| / 6.5 twice: the median is their mean
    assert differ == pytest.approx((1 / 6.5 + 3 / 6.5) / 2)


def test_halves_agree_when_every_process_does():
    from benchmarks.remedies import halves

    assert halves([100] * 6, [60] * 6) == (40, 40, 0)


def test_processes_swaps_the_runner_and_puts_it_back():
    import importlib

    from benchmarks import machine
    from tests import forked

    measure = importlib.import_module("keras_memscope.measure")
    started = measure._run_process
    with machine.processes("forked") as runner:
        assert runner == "forked" and measure._run_process is forked.run
    assert measure._run_process is started
    with machine.processes() as runner:
        assert runner == "started" and measure._run_process is started
    with pytest.raises(ValueError, match="'started' or 'forked'"):
        with machine.processes("spawned"):
            pass


def test_of_runner_picks_one_kind_of_process():
    from benchmarks.remedies import of_runner

    entry = {"maxima": [5, 7, 6], "runners": ["started", "forked", "started"]}
    assert of_runner(entry, "started") == [5, 6]
    assert of_runner(entry, "forked") == [7]
    # entries from before runners were recorded were measured in started processes
    assert of_runner({"maxima": [3, 4]}, "started") == [3, 4]
    with pytest.raises(SystemExit, match="--forked"):
        of_runner({"maxima": [3, 4]}, "forked")


def test_halves_of_many_processes_take_a_sample_of_the_splits():
    """24 processes split 2.7 million ways: a fixed sample of them, the
    same in every run."""
    from benchmarks.remedies import halves

    base = [100 + (i % 5) for i in range(24)]
    remedy = [60 + (i % 3) for i in range(24)]
    low, high, differ = halves(base, remedy)
    assert 100 + 2 - 62 <= low <= high <= 104 - 60
    assert (low, high, differ) == halves(base, remedy)


def test_step_phases_split_a_step_at_its_last_forward_op():
    """In use after each event and its op: the forward pass is the model's
    name scope; a gradient op read early (under ``gradient_tape/``) and the
    loss are not; the rise is the peak over the level after the last forward
    allocation."""
    from benchmarks.step_phases import phases

    events = [[100, "net_1/dense/MatMul"], [108, "net_1/dense/Relu"],
              [109, "gradient_tape/net_1/dense/ReluGrad/Sign"], [110, "net_1/dense_1/MatMul"],
              [111, "compile_loss/mse/sub"], [130, "gradient_tape/net_1/dense_1/MatMul"],
              [104, "adam/Sqrt"]]
    assert phases(events, "net") == {"start": 100, "forward": 110, "loss": 110, "peak": 130,
                                     "rise": 20}
    assert phases([[5, "adam/Sqrt"]], "net") is None


def test_peak_tensors_lists_what_is_alive_at_the_highest_count():
    from benchmarks.peak_tensors import at_peak

    # [allocated?, address, requested, in use after, op, chunk]
    events = [[True, 1, 100, 256, "a", 256], [True, 2, 300, 768, "b", 512],
              [False, 1, 0, 512, "", 256], [True, 3, 50, 768, "c", 256],
              [True, 4, 10, 1024, "d", 256], [False, 2, 0, 512, "", 512]]
    in_use, op, alive = at_peak(events)
    assert (in_use, op) == (1024, "d")
    assert alive == [(300, 512, "b"), (50, 256, "c"), (10, 256, "d")]


def test_allocation_trace_of_an_estimate_pairs_every_free(capsys):
    from benchmarks.allocation_trace import simulated_events
    from keras_memscope import allocator, schedule

    alloc, sim_alloc = allocator.BFCModel.alloc, schedule._Simulator.alloc
    events = simulated_events("tests.models:seed_mlp", 32, "adam")
    assert allocator.BFCModel.alloc is alloc and schedule._Simulator.alloc is sim_alloc  # put back
    assert "estimate:" in capsys.readouterr().out
    live: dict[tuple[str, int], tuple[int, int, str]] = {}
    for allocated, handle, requested, chunk, name in events:
        run = " ".join(name.split()[:2])
        if allocated:
            assert (run, handle) not in live and chunk >= requested > 0
            live[run, handle] = (requested, chunk, name)
        else:
            # a free is named as its allocation
            assert live.pop((run, handle)) == (requested, chunk, name)
    # the weights, the batch and the optimizer's state are never freed
    kept = sum(c for (run, _), (_, c, _) in live.items() if run == "simulation 0")
    assert kept >= 3 * 131_410 * 4
    # the step's buffers are named by layer and kind
    named = {name.split(maxsplit=2)[2] for *_, name in events if name.count(" ") >= 2}
    assert {"dense (activation)", "dense_2 (gradient)"} <= named, named


def test_gradient_pairs_are_a_layers_input_and_weight_gradients():
    import os

    before = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC")
    from benchmarks.op_time_spread import gradient_pairs

    # importing it leaves this process's allocator setting (measure() reads it)
    assert os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") == before

    tape = "gradient_tape/m/"
    step = {tape + "c/convolution/Conv2DBackpropInput": 1e-3,
            tape + "c/convolution/Conv2DBackpropFilter": 2e-3,
            tape + "d/MatMul/MatMul": 1e-3, tape + "d/MatMul/MatMul_1": 5e-4,
            tape + "e/MatMul/MatMul": 1e-3, tape + "e/MatMul/MatMul_1": 1e-4,  # too short
            "m/f/MatMul/MatMul": 1e-3, "m/f/MatMul/MatMul_1": 1e-3}  # not a gradient
    assert gradient_pairs([step, step]) == [
        (tape + "c/convolution/Conv2DBackpropInput", tape + "c/convolution/Conv2DBackpropFilter"),
        (tape + "d/MatMul/MatMul", tape + "d/MatMul/MatMul_1")]


def test_typical_peak_is_the_middle_simulated_order():
    from types import SimpleNamespace

    from benchmarks.remedies import typical_peak

    assert typical_peak(SimpleNamespace(history_peaks=(5, 1, 9), peak_bytes=9)) == 5
    assert typical_peak(SimpleNamespace(history_peaks=(), peak_bytes=7)) == 7


def test_ordering_variants_change_the_model_and_put_it_back():
    """The variants of benchmarks.ordering_variants: the first region's first
    chunk is held, the nominal speeds are swapped, the two gradient factors
    keep each one's spread and share a common part; all restored after."""
    import math
    import statistics

    from benchmarks.ordering_variants import variants
    from keras_memscope import allocator, estimator, timing

    nominal = timing.NOMINAL_CPU_SPEEDS
    plain = allocator.BFCModel().alloc(1024)[0]  # the first region's start
    with variants(["first-chunk", "onednn-speeds", "ratio"], ratio_sigma=0.22):
        bfc = allocator.BFCModel()
        assert bfc.in_use == 0  # the held chunk is not counted
        addr, _ = bfc.alloc(1024)
        assert addr == plain + allocator.GRANULE
        assert timing.NOMINAL_CPU_SPEEDS["rates"]["conv_filter_grad"] == 363e9
        times = estimator._scaled_times(lambda cost: (1.0, 1.0), 0.33, seed=3)
        costs = [object() for _ in range(4000)]  # (factors are kept by identity)
        pairs = [times(c) for c in costs]
    assert timing.NOMINAL_CPU_SPEEDS is nominal
    assert allocator.BFCModel().alloc(1024)[0] == plain
    logs = [(math.log(a), math.log(b)) for a, b in pairs]
    assert statistics.stdev(a for a, _ in logs) == pytest.approx(0.33, rel=0.06)
    assert statistics.stdev(a - b for a, b in logs) == pytest.approx(0.22, rel=0.06)
    with pytest.raises(ValueError, match="unknown variant"):
        with variants(["faster"]):
            pass
    from keras_memscope import schedule

    with variants(["add-pass-through"]):
        assert "AddV2" in schedule.PASS_THROUGH_GRADIENTS
    assert not schedule.PASS_THROUGH_GRADIENTS
    with variants(["onednn-conv-ratios"]):
        rates = timing.NOMINAL_CPU_SPEEDS["rates"]
        assert rates["conv_filter_grad"] / rates["conv_input_grad"] == pytest.approx(363 / 482.9)
        assert rates["conv"] == nominal["rates"]["conv"]
    assert timing.NOMINAL_CPU_SPEEDS is nominal
    with variants(["read-together", "update-busy"]):
        assert schedule.SIDE_BY_SIDE_GRADIENTS and schedule.UPDATES_HOLD_THE_THREAD
    assert not schedule.SIDE_BY_SIDE_GRADIENTS and not schedule.UPDATES_HOLD_THE_THREAD
    from keras_memscope import devices

    assert devices.get_device("cpu").simulated_steps == 1
    with variants(["weight-gradient-first", "timed-copies", "six-steps", "updates-take-time"]):
        assert schedule.WEIGHT_GRADIENT_FIRST == {"conv", "conv_transpose", "matmul"}
        assert schedule.TIMED_COPIES and schedule.UPDATES_TAKE_TIME
        assert devices.get_device("cpu").simulated_steps == 6
    assert not schedule.WEIGHT_GRADIENT_FIRST and not schedule.TIMED_COPIES
    assert not schedule.UPDATES_TAKE_TIME
    assert devices.get_device("cpu").simulated_steps == 1
    with variants(["products-side-by-side"]):
        assert schedule.PRODUCT_GRADIENTS_SIDE_BY_SIDE is True
    assert schedule.PRODUCT_GRADIENTS_SIDE_BY_SIDE is None  # (by the ordering speeds)


def test_accuracy_against_another_machines_measurements(capsys):
    """``--machine TAG`` compares this process's estimates with the
    measurements cached on another kind of machine and measures nothing;
    its kernels must be that machine's."""
    from benchmarks import accuracy, machine

    here = machine.facts()
    kernels = machine.tag(here).split("-")[0]
    tags = [p.name[len("measured_cpu-"):-len(".json")]
            for p in sorted(machine.RESULTS.glob("measured_cpu-*.json"))]
    other = next(t for t in tags if not t.startswith(kernels + "-"))
    with pytest.raises(SystemExit):
        accuracy.main(["--machine", other, "--only", "mlp", "--methods", "graph"])
    assert "set TF_ENABLE_ONEDNN_OPTS" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        accuracy.main(["--machine", "nowhere-l2-1k-2t", "--methods", "graph"])
    assert "no measurements cached" in capsys.readouterr().err
    same = [t for t in tags if t.startswith(kernels + "-") and t.endswith(f"-{here['threads']}t")]
    if not same:
        pytest.skip("no other machine of this one's kernels and threads was measured")
    assert accuracy.main(["--machine", same[0], "--only", "mlp", "--methods", "graph"]) == 0
    out = capsys.readouterr().out
    assert f"measurements cached on {same[0]}" in out
    assert out.count("measured") >= 2 and "measuring" not in out


def test_weight_copies_counts_each_steps_copies(monkeypatch):
    """A real run's variable copies, step by step between the marks made
    before each step; the warm-up's (before the first mark) are left out."""
    from benchmarks import allocation_trace, weight_copies

    mark = allocation_trace.STEP_MARK_BYTES
    events = [(True, 1, 4096, 4096, "adam/AssignAddVariableOp_3"),  # the warm-up's
              (True, 2, mark, mark, ""), (True, 3, 4096, 4096, "adam/AssignSubVariableOp_7"),
              (False, 3, 4096, 4096, "adam/AssignSubVariableOp_7"),
              (True, 4, 512, 512, "dense/MatMul"), (True, 5, mark, mark, "Fill"),
              (True, 6, 1024, 1024, "adam/AssignSubVariableOp"),
              (True, 7, 2048, 2048, "adam/AssignAddVariableOp_12")]
    marked = []

    def real_events(model, batch, optimizer, steps, mark_steps=False):
        marked.append(mark_steps)
        return events

    monkeypatch.setattr(allocation_trace, "real_events", real_events)
    assert weight_copies.real_copies("mlp", 8, "adam", 2) == [[4096], [1024, 2048]]
    assert marked == [True]
    with pytest.raises(RuntimeError, match="found 2 step marks"):
        weight_copies.real_copies("mlp", 8, "adam", 3)


def test_op_timeline_prints_the_chosen_ops_of_each_step(capsys):
    import os

    from benchmarks import op_timeline

    before = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC")

    assert op_timeline.main(["--model", "tests.models:small_cnn", "--batch", "4",
                             "--optimizer", "sgd", "--steps", "2",
                             "--ops", "Conv2DBackpropFilter"]) == 0
    out = capsys.readouterr().out
    assert out.count("step ") == 2
    # the one convolution's filter gradient, once in each step
    assert sum("Conv2DBackpropFilter" in line for line in out.splitlines()) == 2, out
    with pytest.raises(SystemExit):
        op_timeline.main(["--model", "cnn", "--batch", "4", "--ops", "("])
    # main() leaves this process's allocator setting alone: with the BFC
    # variable set, later measure() calls would run here, not fresh
    assert os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") == before


def test_range_error_is_the_nearer_ends():
    """A loop's estimate is a range, from the peak with the sums keeping up to
    the peak plus possible_extra_bytes: its error is 0 when the measured
    peak lies in it, else its nearer end's error (a single estimate's when
    the range is one number)."""
    from benchmarks.accuracy import range_error

    assert range_error(23, 71, 68) == 0
    assert range_error(80, 126, 77) == pytest.approx(3 / 77)
    assert range_error(13, 15.5, 16.2) == pytest.approx(-0.7 / 16.2)
    assert range_error(90, 90, 100) == pytest.approx(-0.1)


def test_gpu_check_runs_its_code_path_on_the_cpu(tmp_path, capsys):
    """benchmarks.gpu_check with ``--kind cpu``: estimate and a fresh
    measuring process per configuration, the row's error against the
    highest step, written as JSON."""
    import json

    from benchmarks import gpu_check

    out = tmp_path / "rows.json"
    assert gpu_check.main(["--kind", "cpu", "--configs", "mlp:32:sgd", "--steps", "2",
                           "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["device"] == "cpu" and len(row["measured_steps"]) == 2
    assert row["error"] == pytest.approx(row["estimate"] / max(row["measured_steps"]) - 1)
    assert abs(row["error"]) <= 0.15, row  # the zoo MLP b32 SGD: -3.0% in benchmarks.accuracy
    assert "median |error|" in capsys.readouterr().out


def test_a_configuration_that_does_not_train_is_reported_with_its_reason():
    """A measurement that fails (a channels_first Conv2D on a CPU whose own
    kernels compute its gradients in NHWC only) is reported by the line
    that says why, not the traceback."""
    from benchmarks.accuracy import failure

    exc = RuntimeError(
        "measurement process failed:\n\n  File \"/x/trainer.py\", line 81, in train_step\n\n"
        "Conv2DCustomBackpropInputOp only supports NHWC.\n"
        "\t [[{{node gradient_tape/channelsfirst_1/conv2d_2_1/convolution/"
        "Conv2DBackpropInput}}]] [Op:__inference_one_step_on_data_348]")
    assert failure(exc) == "Conv2DCustomBackpropInputOp only supports NHWC."
