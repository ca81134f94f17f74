"""Estimated vs measured training-step memory on this machine's CPU allocator.

Each configuration is measured in fresh processes with the BFC allocator on
(``keras_memscope.measure``; method in the module docstring), ``--processes``
times, and the band of per-process maxima is recorded. Measurements are cached
in ``benchmarks/results/measured_cpu-<kind of machine>.json`` (with the
TensorFlow and Keras versions and the machine: ``benchmarks.machine``) and
re-used on the same versions and machine unless ``--remeasure``; estimates
are always recomputed. With ``--forked`` new measurements run in processes
forked from one that has imported TensorFlow (``benchmarks.machine.processes``).

    python -m benchmarks.accuracy                 # the zoo
    python -m benchmarks.accuracy --held-out      # models nobody tuned for
    python -m benchmarks.accuracy --unseen        # estimated after the graph method
    python -m benchmarks.accuracy --fresh         # estimated in the round after that
    python -m benchmarks.accuracy --novel         # estimated in the round after --fresh
    python -m benchmarks.accuracy --untried       # estimated in the round after --novel
    python -m benchmarks.accuracy --blind         # estimated in the round after --untried
    python -m benchmarks.accuracy --unmet         # estimated in the round after --blind
    python -m benchmarks.accuracy --unheard       # estimated in the round after --unmet
    python -m benchmarks.accuracy --unvisited     # estimated in the round after --unheard
    python -m benchmarks.accuracy --unknown       # estimated in the round after --unvisited
    python -m benchmarks.accuracy --uncharted     # estimated in the round after --unknown
    python -m benchmarks.accuracy --untrodden     # estimated in the round after --uncharted
    python -m benchmarks.accuracy --unplanned     # estimated in the round after --untrodden
    python -m benchmarks.accuracy --unforeseen    # estimated in the round after --unplanned
    python -m benchmarks.accuracy --unexpected    # written after --unforeseen was measured
    python -m benchmarks.accuracy --unanticipated # written after --unexpected was measured
    python -m benchmarks.accuracy --unmapped      # written after the five variants were run
    python -m benchmarks.accuracy --unsurveyed    # written after the broadcast products
    python -m benchmarks.accuracy --unfamiliar    # Keras 3.15's newer optimizers
    python -m benchmarks.accuracy --unexamined    # written after the tape's gradient owners
    python -m benchmarks.accuracy --keras-io      # keras.io's tutorials' models as written
    python -m benchmarks.accuracy --only resnet50 --remeasure

Relative error = (estimate - measured) / measured, against the highest
per-process maximum (the figure that has to fit). "Outside the steps" is how
far the estimate lies outside the range of every measured step of every
process (relative to the end it passed; "inside" when within it): the
third accuracy target, a step-to-step spread the estimate should not leave by
more than 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CACHE_STEM = "measured_cpu"

# (model, batch, optimizer)
CONFIGS = [
    ("mlp", 32, "sgd"), ("mlp", 256, "sgd"), ("mlp", 256, "adam"), ("mlp", 1024, "adam"),
    ("cnn", 32, "sgd"), ("cnn", 128, "adam"),
    ("resnet50", 8, "adam"), ("resnet50", 16, "sgd"),
    ("mobilenetv2", 8, "adam"), ("mobilenetv2", 32, "sgd"),
    ("vgg16", 8, "adam"), ("vgg16", 8, "sgd"),
    ("densenet121", 8, "adam"),
    ("lstm", 32, "adam"), ("lstm", 8, "sgd"),
    ("transformer", 8, "adam"), ("transformer", 32, "sgd"),
]
HELD_OUT_CONFIGS = [
    ("unet", 8, "adam"), ("unet", 32, "sgd"),
    ("gru", 32, "adam"), ("gru", 128, "sgd"),
    ("vit", 16, "adam"), ("vit", 64, "sgd"),
    ("separable", 16, "adam"), ("separable", 64, "sgd"),
]
# models and optimizers first estimated after the graph method was built
UNSEEN_CONFIGS = [
    ("convnext", 4, "adamw"), ("convnext", 4, "adam"), ("resnet50", 8, "adamw"),
    ("efficientnetb0", 8, "adam"), ("mobilenetv3small", 16, "adam"),
    ("xception", 4, "sgd"), ("nasnetmobile", 4, "sgd"),
    ("textcnn", 64, "adam"), ("autoencoder", 512, "adam"), ("groupnorm", 16, "sgd"),
]
# models and optimizers first estimated in the round after the unseen set,
# with no change to the estimator between writing them and these figures
FRESH_CONFIGS = [
    ("twotower", 64, "adam"), ("bilstm", 32, "adam"), ("bilstm", 32, "sgd"),
    ("timedistributed", 16, "sgd"), ("skipnet", 16, "rmsprop"), ("subclassed", 256, "adam"),
    ("causal", 32, "adamw"), ("strided", 64, "nadam"),
]
# models and optimizers first estimated in the round after the fresh set, with
# no change to the estimator between writing them and their first figures
NOVEL_CONFIGS = [
    ("wavenet", 16, "adamax"), ("wavenet", 64, "sgd"), ("resnet50v2", 8, "lion"),
    ("inceptionv3", 8, "sgd"), ("vae", 256, "adam"), ("gqa", 16, "adafactor"),
    ("regularized", 64, "adagrad"), ("convlstm", 8, "rmsprop"),
]
# models and optimizers first estimated in the round after the novel set, with
# no change to the estimator between writing them and their first figures
UNTRIED_CONFIGS = [
    ("mixer", 32, "adamw"), ("generator", 32, "adam"), ("video", 8, "sgd"),
    ("siamese", 64, "rmsprop"), ("efficientnetv2b0", 8, "adam"), ("resnext", 16, "sgd"),
    ("crossattn", 32, "adadelta"), ("highway", 256, "ftrl"),
]
# models and optimizers first estimated in the round after the untried set, with
# no change to the estimator between writing them and their first figures
BLIND_CONFIGS = [
    ("deeplab", 8, "adam"), ("deeplab", 32, "sgd"), ("crnn", 16, "sgd"), ("moe", 32, "muon"),
    ("selunet", 512, "adamw"), ("additive", 64, "rmsprop"), ("upconv1d", 64, "adagrad"),
    ("mobilenet", 16, "sgd"), ("augmented", 32, "adam"),
]
# models and optimizers first estimated in the round after the blind set, with
# no change to the estimator between writing them and their first figures
UNMET_CONFIGS = [
    ("film", 32, "sgd"), ("linattn", 16, "adam"), ("bow", 128, "adagrad"),
    ("convmixer", 16, "adamw"),
]
# models and optimizers first estimated in the round after the unmet set, with
# no change to the estimator between writing them and their first figures;
# optimizers with options are named in OPTIMIZERS
UNHEARD_CONFIGS = [
    ("axialattn", 32, "adam-globalclip"), ("emacnn", 64, "sgd-nesterov-ema"),
    ("sepconv1d", 64, "rmsprop-centered"), ("permutemlp", 256, "adam-clipnorm"),
    ("denoiser", 32, "adamw-amsgrad"), ("denoiser", 128, "sgd"),
]
# models and optimizers first estimated in the round after the unheard set, with
# no change to the estimator between writing them and their first figures
UNVISITED_CONFIGS = [
    ("unet3d", 2, "lamb"), ("ncf", 1024, "adam"), ("ncf", 4096, "sgd"),
    ("spectral", 32, "rmsprop"), ("tokenattn", 32, "adamw"), ("poissonnet", 64, "sgd-wd"),
]
# models and optimizers first estimated in the round after the unvisited set,
# with no change to the estimator between writing them and their first figures
UNKNOWN_CONFIGS = [
    ("fp16cnn", 32, "adam"), ("unrolled", 64, "nadam"), ("maskednet", 32, "adamax"),
    ("nested", 256, "adagrad"), ("constrained", 1024, "adam"), ("constrained", 256, "sgd"),
]
# models and optimizers first estimated in the round after the unknown set,
# with no change to the estimator between writing them and their first figures
UNCHARTED_CONFIGS = [
    ("regnetlike", 16, "sgd"), ("mobilenetv3large", 8, "adam-clipnorm"),
    ("convlstm1d", 16, "adam"), ("maskedmean", 128, "rmsprop"), ("tdconv", 8, "adamw"),
]
# models and optimizers first estimated in the round after the uncharted set,
# with no change to the estimator between writing them and their first figures
UNTRODDEN_CONFIGS = [
    ("channelsfirst", 32, "sgd"), ("widedeep", 2048, "sgd-momentum"),
    ("mhadropout", 32, "lion"), ("sepspatial", 32, "adafactor"),
]
# models and optimizers first estimated in the round after the untrodden set,
# with no change to the estimator between writing them and their first figures
UNPLANNED_CONFIGS = [
    ("tiedlm", 32, "adam"), ("multihead", 64, "sgd"), ("grudrop", 32, "rmsprop"),
    ("efficientnetb2", 4, "adamw"),
]
UNFORESEEN_CONFIGS = [
    ("lstmdrop", 32, "adam"), ("birnnsum", 64, "sgd"), ("cropnet", 16, "nadam"),
    ("ropeattn", 16, "adamw"), ("topkpool", 64, "rmsprop"),
]
UNEXPECTED_CONFIGS = [
    ("imgattn", 16, "adam"), ("dwmult", 32, "sgd-nesterov-ema"), ("rmsmlp", 512, "sgd-momentum"),
    ("sincnet", 16, "adam"), ("cosreg", 1024, "rmsprop"),
]
UNANTICIPATED_CONFIGS = [
    ("bf16mixer", 32, "adam"), ("stackedgru", 64, "adamax"), ("pointnet", 16, "sgd-momentum"),
    ("hourglass", 16, "nadam"),
]
# written after every model of the step in benchmarks.ordering_variants had been
# run over the sets above; measured and estimated once, with no change between
UNMAPPED_CONFIGS = [
    ("fnet", 32, "adam"), ("fnet", 128, "sgd"), ("capsnet", 32, "sgd-momentum"),
    ("inceptionresnet", 4, "sgd"), ("resizer", 64, "adam-clipvalue"), ("prefixlm", 32, "rmsprop"),
]
# written after the broadcast products' gradients were placed at their prims;
# measured and estimated once, with no change between
UNSURVEYED_CONFIGS = [
    ("senet", 32, "lion"), ("senet", 8, "sgd-nesterov"), ("siren", 4096, "lamb"),
    ("swiglu", 16, "adam"), ("bigruattn", 64, "rmsprop"), ("bigruattn", 16, "adagrad"),
]
# the optimizers Keras added lately (ScheduleFreeAdamW, MultiOptimizer),
# written once the estimator could build them; measured and estimated once
UNFAMILIAR_CONFIGS = [
    ("senet", 16, "schedulefree"), ("swiglu", 16, "schedulefree"),
    ("resnet50", 8, "multi-sgd-adam-late"), ("swiglu", 16, "multi-sgd-adam-attention"),
]
# written after the tape told which forward op each gradient op is for (a
# contrastive dual encoder, a cross network, a frozen teacher, per-sample
# weights, a focal loss); measured and estimated once, with no change between
UNEXAMINED_CONFIGS = [
    ("dualencoder", 256, "adamw"), ("dcn", 4096, "adam"), ("dcn", 1024, "ftrl"),
    ("distill", 32, "sgd-momentum"), ("hypernet", 512, "rmsprop"), ("focalcnn", 64, "adamax"),
]
# three of keras.io's tutorials' models as they write them, written after
# the unexamined set; measured and estimated once, with no change between
KERAS_IO_CONFIGS = [
    ("xceptionsmall", 16, "adam"), ("texttransformer", 32, "adam"),
    ("tstransformer", 16, "adam"),
]
# two custom layers that run loops of their own (``keras.ops.scan``,
# ``keras.ops.fori_loop``), written after the keras-io set; measured and
# estimated once, with no change between
OWN_LOOPS_CONFIGS = [("ssmscan", 32, "adam"), ("refine", 256, "adam")]
# three more such layers (a hand-written Elman scan, Newton steps by
# ``keras.ops.while_loop``, chunk sums by ``fori_loop``), written after such
# layers were costed from their own graphs (``keras_memscope.looplayer``);
# measured and estimated once, with no change between
MORE_LOOPS_CONFIGS = [("rnnscan", 64, "rmsprop"), ("newtonsqrt", 256, "adam"),
                      ("chunksum", 512, "sgd")]
# four more shapes of such layers (a reversed scan with two carries, loops
# nested, mixed_bfloat16, a scan on the model's input), tried at batch 32
# after --more-loops (the reversed scan's count down was read then), then
# set at these batches, measured and estimated once, with no change between
LOOP_SHAPES_CONFIGS = [("twinscan", 256, "adam"), ("nestedloops", 512, "adam"),
                       ("refine_bf16", 512, "adam"), ("scanfirst", 128, "adam")]
# six models written after the loop sets (a graph convolutional network on
# dense adjacency matrices, Conformer blocks, an attention U-Net, a mixture
# density network under its own likelihood, a segmenter with a 1 x 1 head into
# three classes, an optimizer that accumulates gradients); measured and
# estimated once, with no change between
UNSAMPLED_CONFIGS = [("gcn", 32, "adam"), ("conformer", 16, "adamw"),
                     ("attnunet", 8, "sgd-momentum"), ("mdn", 1024, "rmsprop"),
                     ("fcnseg", 8, "adam"), ("accumcnn", 64, "adam-accum4")]
# Conv3D networks at batches where TensorFlow's Conv3D gradient kernels take
# their column buffers or do not (``rules.conv.conv3d_col_buffers``): all but
# r3d's measured once while those buffers were modelled (c3d and ae3d written
# for it); r3d's configurations written with them and first estimated and
# measured after the change
VOLUMES_CONFIGS = [("video", 1, "adam"), ("video", 16, "adam"), ("video", 32, "sgd"),
                   ("unet3d", 8, "adam"), ("c3d", 2, "adam"), ("c3d", 8, "sgd"),
                   ("ae3d", 4, "adam"), ("ae3d", 16, "adam"), ("r3d", 4, "rmsprop"),
                   ("r3d", 12, "adam")]
#: the sets beside the zoo, by their flag, in the order they were written
SETS = {"held-out": HELD_OUT_CONFIGS, "unseen": UNSEEN_CONFIGS, "fresh": FRESH_CONFIGS,
        "novel": NOVEL_CONFIGS, "untried": UNTRIED_CONFIGS, "blind": BLIND_CONFIGS,
        "unmet": UNMET_CONFIGS, "unheard": UNHEARD_CONFIGS, "unvisited": UNVISITED_CONFIGS,
        "unknown": UNKNOWN_CONFIGS, "uncharted": UNCHARTED_CONFIGS,
        "untrodden": UNTRODDEN_CONFIGS, "unplanned": UNPLANNED_CONFIGS,
        "unforeseen": UNFORESEEN_CONFIGS, "unexpected": UNEXPECTED_CONFIGS,
        "unanticipated": UNANTICIPATED_CONFIGS, "unmapped": UNMAPPED_CONFIGS,
        "unsurveyed": UNSURVEYED_CONFIGS, "unfamiliar": UNFAMILIAR_CONFIGS,
        "unexamined": UNEXAMINED_CONFIGS, "keras-io": KERAS_IO_CONFIGS,
        "own-loops": OWN_LOOPS_CONFIGS, "more-loops": MORE_LOOPS_CONFIGS,
        "loop-shapes": LOOP_SHAPES_CONFIGS, "volumes": VOLUMES_CONFIGS,
        "unsampled": UNSAMPLED_CONFIGS}
def _multi(mapped: dict[str, str]) -> dict[str, Any]:
    """A serialized ``MultiOptimizer``: SGD with momentum for every variable
    but those whose path matches a pattern of ``mapped`` (to an optimizer's
    class name, default options)."""
    def serialized(name: str, config: dict[str, Any]) -> dict[str, Any]:
        return {"module": "keras.optimizers", "class_name": name, "config": config}

    return serialized("MultiOptimizer", {"optimizer_map": serialized("OptimizerMap", {
        "default_optimizer": serialized("SGD", {"momentum": 0.9}),
        "optimizer_map": {pattern: serialized(name, {}) for pattern, name in mapped.items()},
    })})


#: optimizers with options, by the name a configuration gives them
OPTIMIZERS = {
    "adam-globalclip": {"class_name": "Adam", "config": {"global_clipnorm": 1.0}},
    "adam-clipnorm": {"class_name": "Adam", "config": {"clipnorm": 1.0}},
    "adam-clipvalue": {"class_name": "Adam", "config": {"clipvalue": 0.5}},
    "sgd-nesterov-ema": {"class_name": "SGD", "config": {"momentum": 0.9, "nesterov": True,
                                                         "use_ema": True}},
    "rmsprop-centered": {"class_name": "RMSprop", "config": {"centered": True}},
    "adamw-amsgrad": {"class_name": "AdamW", "config": {"amsgrad": True}},
    "sgd-wd": {"class_name": "SGD", "config": {"momentum": 0.9, "weight_decay": 1e-4}},
    "sgd-momentum": {"class_name": "SGD", "config": {"momentum": 0.9}},
    "sgd-nesterov": {"class_name": "SGD", "config": {"momentum": 0.9, "nesterov": True}},
    "schedulefree": {"class_name": "ScheduleFreeAdamW", "config": {}},
    # Adam applying the sum of four steps' gradients every fourth step
    "adam-accum4": {"class_name": "Adam", "config": {"gradient_accumulation_steps": 4}},
    # SGD with momentum for the early layers, Adam for ResNet-50's last two
    # stages (discriminative fine-tuning)
    "multi-sgd-adam-late": _multi({"conv[45]_.*": "Adam"}),
    # Adam for the attention layers, SGD with momentum for the rest
    "multi-sgd-adam-attention": _multi({".*multi_head_attention.*": "Adam"}),
}


def named_optimizer(name: str) -> Any:
    """The optimizer a configuration names: a Keras optimizer's name, or an
    instance of one with options named in ``OPTIMIZERS``."""
    import keras

    return keras.optimizers.deserialize(OPTIMIZERS[name]) if name in OPTIMIZERS else name


def add_model_arguments(parser: Any) -> None:
    """``--model``, ``--batch`` and ``--optimizer`` of a benchmark that runs
    one configuration (``zoo.named`` and :func:`named_optimizer` read them)."""
    parser.add_argument("--model", required=True,
                        help="a function of benchmarks.zoo, or module:function")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--optimizer", default="adam",
                        help="a Keras optimizer's name, or one with options named in "
                             "benchmarks.accuracy.OPTIMIZERS (e.g. rmsprop-centered)")


#: models trained with their own loss (compiled, or measure's default)
OWN_LOSS = ("gru", "unet", "autoencoder", "twotower", "skipnet", "timedistributed", "causal",
            "subclassed", "vae", "generator", "siamese", "deeplab", "crnn", "selunet",
            "upconv1d", "denoiser", "unet3d", "ncf", "spectral", "tokenattn", "poissonnet",
            "maskednet", "maskedmean", "widedeep", "tiedlm", "multihead", "lstmdrop",
            "birnnsum", "cropnet", "dwmult", "rmsmlp", "cosreg", "hourglass", "capsnet",
            "resizer", "siren", "dualencoder", "dcn", "distill", "hypernet", "focalcnn",
            "xceptionsmall", "texttransformer", "tstransformer", "ae3d", "attnunet", "mdn")


def _key(model: str, batch: int, opt: str) -> str:
    return f"{model}/b{batch}/{opt}"


def measure_config(model: str, batch: int, opt: str, processes: int,
                   runner: str = "started") -> dict:
    """``processes`` measurements of the configuration, each in a fresh
    process of ``runner``'s (``benchmarks.machine.processes``)."""
    from benchmarks import machine
    from keras_memscope.measure import measure_subprocess

    runs = []
    with machine.processes(runner):
        for _ in range(processes):
            t0 = time.time()
            raw = measure_subprocess({"builder": f"benchmarks.zoo:{model}", "batch_size": batch,
                                      "optimizer": OPTIMIZERS.get(opt, opt), "steps": 6,
                                      "device": "cpu",
                                      "loss": "sparse_categorical_crossentropy"
                                      if model not in OWN_LOSS else None})
            raw["seconds"] = round(time.time() - t0, 1)
            runs.append(raw)
    return {"runs": runs, "runner": runner}


