"""The ``memscope`` command; the only module that prints.

    memscope summary --app ResNet50 --batch-size 32 --device gpu
    memscope summary model.keras --batch-size 64 --format json
    memscope summary mypackage.models:build --batch-size 16
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

EXIT_OK = 0
EXIT_ERROR = 2


class CliError(Exception):
    """A problem to report in one line, without a traceback."""


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
    p.add_argument("--unsafe", action="store_true",
                   help="load model files with safe_mode=False (only for files you trust)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memscope",
        description="Estimate the memory of training a Keras model.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summary", help="per-layer table and memory totals")
    _add_model_args(s)
    s.add_argument("--format", choices=("table", "json", "csv"), default="table")
    return parser


def _estimate(args: argparse.Namespace) -> Any:
    from .estimator import estimate

    model = load_model(args.model, args.app, args.input_shape, args.unsafe)
    try:
        return estimate(model, args.batch_size, optimizer=args.optimizer, device=args.device,
                        dtype_policy=args.dtype_policy,
                        input_shape=None if args.app else args.input_shape)
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "summary":
            from .report import render_summary, to_csv, to_json

            est = _estimate(args)
            text = {"table": render_summary, "json": to_json, "csv": to_csv}[args.format](est)
            print(text)
            return EXIT_OK
    except CliError as exc:
        print(f"memscope: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
