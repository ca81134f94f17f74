"""The ``memscope`` command; the only module that prints.

    memscope summary --app ResNet50 --batch-size 32 --device gpu
    memscope summary model.keras --batch-size 64 --format json
    memscope summary mypackage.models:build --batch-size 16
    memscope fit --app ResNet50 --batch-size 128 --device a100-40gb   # exit 1: no fit
    memscope max-batch --app ResNet50 --device rtx-4090 --plot resnet.png
    memscope devices

Exit codes: 0 done (and it fits), 1 it does not fit, 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

EXIT_OK = 0
EXIT_NO_FIT = 1
EXIT_ERROR = 2


class CliError(Exception):
    """A problem to report in one line, without a traceback."""


#: API spellings in library messages and notes, and what to type instead on
#: the command line (pattern, replacement)
_CLI_WORDS = (
    (r"\(e\.g\. device='([\w-]+)'\) or pass memory_bytes=\.\.\.",
     r"(e.g. --device \1) or give --memory SIZE (e.g. --memory 16GB)"),
    (r"use device='(\w+)' \(and memory_bytes=\.\.\.\)", r"use --device \1 (and --memory SIZE)"),
    (r"pass optimizer=\.\.\. to choose", "give --optimizer NAME to choose"),
    (r"verify=True", "--verify"),
    (r"pass input_shape=\(\.\.\.\) without the batch dimension, e\.g\. "
     r"estimate\(model, batch_size=32, input_shape=\(28, 28, 1\)\), or build the model "
     r"first \(keras\.Input or model\.build\)",
     "give --input-shape without the batch dimension, e.g. --input-shape 28,28,1"),
    (r"pass input_shape=\.\.\. giving every dimension after the batch, e\.g\. "
     r"input_shape=\(([\d, ]+?),?\)",
     lambda m: "give --input-shape with every dimension after the batch, e.g. "
               "--input-shape " + m.group(1).replace(" ", "")),
    (r"pass input_shape=\.\.\.", "give --input-shape"),
    (r"compile the model with its loss to size them",
     "a model saved compiled (.keras), or built compiled by module:function, carries its loss"),
)


def _cli_words(text: str) -> str:
    """Library messages as the command line says them (its flags, not keywords)."""
    import re

    for pattern, replacement in _CLI_WORDS:
        text = re.sub(pattern, replacement, text)
    return text


def _cli_error(exc: Exception) -> CliError:
    return CliError(_cli_words(str(exc)))


def _parse_shape(text: str) -> tuple[int | None, ...]:
    try:
        return tuple(None if p.strip() in ("", "none", "None") else int(p)
                     for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad shape {text!r}: give comma-separated sizes, e.g. 224,224,3"
        ) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def load_model(source: str | None, app: str | None, input_shape: tuple | None,
               unsafe: bool = False) -> Any:
    """A model from a file, a keras.applications name, or module:function."""
    import keras

    if app:
        builder = getattr(keras.applications, app, None)
        if builder is None or not callable(builder):
            names = sorted(n for n in dir(keras.applications)
                           if n[0].isupper() and callable(getattr(keras.applications, n)))
            raise CliError(f"unknown application {app!r}; choose one of: {', '.join(names)}")
        kwargs: dict[str, Any] = {"weights": None}
        if input_shape:
            kwargs["input_shape"] = tuple(input_shape)
        try:
            return builder(**kwargs)
        except Exception as exc:
            raise CliError(f"cannot build {app}: {exc}") from None
    if not source:
        raise CliError("give a model: a .keras/.h5 file, module:function, or --app NAME")
    if source.endswith(".keras") and not unsafe:
        # the architecture only: no weight is read or allocated
        if not os.path.exists(source):
            raise CliError(f"no such file: {source}")
        from .transform import resolve_model

        try:
            return resolve_model(source)
        except (ValueError, TypeError) as exc:
            raise CliError(f"cannot load {source}: {exc} (if it contains Lambda layers you "
                           "trust, add --unsafe)") from None
    if source.endswith((".keras", ".h5", ".hdf5")):
        if not os.path.exists(source):
            raise CliError(f"no such file: {source}")
        try:
            return keras.saving.load_model(source, compile=True, safe_mode=not unsafe)
        except Exception as exc:
            hint = "" if unsafe else " (if it contains Lambda layers you trust, add --unsafe)"
            raise CliError(f"cannot load {source}: {exc}{hint}") from None
    if ":" in source:
        import importlib

        module_name, _, func = source.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise CliError(f"cannot import {module_name!r}: {exc}") from None
        builder = getattr(module, func, None)
        if builder is None or not callable(builder):
            raise CliError(f"{module_name!r} has no callable {func!r}")
        try:
            model = builder()
        except Exception as exc:
            raise CliError(f"{source}() failed: {exc}") from None
        if not isinstance(model, keras.Layer):
            raise CliError(f"{source}() returned {type(model).__name__}, not a Keras model")
        return model
    raise CliError(
        f"cannot tell what {source!r} is: give a .keras/.h5 file, module:function, or --app NAME"
    )


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help=".keras/.h5 file or module:function")
    p.add_argument("--app", help="a keras.applications model, built with weights=None")
    p.add_argument("--input-shape", type=_parse_shape,
                   help="input shape without the batch, e.g. 224,224,3")
    p.add_argument("--batch-size", type=_positive_int, default=32)
    p.add_argument("--optimizer", help="optimizer name (default: the model's, else adam)")
    p.add_argument("--dtype-policy", help="e.g. mixed_float16, mixed_bfloat16")
    p.add_argument("--device", default="gpu", help="device profile (default gpu)")
    p.add_argument("--remat", help="recompute: activations, full, checkpoints or a number "
                   "of segments")
    p.add_argument("--method", choices=("auto", "graph", "rules"), default="auto",
                   help="graph: each layer's TensorFlow graph (default on TensorFlow); "
                   "rules: the layer rules, no tracing")
    p.add_argument("--unsafe", action="store_true",
                   help="load model files with safe_mode=False (only for files you trust)")


def _add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("table", "json", "csv"), default="table")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw memory against batch size (needs the plot extra)")


def _add_fit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory", type=_parse_memory, dest="memory_bytes",
                   help="memory the allocator may use, e.g. 12GiB (default: the device's)")
    p.add_argument("--safety-margin", type=float, default=0.05)


def _parse_memory(text: str) -> int:
    import re

    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?i?b?)?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"bad memory size {text!r}: use e.g. 12GiB or 800MB")
    if not m.group(2):
        raise argparse.ArgumentTypeError(
            f"memory size {text!r} has no unit: use e.g. {text.strip()}GiB, {text.strip()}GB "
            f"or {text.strip()}MB")
    value = float(m.group(1))
    unit = m.group(2).rstrip("b")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
             "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}
    if unit not in scale:
        raise argparse.ArgumentTypeError(f"bad memory unit in {text!r}")
    return int(value * scale[unit])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memscope",
        description="Estimate the memory of training a Keras model, and whether it fits.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summary", help="per-layer table and memory totals")
    _add_model_args(s)
    _add_output_args(s)
    s.add_argument("--timeline", metavar="FILE.png",
                   help="draw live memory through the step (with --remat: before and after)")
    f = sub.add_parser("fit", help="does this batch fit the device? (exit 1 if not)")
    _add_model_args(f)
    _add_fit_args(f)
    _add_output_args(f)
    m = sub.add_parser("max-batch", help="the largest batch whose estimate fits")
    _add_model_args(m)
    _add_fit_args(m)
    _add_output_args(m)
    m.add_argument("--verify", action="store_true",
                   help="confirm with real training steps on this CPU under the limit")
    d = sub.add_parser("devices", help="the device catalogue and this machine's devices")
    d.add_argument("--format", choices=("table", "json"), default="table")
    return parser


def _options(args: argparse.Namespace) -> dict[str, Any]:
    remat: Any = getattr(args, "remat", None)
    if remat is not None and remat.isdigit():
        remat = int(remat)
    return {"optimizer": args.optimizer, "dtype_policy": args.dtype_policy,
            "input_shape": None if args.app else args.input_shape, "remat": remat,
            "method": getattr(args, "method", "auto")}


def _estimate(args: argparse.Namespace, model: Any) -> Any:
    from .estimator import estimate

    try:
        return estimate(model, args.batch_size, device=args.device, **_options(args))
    except (ValueError, TypeError) as exc:
        raise _cli_error(exc) from None


def _plot(args: argparse.Namespace, model: Any) -> None:
    if not getattr(args, "plot", None):
        return
    from .plot import memory_vs_batch

    try:
        # the sweep over batch sizes uses the rules (no tracing per size)
        sweep = {k: v for k, v in _options(args).items() if k != "method"}
        memory_vs_batch(model, args.plot, device=args.device,
                        memory_bytes=getattr(args, "memory_bytes", None),
                        safety_margin=getattr(args, "safety_margin", 0.05), **sweep)
    except ImportError as exc:
        raise _cli_error(exc) from None
    print(f"wrote {args.plot}", file=sys.stderr)


def _cmd_summary(args: argparse.Namespace) -> int:
    from .report import render_summary, to_csv, to_json

    model = load_model(args.model, args.app, args.input_shape, args.unsafe)
    est = _estimate(args, model)
    text = {"table": render_summary, "json": to_json, "csv": to_csv}[args.format](est)
    print(_cli_words(text) if args.format == "table" else text)
    _plot(args, model)
    if args.timeline:
        from .plot import timeline

        ests, labels = [est], [f"remat {est.remat}" if est.remat else "as is"]
        if args.remat:
            plain = dict(_options(args), remat=None)
            from .estimator import estimate

            ests.insert(0, estimate(model, args.batch_size, device=args.device, **plain))
            labels.insert(0, "as is")
        try:
            timeline(ests, args.timeline, labels=labels)
        except ImportError as exc:
            raise _cli_error(exc) from None
        print(f"wrote {args.timeline}", file=sys.stderr)
    return EXIT_OK


def _cmd_fit(args: argparse.Namespace) -> int:
    import json

    from .planning import fits
    from .report import render_fit

    model = load_model(args.model, args.app, args.input_shape, args.unsafe)
    try:
        report = fits(model, args.batch_size, device=args.device,
                      memory_bytes=args.memory_bytes, safety_margin=args.safety_margin,
                      **_options(args))
    except (ValueError, TypeError) as exc:
        raise _cli_error(exc) from None
    if args.format == "json":
        data = report.to_dict()
        data.pop("estimate")
        print(json.dumps(data, indent=2))
    elif args.format == "csv":
        print("fits,batch_size,device,required_bytes,available_bytes,headroom_bytes")
        print(f"{report.fits},{report.batch_size},{report.device},{report.required_bytes},"
              f"{report.available_bytes},{report.headroom_bytes}")
    else:
        print(_cli_words(render_fit(report)))
    _plot(args, model)
    return EXIT_OK if report.fits else EXIT_NO_FIT


def _cmd_max_batch(args: argparse.Namespace) -> int:
    import json

    from .planning import BatchSearch, max_batch_size

    model = load_model(args.model, args.app, args.input_shape, args.unsafe)
    try:
        result = max_batch_size(model, device=args.device, memory_bytes=args.memory_bytes,
                                safety_margin=args.safety_margin, verify=args.verify,
                                **_options(args))
    except (ValueError, TypeError) as exc:
        raise _cli_error(exc) from None
    if isinstance(result, BatchSearch):
        data = result.to_dict()
    else:
        data = {"predicted": result}
    if args.format == "json":
        print(json.dumps(data, indent=2))
    elif args.format == "csv":
        print(",".join(data) + "\n" + ",".join(str(v) for v in data.values()))
    else:
        line = f"largest batch that fits: {data['predicted']} (estimated)"
        if data.get("verified") is not None:
            line += (f"; verified: {data['verified']} in {len(data['trials'])} trial steps "
                     f"(a doubling-and-bisection search would take {data['halving_trials']})")
        print(line)
        if not data["predicted"]:
            print("not even batch 1 fits: `memscope fit ... --batch-size 1` shows what it "
                  "needs and what would make it fit")
    _plot(args, model)
    return EXIT_OK if data["predicted"] > 0 else EXIT_NO_FIT


def _cmd_devices(args: argparse.Namespace) -> int:
    import json

    from .devices import PROFILES, detect_devices
    from .report import render_devices

    local = detect_devices()
    if args.format == "json":
        print(json.dumps({"catalogue": [p.to_dict() for p in PROFILES.values()],
                          "local": [p.to_dict() for p in local]}, indent=2))
    else:
        print(render_devices(list(PROFILES.values()), local))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    parser = build_parser()
    args = parser.parse_args(argv)
    commands = {"summary": _cmd_summary, "fit": _cmd_fit, "max-batch": _cmd_max_batch,
                "devices": _cmd_devices}
    try:
        return commands[args.command](args)
    except CliError as exc:
        print(f"memscope: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
