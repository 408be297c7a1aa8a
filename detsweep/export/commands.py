"""``detsweep export`` and ``detsweep predict``.

Both start from ``--from`` (a sweep's best trial, an MLflow run or a checkpoint folder, see
:mod:`detsweep.tracking.source`); an export of a checkpoint from MLflow is logged back to
its run, under ``export/<format>``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detsweep import console
from detsweep.errors import DetsweepError
from detsweep.subcommands import add_command

if TYPE_CHECKING:
    from detsweep.tracking.backend import Backend
    from detsweep.tracking.source import CheckpointSource


FORMATS = ("saved_model", "tflite")
SOURCE_HELP = "best:<experiment>, run:<mlflow run id> or checkpoint:<folder or s3://… URI>"


def add_export_commands(commands: Any) -> None:
    """Add ``detsweep export`` and ``detsweep predict`` to the main parser's subparsers."""
    export = add_command(commands, "export", export_command,
                      "export a checkpoint as a TensorFlow SavedModel or a TFLite model")
    export.add_argument("--from", dest="source", required=True, metavar="SOURCE", help=SOURCE_HELP)
    export.add_argument("--format", choices=FORMATS, default="saved_model", help="what to write (default: saved_model)")
    export.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder")
    export.add_argument("--no-ema", dest="use_average", action="store_false",
                        help="export the trained weights, not their moving average")
    export.add_argument("--json", action="store_true",
                        help='print {"format", "path", "source", "run_id", "moving_average"}')

    predict = add_command(commands, "predict", predict_command,
                       "detect objects in image files with an exported model or a checkpoint")
    model = predict.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", metavar="DIR", help="a SavedModel folder written by detsweep export")
    model.add_argument("--from", dest="source", metavar="SOURCE", help=SOURCE_HELP)
    predict.add_argument("images", nargs="+", metavar="IMAGE", help="JPEG, PNG, GIF, BMP or WebP files of any size")
    predict.add_argument("--out", metavar="DIR", help="draw the detections into DIR/<image name>.png")
    predict.add_argument("--min-score", type=float, default=0.3, metavar="S",
                         help="show detections scoring at least S (default 0.3)")
    predict.add_argument("--json", action="store_true", help='print {"images": [{"path", "detections": '
                         '[{"class_id", "class_name", "score", "box"}]}]}; boxes: normalised ymin, xmin, ymax, xmax')



# --- commands --------------------------------------------------------------------


def export_command(args: argparse.Namespace) -> int:
    from detsweep.export.paths import check_new_folder
    from detsweep.tracking.source import fetched

    out = Path(args.out)
    check_new_folder(out)  # before a download or a model load
    backend, source = resolve(args.source)
    from detsweep.export.saved_model import read_export_info  # TensorFlow: once the source is known

    with console.working(f"exporting {args.source} as {args.format}"), fetched(source, backend) as checkpoint:
        path = exporter(args.format)(checkpoint, out, use_average=args.use_average)
    if source.run_id:
        from mlflow import MlflowClient

        MlflowClient(backend.uri).log_artifacts(source.run_id, str(path), f"export/{args.format}")
    info = read_export_info(path)
    report = {"format": args.format, "path": str(path), "source": args.source, "run_id": source.run_id,
              "moving_average": info["moving_average"]}
    if args.json:
        print(json.dumps(report))
    else:
        weights = "moving-average" if info["moving_average"] else "trained"
        print(f"exported {args.source} (step {info['step']}, {weights} weights) as {args.format} to {path}")
        if source.run_id:
            print(f"logged to MLflow run {source.run_id} as export/{args.format}")
    return 0


def predict_command(args: argparse.Namespace) -> int:
    from detsweep.export.paths import check_exported, check_images

    if not 0.0 <= args.min_score <= 1.0:
        raise DetsweepError(f"--min-score: found {args.min_score}, expected a score between 0 and 1")
    check_images(args.images, args.out)  # before the model loads
    if args.model:
        check_exported(args.model)
    from detsweep.errors import stderr_held_back

    with stderr_held_back():  # a model that is not there: one line, not TensorFlow's start-up
        predictor = load_predictor(args.model, args.source)
    from detsweep.export.predict import predict_files

    results = predict_files(predictor, args.images, args.min_score, args.out)
    print(json.dumps({"images": results}) if args.json else format_predictions(results))
    return 0


def load_predictor(model: str | None, source: str | None):
    """A SavedModel folder's predictor, or a checkpoint's (``--from``)."""
    from detsweep.export.predict import checkpoint_predictor, saved_model_predictor
    from detsweep.tracking.source import fetched

    if model:
        return saved_model_predictor(model)
    backend, resolved = resolve(source)
    with fetched(resolved, backend) as checkpoint:
        return checkpoint_predictor(checkpoint)


def resolve(spec: str) -> tuple[Backend, CheckpointSource]:
    """The tracking backend and the checkpoint ``spec`` names."""
    from detsweep.config import TrackingConfig
    from detsweep.errors import stderr_held_back
    from detsweep.tracking import resolve_backend
    from detsweep.tracking.source import resolve_source

    backend = resolve_backend(TrackingConfig())
    with stderr_held_back():  # a source that is not there: one line, not TensorFlow's start-up
        return backend, resolve_source(spec, backend)


def exporter(kind: str) -> Callable[..., Path]:
    if kind == "tflite":
        from detsweep.export.tflite import export_tflite

        return export_tflite
    from detsweep.export.saved_model import export_saved_model

    return export_saved_model


def format_predictions(results: list[dict]) -> str:
    lines = []
    for result in results:
        lines.append(f"{result['path']}: {len(result['detections'])} detection(s)")
        for d in result["detections"]:
            box = ", ".join(f"{v:.3f}" for v in d["box"])
            lines.append(f"  {d['class_name']:<16} {d['score']:.3f}  [{box}]")
    return "\n".join(lines)
