"""``detsweep data synth`` and ``detsweep data inspect``.

Flags are gathered into a ``DatasetConfig`` tree and validated like a config file, so
a bad value reads ``detsweep data inspect: num_images: found 'x', expected …``.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from detsweep import console
from detsweep.subcommands import add_command

if TYPE_CHECKING:
    from detsweep.config import DatasetConfig


# Flags named after DatasetConfig fields; their values go in as typed, so the schema judges them.
DATASET_FLAGS = ("format", "annotations", "images", "label_map", "num_images", "image_size", "classes", "seed")


def add_data_commands(commands: Any) -> argparse.ArgumentParser:
    """Add ``detsweep data`` and its subcommands to the main parser's subparsers."""
    data = commands.add_parser("data", help="make and inspect detection datasets",
                               description="Make and inspect detection datasets.")
    subcommands = data.add_subparsers(title="data commands", metavar="COMMAND", required=True)

    synth = add_command(subcommands, "synth", synth_command, "write a synthetic shapes dataset: PNG images and a COCO JSON")
    synth.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder: DIR/images/, DIR/annotations.json")
    _synthetic_arguments(synth)

    inspect = add_command(subcommands, "inspect", inspect_command, "read a dataset and show its images, boxes and classes")
    inspect.add_argument("--format", help="coco, voc, tfrecord or synthetic (default: synthetic)")
    inspect.add_argument("--annotations", metavar="PATH",
                         help="COCO: the instances JSON; VOC: the folder of XML files; tfrecord: file(s) or a glob")
    inspect.add_argument("--images", metavar="DIR", help="the image folder (COCO; VOC: default beside the XML)")
    inspect.add_argument("--label-map", metavar="PBTXT", help="an OD API label map (tfrecord, VOC)")
    _synthetic_arguments(inspect)
    inspect.add_argument("--skip-empty", action="store_true", help="drop images without boxes")
    inspect.add_argument("--max-boxes", metavar="N", help="count what data.max_boxes N would cut")
    inspect.add_argument("--no-verify", dest="verify", action="store_false", help="do not read the image headers")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    return data



def _synthetic_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-images", metavar="N", help="synthetic: how many images (default 64)")
    parser.add_argument("--image-size", metavar="S", help="synthetic: image side in pixels (default 128)")
    parser.add_argument("--classes", metavar="K", help="synthetic: number of classes (default 3)")
    parser.add_argument("--seed", metavar="X", help="synthetic: random seed (default 0)")


# --- commands --------------------------------------------------------------------


def synth_command(args: argparse.Namespace) -> int:
    from detsweep.data import write_synthetic

    config = dataset_config(args, "detsweep data synth", format="synthetic")
    path = write_synthetic(args.out, config.num_images, config.image_size, config.classes, config.seed)
    print(f"wrote {config.num_images} images to {path.parent / 'images'} and their COCO annotations to {path}",
          file=console.err())
    print(path)
    return 0


def inspect_command(args: argparse.Namespace) -> int:
    from detsweep.data import describe, format_description, load_dataset

    config = dataset_config(args, "detsweep data inspect", skip_empty=args.skip_empty or None)
    max_boxes = max_boxes_flag(args.max_boxes)
    with console.working(f"reading {'and checking ' if args.verify else ''}{config.annotations or config.format}"):
        description = describe(load_dataset(config, verify=args.verify), max_boxes)
    print(json.dumps(description) if args.json else format_description(description))
    return 0


def max_boxes_flag(value: str | None) -> int | None:
    from detsweep.config import DataConfig, validate

    return validate(DataConfig, {"max_boxes": value}, source="detsweep data inspect").max_boxes if value else None


def dataset_config(args: argparse.Namespace, source: str, **fixed: Any) -> DatasetConfig:
    """A validated DatasetConfig from the flags that were given (the rest keep their defaults)."""
    from detsweep.config import DatasetConfig, validate

    tree = {field: getattr(args, field) for field in DATASET_FLAGS if getattr(args, field, None) is not None}
    tree.update({key: value for key, value in fixed.items() if value is not None})
    return validate(DatasetConfig, tree, source=source)
