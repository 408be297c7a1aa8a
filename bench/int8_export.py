"""The raccoon photos' RetinaNet exported three ways, scored and timed as ``detsweep export``
reports them: the Keras model, the float32 TFLite file and the int8 one (COCO AP on the 40 val
photos with its bootstrap spread, file size, latency at batch 1 in LiteRT on this machine's CPU).

    .venv/bin/python -m bench.int8_export [--smoke] [--steps N] [--size PX] [--representative N] [--keep DIR]
                                          [--checkpoint DIR] [--set path=value ...]

It trains ``configs/raccoon.yaml`` (detsweep's loop, no Ray) for ``--steps`` steps, then runs
``detsweep export --format tflite-int8 --json`` on the last checkpoint. The target is the
issue's: int8 within 1.0 AP (0.01) of float. ``--keep DIR`` keeps the checkpoint, the export and
the export's report (``DIR/checkpoint``, ``DIR/export``, ``DIR/report.json``):
``tests/test_int8_export.py`` runs this script so, as its smoke test and its trained model.
``--checkpoint DIR`` exports a checkpoint an earlier run of this script kept instead of training
(its steps and size are read from it). ``--set`` overrides the training's config, as the CLI's
does (the tests train on both cores: ``scaling.cpus_per_worker=2``).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
from pathlib import Path

from .common import REPO, Entry, Target, arguments, record

MODELS = ("keras", "tflite", "tflite-int8", "tflite-int8-keep-float")


def train(steps: int, size: int, folder: Path, overrides: list[str]) -> tuple[Path, dict]:
    from detsweep.config import load_trial_config
    from detsweep.train import run_training

    kept = folder / "checkpoint"
    config = load_trial_config(REPO / "configs" / "raccoon.yaml", [
        f"model.image_size={size}", f"train.num_steps={steps}", f"optimizer.learning_rate.total_steps={steps}",
        f"train.eval_every={steps}", f"train.checkpoint_every={steps}", *overrides])
    last: dict = {}

    def keep(metrics, checkpoint, milestone, pictures):
        last.update(metrics)
        if checkpoint is not None:
            shutil.copytree(checkpoint, kept)

    run_training(config, keep)
    return kept, last


def export(checkpoint: Path, out: Path, representative: int) -> dict:
    import argparse

    from detsweep.export.commands import add_export_commands

    parser = argparse.ArgumentParser(prog="detsweep")
    add_export_commands(parser.add_subparsers(required=True))
    args = parser.parse_args(["export", "--from", f"checkpoint:{checkpoint}", "--format", "tflite-int8",
                              "--out", str(out), "--representative", str(representative), "--json"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        args.command(args)
    return json.loads(printed.getvalue())


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="training steps (configs/raccoon.yaml's 1000)")
    parser.add_argument("--size", type=int, default=256, help="the model's image size (configs/raccoon.yaml's 256)")
    parser.add_argument("--keep", type=Path, help="keep the checkpoint, the export and its report here")
    parser.add_argument("--representative", type=int, default=100, help="training photos to calibrate int8 on")
    parser.add_argument("--checkpoint", type=Path, help="export this kept checkpoint instead of training one")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="path=value for the training")
    args = parser.parse_args()
    steps, size = (20, 128) if args.smoke else (args.steps, args.size)
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as scratch:
        folder = args.keep or Path(scratch)
        if args.checkpoint:
            from detsweep.checkpoints import read_config, read_step

            checkpoint, trained = args.checkpoint, {}
            steps, size = read_step(checkpoint), read_config(checkpoint).model.image_size
        else:
            checkpoint, trained = train(steps, size, folder, args.overrides)
        report = export(checkpoint, folder / "export", args.representative)
        (folder / "report.json").write_text(json.dumps(report, indent=1))
    models = report["models"]
    rows = [["model", "AP", "AP spread", "AP50", "size (MB)", "latency (ms)", "latency spread", "params"]]
    for name in (m for m in MODELS if m in models):
        m = models[name]
        rows.append([name, m["AP"], m["AP_spread"], m["AP50"], m.get("size_mb", "-"), m.get("latency_ms", "-"),
                     m["latency"]["spread"] if "latency" in m else "-", m.get("params", "-")])
    int8 = models["tflite-int8"]
    notes = [f"{report['val_images']} val photos; {report['runtime']}: this machine's CPU, not a target device.",
             f"int8's AP drop below float: {int8['AP_drop']:.3f}, its paired bootstrap spread {int8['AP_drop_spread']:.3f}.",
             f"representative set: {report['int8']['representative']['images']} training photos."]
    if "layers_losing_most" in report["int8"]:
        notes.append("layers losing most: " + ", ".join(layer["name"] for layer in report["int8"]["layers_losing_most"]))
    record("int8_export", Entry(
        title="The raccoon RetinaNet as Keras, float32 TFLite and int8 TFLite (bench/int8_export.py)",
        settings={"config": "configs/raccoon.yaml", "image_size": size, "steps": steps,
                  "training_eval_AP_ema": trained.get("eval_ema/AP"),
                  "trained": f"earlier, kept in {args.checkpoint}" if args.checkpoint else "in this run",
                  "int8_drop_spread": int8["AP_drop_spread"], **({"set": args.overrides} if args.overrides else {})},
        rows=rows,
        targets=[Target("int8's AP drop below float32 TFLite (AP)", "<= 0.01", int8["AP_drop"],
                        report["int8"]["met"])],
        notes=notes,
    ), args.out)


if __name__ == "__main__":
    main()