def failure(exc: BaseException) -> str:
    """The line of a failed measurement that says why (TensorFlow's message,
    without the traceback's file lines and the op's name)."""
    lines = [line.strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line and not line.startswith(("[[", "File ", "^"))
             and line != "measurement process failed:"]
    return lines[-1] if lines else str(exc)


def naive_bytes(est) -> int:
    """The folklore formula: weights + gradients + optimizer state + the batch
    + every layer's output, as if all were alive at once."""
    outputs = 0
    for r in est.layers:
        for shape, dtype in zip(r.output_shapes, r.output_dtypes):
            n = 1
            for d in shape:
                n *= d
            outputs += n * (2 if dtype in ("float16", "bfloat16") else 4)
    trainable_bytes = est.weights_bytes * est.trainable_params // max(est.params, 1)
    return (est.weights_bytes + trainable_bytes + est.optimizer_bytes + est.input_bytes
            + outputs)


def estimate_config(model: str, batch: int, opt: str,
                    method: str) -> tuple[int, float, int, int]:
    """The estimated peak, the seconds the estimate took, the bytes the
    allocator counts between steps (``held_bytes``; the naive formula's
    ``persistent_bytes``), and how much higher the
    peak may go where a recurrent loop runs ahead of its weight-gradient
    sums (``possible_extra_bytes``)."""
    import keras

    import keras_memscope as memscope
    from benchmarks import zoo

    builder = getattr(zoo, model)
    keras.utils.clear_session()
    m = builder()
    t0 = time.time()
    est = memscope.estimate(m, batch, optimizer=named_optimizer(opt), device="cpu",
                            method="rules" if method == "naive" else method)
    if method == "naive":
        return naive_bytes(est), time.time() - t0, est.persistent_bytes, 0
    return est.peak_bytes, time.time() - t0, est.held_bytes, est.possible_extra_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    previous = None
    for name in SETS:
        parser.add_argument(f"--{name}", action="store_true", help=(
            "the held-out models" if name == "held-out"
            else "models first estimated after the graph method was built" if name == "unseen"
            else f"models first estimated in the round after --{previous}"))
        previous = name
    parser.add_argument("--only", nargs="*", help="model names to run")
    parser.add_argument("--remeasure", action="store_true")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--forked", action="store_true",
                        help="measure in processes forked from one that has imported "
                             "TensorFlow (tests/forked.py; the cache records which)")
    parser.add_argument("--methods", nargs="*", default=["graph", "rules", "naive"],
                        help="rules, graph, naive (the folklore formula)")
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--machine", metavar="TAG",
                        help="compare with the measurements cached on another kind of machine "
                             "(benchmarks/results/measured_cpu-TAG.json) and measure nothing; "
                             "the estimates are this process's, so its kernels must be that "
                             "machine's (TF_ENABLE_ONEDNN_OPTS=1 or 0 for oneDNN's or "
                             "TensorFlow's own)")
    args = parser.parse_args(argv)

    import keras
    import tensorflow as tf

    # (the newest set named wins)
    configs = next((c for name, c in reversed(SETS.items())
                    if getattr(args, name.replace("-", "_"))), CONFIGS)
    if args.only:
        unknown = set(args.only) - {c[0] for c in configs}
        if unknown:
            parser.error(f"--only: no configuration of this set is named {sorted(unknown)}; "
                         f"its models: {sorted({c[0] for c in configs})}")
        configs = [c for c in configs if c[0] in args.only]
    from benchmarks import machine

    versions = {"tensorflow": tf.__version__, "keras": keras.__version__}
    here = machine.facts()
    path = machine.cache_file(CACHE_STEM, here)  # this kind of machine's measurements
    if args.machine:
        path = machine.RESULTS / f"{CACHE_STEM}-{args.machine}.json"
        if not path.exists():
            parser.error(f"no measurements cached for machine {args.machine!r} ({path})")
        # (kernels first and threads last in a tag; the L2 may differ)
        ours, theirs = machine.tag(here).split("-"), args.machine.split("-")
        if (ours[0], ours[-1]) != (theirs[0], theirs[-1]):
            parser.error(f"this process runs {ours[0]} kernels on {here['threads']} threads, "
                         f"so its estimates are not {args.machine!r}'s: set "
                         "TF_ENABLE_ONEDNN_OPTS to that machine's kernels")
    cache = json.loads(path.read_text()) if path.exists() else {}
    where = f"on {args.machine}" if args.machine else "on this machine"
    print(f"machine: {machine.describe(here)}"
          + (f"; measurements cached on {args.machine}" if args.machine else ""), flush=True)
    rows: list[dict] = []
    failed: list[str] = []
    for model, batch, opt in configs:
        key = _key(model, batch, opt)
        entry = cache.get(key, {})
        if args.machine and not entry:
            failed.append(f"{key} (not measured on {args.machine})")
            continue
        if not args.machine and (args.remeasure or entry.get("versions") != versions
                                 or entry.get("machine") != here):
            print(f"measuring {key} ...", file=sys.stderr, flush=True)
            try:
                taken = measure_config(model, batch, opt, args.processes,
                                       "forked" if args.forked else "started")
            except RuntimeError as exc:  # it does not train here: say why, go on
                taken = {"runs": [], "failed": failure(exc)}
            cache[key] = {**taken, "versions": versions, "machine": here}
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps(cache, indent=1, sort_keys=True))
        if cache[key].get("failed"):
            failed.append(f"{key} ({cache[key]['failed']})")
            print(f"{key}: does not train {where}: {cache[key]['failed']}", flush=True)
            continue
        runs = cache[key]["runs"]
        maxima = [max(r["step_peak_bytes"]) for r in runs]
        spread = max((max(r["step_peak_bytes"]) - min(r["step_peak_bytes"]))
                     / max(r["step_peak_bytes"]) for r in runs)
        steps = [peak for r in runs for peak in r["step_peak_bytes"]]
        held = [r["persistent_bytes"] for r in runs]
        row = {"model": model, "batch": batch, "optimizer": opt,
               "measured_max": max(maxima), "measured_min": min(maxima),
               "step_spread": spread, "step_min": min(steps), "step_max": max(steps),
               "held_min": min(held), "held_max": max(held)}
        for method in args.methods:
            est, seconds, persistent, extra = estimate_config(model, batch, opt, method)
            row[method] = est
            row[f"{method}_possible_extra"] = extra
            row[f"{method}_held"] = persistent
            row[f"{method}_held_error"] = (persistent - min(held)) / min(held)
            row[f"{method}_error"] = (est - max(maxima)) / max(maxima)
            row[f"{method}_range_error"] = range_error(est, est + extra, max(maxima))
            row[f"{method}_outside"] = outside(est, min(steps), max(steps))
            row[f"{method}_seconds"] = round(seconds, 2)
        rows.append(row)
        print(_format_row(row, args.methods), flush=True)
    print()
    if failed:
        print(f"{len(failed)} configuration(s) left out (not measured, or not training "
              f"{where}): " + "; ".join(failed) + "\n")
    for method in args.methods:
        print(summary(rows, method))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.markdown:
        print()
        print(markdown(rows, args.methods))
    return 0


