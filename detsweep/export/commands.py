"""``detsweep export`` and ``detsweep predict``.

Both start from ``--from`` (a sweep's best trial, an MLflow run or a checkpoint folder, see
:mod:`detsweep.tracking.source`); an export of a checkpoint from MLflow is logged back to
its run, under ``export/<format>``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detsweep import console
from detsweep.errors import DetsweepError
from detsweep.subcommands import add_command

if TYPE_CHECKING:
    from detsweep.tracking.backend import Backend
    from detsweep.tracking.source import CheckpointSource


FORMATS = ("saved_model", "tflite", "tflite-fp16", "tflite-int8")
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
                        help='print {"format", "path", "source", "run_id", "moving_average"} and, for TFLite, '
                             'the scores and costs')
    export.add_argument("--representative", type=int, default=100, metavar="N",
                        help="tflite-int8: calibrate on N training pictures (default 100)")
    export.add_argument("--representative-data", metavar="FILE",
                        help="tflite-int8: a YAML dataset section (as data.train) to calibrate on instead of "
                             "the checkpoint's training data")
    export.add_argument("--keep-float", action="append", default=[], metavar="LAYER",
                        help="tflite-int8: leave this layer of the network in float (repeatable; the names an "
                             "export that misses its target prints)")
    export.add_argument("--no-measure", dest="measure", action="store_false",
                        help="TFLite: skip scoring on the val set and timing in the LiteRT runtime")
    export.add_argument("--threads", type=int, default=2, metavar="N",
                        help="TFLite: time the models on N threads (default 2)")

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
    check_options(args)
    representative = read_representative_data(args.representative_data) if args.representative_data else None
    backend, source = resolve(args.source)
    from detsweep.errors import stderr_held_back
    from detsweep.export.saved_model import read_export_info  # TensorFlow: once the source is known

    with fetched(source, backend) as checkpoint:
        with stderr_held_back():  # refused data: one line, before the model loads
            request = tflite_request(args, checkpoint, representative)
        with console.working(f"exporting {args.source} as {args.format}"):
            path, measured = export(checkpoint, out, args.use_average, request)
    if source.run_id:
        log_export(backend, source.run_id, path, args.format, measured)
    info = read_export_info(path)
    report = {"format": args.format, "path": str(path), "source": args.source, "run_id": source.run_id,
              "moving_average": info["moving_average"]} | measured
    if args.json:
        print(json.dumps(report))
    else:
        weights = "moving-average" if info["moving_average"] else "trained"
        print(f"exported {args.source} (step {info['step']}, {weights} weights) as {args.format} to {path}")
        if measured:
            print(format_measured(measured))
        if source.run_id:
            print(f"logged to MLflow run {source.run_id} as export/{args.format}")
    return 0


def check_options(args: argparse.Namespace) -> None:
    if args.representative < 1:
        raise DetsweepError(f"--representative: found {args.representative}, expected a number of pictures >= 1")
    if args.threads < 1:
        raise DetsweepError(f"--threads: found {args.threads}, expected a number of threads >= 1")
    int8_only = [flag for flag, given in (("--representative-data", args.representative_data),
                                           ("--keep-float", args.keep_float)) if given]
    if int8_only and args.format != "tflite-int8":
        raise DetsweepError(f"{int8_only[0]}: given with --format {args.format}, expected --format tflite-int8")


def read_representative_data(path: str):
    """``--representative-data``: a dataset section, read and validated before anything loads."""
    from detsweep.config import DatasetConfig
    from detsweep.config.loader import absolute_path, read_yaml_mapping, validate

    if not Path(path).is_file():
        raise DetsweepError(f"--representative-data {path}: file not found, expected a YAML dataset section")
    tree = read_yaml_mapping(path)
    for field in ("annotations", "images", "label_map"):
        if isinstance(tree.get(field), str):
            tree[field] = absolute_path(tree[field], Path(path).parent)
    return validate(DatasetConfig, tree, source=path)


def tflite_request(args: argparse.Namespace, checkpoint: Path, representative=None):
    """What a TFLite export is asked for; for int8, its representative set, read and checked."""
    if not args.format.startswith("tflite"):
        return None
    from detsweep.export.tflite import TFLiteRequest

    calibration = None
    if args.format == "tflite-int8":
        from detsweep.checkpoints import read_config
        from detsweep.data.processing import InputSpec
        from detsweep.export.quantize import representative_set

        config = read_config(checkpoint)
        train = representative or config.data.train
        calibration = representative_set(train, config.data.val, args.representative, InputSpec.of(config.model))
    return TFLiteRequest(args.format, calibration, tuple(args.keep_float), args.measure, args.threads)


def export(checkpoint: Path, out: Path, use_average: bool, request) -> tuple[Path, dict]:
    if request is None:
        from detsweep.export.saved_model import export_saved_model

        return export_saved_model(checkpoint, out, use_average), {}
    from detsweep.export.tflite import export_tflite

    written = export_tflite(checkpoint, out, use_average, request)
    return written.path, written.report


def log_export(backend: Backend, run_id: str, path: Path, kind: str, measured: dict) -> None:
    """The export's files under ``export/<format>``; its scores and costs as metrics
    ``export/<model>/<name>`` and as ``export/<format>/measured.json``."""
    from mlflow import MlflowClient

    client = MlflowClient(backend.uri)
    client.log_artifacts(run_id, str(path), f"export/{kind}")
    if not measured:
        return
    client.log_dict(run_id, measured, f"export/{kind}/measured.json")
    for model, figures in measured["models"].items():
        for name, value in figures.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                client.log_metric(run_id, f"export/{model}/{name}", value)


def format_measured(measured: dict) -> str:
    """The models as a table: AP with its bootstrap spread, AP50, size, latency."""
    lines = [f"{'model':<24} {'AP':>15} {'AP50':>7} {'size MB':>8} {'latency ms':>11}"]
    for name, m in measured["models"].items():
        size = f"{m['size_mb']:.2f}" if "size_mb" in m else "-"
        latency = f"{m['latency_ms']:.1f}" + ("" if m["latency"]["steady"] else "*") if "latency_ms" in m else "-"
        lines.append(f"{name:<24} {m['AP']:>7.3f} ± {m['AP_spread']:.3f} {m['AP50']:>7.3f} {size:>8} {latency:>11}")
    lines.append(f"on {measured['val_images']} val images; {measured['runtime']}"
                 + ("; * spread above 5 %" if any(not m.get("latency", {"steady": True})["steady"]
                                                  for m in measured["models"].values()) else ""))
    int8 = measured.get("int8")
    if int8 and not int8["met"]:
        names = ", ".join(layer["name"] for layer in int8["layers_losing_most"])
        lines.append(f"int8 loses more than {int8['max_drop']} AP; the layers losing most: {names}; "
                     f"{measured['keep_float']['file']} keeps them in float")
    return "\n".join(lines)


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


def format_predictions(results: list[dict]) -> str:
    lines = []
    for result in results:
        lines.append(f"{result['path']}: {len(result['detections'])} detection(s)")
        for d in result["detections"]:
            box = ", ".join(f"{v:.3f}" for v in d["box"])
            lines.append(f"  {d['class_name']:<16} {d['score']:.3f}  [{box}]")
    return "\n".join(lines)