def outside(estimate: float, low: float, high: float) -> float:
    """How far ``estimate`` lies outside the measured steps' range ``[low,
    high]``, relative to the end it passed (negative below); 0 inside."""
    if estimate > high:
        return (estimate - high) / high
    if estimate < low:
        return (estimate - low) / low
    return 0.0


def range_error(low: float, high: float, measured: float) -> float:
    """The error of the range ``[low, high]`` against ``measured``: that of
    its nearer end (``(end - measured) / measured``), 0 when it holds it."""
    if measured < low:
        return (low - measured) / measured
    if measured > high:
        return (high - measured) / measured
    return 0.0


def summary(rows: list[dict], method: str) -> str:
    """The three targets' figures for ``method``: the median and worst
    error against the highest process, and where the estimate lies against
    the range of every measured step."""
    errors = [abs(r[f"{method}_error"]) for r in rows]
    away = [abs(r[f"{method}_outside"]) for r in rows]
    held = [abs(r[f"{method}_held_error"]) for r in rows if f"{method}_held_error" in r]
    text = (f"{method}: median |error| {statistics.median(errors):.1%}, "
            f"worst {max(errors):.1%} ({len(errors)} configurations); inside the "
            f"measured steps' range: {sum(a == 0 for a in away)}, "
            f"farthest outside {max(away):.1%}")
    if held and method != "naive":
        text += (f"; held between steps, against the lowest process: median |error| "
                 f"{statistics.median(held):.1%}, worst {max(held):.1%}")
    looping = [r for r in rows if r.get(f"{method}_possible_extra")]
    if looping:
        text += (f"; {len(looping)} with a recurrent loop that may run ahead of its "
                 "weight-gradient sums, the range from the estimate to the estimate plus "
                 "possible_extra_bytes against the highest process: " + ", ".join(
                     f"{r['model']} b{r['batch']} {r['optimizer']} "
                     + ("inside" if not r[f"{method}_range_error"]
                        else f"{r[f'{method}_range_error']:+.1%}") for r in looping))
    return text


def markdown(rows: list[dict], methods: list[str]) -> str:
    mib = 1024**2
    head = ["model", "batch", "optimizer", "measured MiB (3 processes)", "step spread",
            "measured steps MiB", "held between steps MiB"]
    for m in methods:
        head += [f"{m} MiB", f"{m} error", f"{m} outside the steps"]
        if m != "naive":
            head += [f"{m} possible extra MiB", f"{m} held MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], str(r["batch"]), r["optimizer"],
                 f"{r['measured_min'] / mib:.1f} - {r['measured_max'] / mib:.1f}",
                 f"{r['step_spread']:.0%}",
                 f"{r['step_min'] / mib:.1f} - {r['step_max'] / mib:.1f}",
                 f"{r['held_min'] / mib:.1f} - {r['held_max'] / mib:.1f}"]
        for m in methods:
            cells += [f"{r[m] / mib:.1f}", f"{r[f'{m}_error']:+.1%}",
                      "inside" if not r[f"{m}_outside"] else f"{r[f'{m}_outside']:+.1%}"]
            if m != "naive":
                extra = r.get(f"{m}_possible_extra", 0)
                cells.append(f"+{extra / mib:.1f}" if extra else "")
                cells.append(f"{r[f'{m}_held'] / mib:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    for m in methods:
        lines.append("")
        lines.append(summary(rows, m))
    return "\n".join(lines)


def _format_row(row: dict, methods: list[str]) -> str:
    mib = 1024**2
    parts = [f"{row['model']:<12} b{row['batch']:<5} {row['optimizer']:<5}",
             f"measured {row['measured_min'] / mib:8.1f}-{row['measured_max'] / mib:8.1f} MiB"
             f" (steps vary {row['step_spread']:.0%})"]
    for m in methods:
        parts.append(f"{m} {row[m] / mib:8.1f} MiB {row[f'{m}_error']:+7.1%}")
    return "  ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
