"""Training data's memory: the peak RSS of a process iterating the training input pipeline over one
full epoch of COCO-sized TFRecords (640 x 480 JPEGs of about 160 KB, COCO's mean size) of 1 000,
5 000 and 20 000 images, streamed at a fixed 1 000-record shuffle buffer, against the same records
read into memory whole (the reader ``detsweep data inspect`` and evaluation use) at 1 000 and 5 000.
And what that makes of a GPU worker's host memory on COCO.

Each measurement runs in a process of its own (``--child``), so its peak is its own. The records
are written to shards by :func:`write_records` a record at a time, never all in memory, from a pool
of distinct pictures (encoding 20 000 JPEGs would take longer than reading them).

    .venv/bin/python -m bench.data_memory [--smoke]
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import REPO, Entry, Target, arguments, record

SIZES = (1000, 5000, 20000)
IN_MEMORY = (1000, 5000)
SHARDS = 16
BUFFER = 1000
POOL = 48  # distinct pictures
BOXES = 7  # COCO's mean per image is 7.3


def pictures(count: int, seed: int) -> list[bytes]:
    """JPEGs of 640 x 480 of about COCO's mean size: smooth colour fields with noise, quality 90."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    found = []
    y, x = np.mgrid[0:480, 0:640].astype(np.float32)
    for _ in range(count):
        base = [np.sin(x / rng.uniform(20, 80) + rng.uniform(0, 6)) * np.cos(y / rng.uniform(20, 80)) for _ in range(3)]
        image = (np.stack(base, -1) * 80 + 128 + rng.normal(0, 18, (480, 640, 3))).clip(0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, "JPEG", quality=90)
        found.append(buffer.getvalue())
    return found


def write_records(folder: Path, count: int, shards: int = SHARDS, seed: int = 0) -> tuple[str, int]:
    """``count`` OD API records in ``shards`` files under ``folder``; their glob and total bytes."""
    import tensorflow as tf

    pool, rng = pictures(POOL, seed), random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    writers = [tf.io.TFRecordWriter(str(folder / f"train.record-{i:05d}-of-{shards:05d}")) for i in range(shards)]
    for number in range(count):
        corners = [sorted(rng.uniform(0, 1) for _ in range(2)) for _ in range(2 * BOXES)]
        feature = {
            "image/encoded": _bytes(pool[number % POOL]), "image/source_id": _bytes(str(number + 1).encode()),
            "image/height": _ints([480]), "image/width": _ints([640]),
            "image/object/bbox/ymin": _floats([c[0] for c in corners[:BOXES]]),
            "image/object/bbox/ymax": _floats([c[1] for c in corners[:BOXES]]),
            "image/object/bbox/xmin": _floats([c[0] for c in corners[BOXES:]]),
            "image/object/bbox/xmax": _floats([c[1] for c in corners[BOXES:]]),
            "image/object/class/label": _ints([rng.randint(1, 80) for _ in range(BOXES)]),
        }
        writers[number % shards].write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    for writer in writers:
        writer.close()
    return str(folder / f"train.record-?????-of-{shards:05d}"), sum(path.stat().st_size for path in folder.iterdir())


def _bytes(value: bytes):
    import tensorflow as tf

    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _ints(values: list[int]):
    import tensorflow as tf

    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def _floats(values: list[float]):
    import tensorflow as tf

    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


# --- the measured processes -------------------------------------------------------------------

def child(mode: str, pattern: str) -> dict:
    """One epoch of the training pipeline (``streamed`` or ``in_memory``), or TensorFlow alone
    (``baseline``: its runtime started, one op run), or a COCO RetinaNet built with its optimizer's
    slots and moving average on the host (``model``). Peak RSS in MB and seconds."""
    import tensorflow as tf

    from detsweep.config import AugmentationConfig, DataConfig
    from detsweep.data.pipeline import training_dataset
    from detsweep.data.processing import InputSpec

    started, images = time.perf_counter(), 0
    tf.constant(1.0) + 1.0  # the runtime started, as in every mode
    if mode == "model":
        from detsweep.config import ModelConfig, OptimizerConfig
        from detsweep.models import build_model
        from detsweep.optim import MovingAverage, build_optimizer

        model, _ = build_model(ModelConfig(backbone="resnet50", image_size=640), 80)
        optimizer = build_optimizer(OptimizerConfig.model_validate({"type": "momentum"}))
        optimizer.build(model.trainable_variables)
        MovingAverage.of_model(model, 0.9998, True)
    elif mode != "baseline":
        data = DataConfig.model_validate({"train": {"format": "tfrecord", "annotations": pattern},
                                          "shuffle_buffer_size": BUFFER})
        if mode == "streamed":
            from detsweep.data import training_source

            source = training_source(data, say=lambda line: None)
        else:
            from detsweep.data import load_dataset

            source = load_dataset(data.train, verify=False)
        spec = InputSpec(640, image_resizer="fixed_shape")  # the zoo RetinaNet's input
        size = len(source.box_counts) if mode == "streamed" else len(source.examples)
        batches = training_dataset(source, spec, AugmentationConfig(random_horizontal_flip=0.5), batch_size=8,
                                   seed=0, shuffle_buffer_size=BUFFER)
        for _ in batches.take(size // 8):
            images += 8
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"peak_mb": peak, "seconds": time.perf_counter() - started, "images": images}


def measure(mode: str, pattern: str = "") -> dict:
    result = subprocess.run([sys.executable, "-m", "bench.data_memory", "--child", mode, pattern], cwd=REPO,
                            capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"{mode} {pattern}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATTERN"), help=argparse_suppress())
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    sizes, in_memory = ((16, 32), (16,)) if args.smoke else (SIZES, IN_MEMORY)
    rows, streamed, held = [["records", "MB of records", "reader", "peak RSS MB", "s for the epoch"]], {}, {}
    baseline, model = measure("baseline"), measure("model")
    with tempfile.TemporaryDirectory(prefix="detsweep-bench-data-") as scratch:
        for count in sizes:
            pattern, size = write_records(Path(scratch) / str(count), count)
            streamed[count] = measure("streamed", pattern)
            rows.append([count, size / 1e6, "streamed", streamed[count]["peak_mb"], streamed[count]["seconds"]])
            if count in in_memory:
                held[count] = measure("in_memory", pattern)
                rows.append([count, size / 1e6, "in memory", held[count]["peak_mb"], held[count]["seconds"]])
            for path in Path(scratch, str(count)).iterdir():
                path.unlink()  # 3 GB at 20 000: one size on disk at a time
    peaks = [streamed[count]["peak_mb"] for count in sizes]
    spread = max(peaks) / min(peaks) - 1
    # On a GPU worker: this pipeline's process, plus the network, its optimizer's slots and its
    # moving average on the host (an upper bound: on a GPU they live on the device), plus rank 0's
    # val set of 5 000 held in memory (the in-memory reader's increment at 5 000 over TensorFlow's).
    model_mb = model["peak_mb"] - baseline["peak_mb"]
    val_mb = held[in_memory[-1]]["peak_mb"] - baseline["peak_mb"]
    estimate_gib = (max(peaks) + model_mb + val_mb) / 1024
    rows += [["-", "-", "TensorFlow alone (runtime started)", baseline["peak_mb"], baseline["seconds"]],
             ["-", "-", "RetinaNet ResNet-50 640 px, 80 classes, optimizer slots and moving average (increment)",
              model_mb, model["seconds"]]]
    record("data_memory", Entry(
        title="Training data's memory: streamed TFRecords against records held whole (bench/data_memory.py)",
        settings={"records": f"OD API TFRecords in {SHARDS} shards, 640 x 480 JPEGs of about 160 KB from "
                  f"{POOL} distinct pictures, {BOXES} boxes each", "shuffle_buffer_size": BUFFER,
                  "pipeline": "training_dataset, 640 px fixed_shape, random_horizontal_flip, batch 8, one pipeline, "
                  "one full epoch", "threads": os.cpu_count()},
        rows=rows,
        targets=[Target(f"streamed peak RSS from {sizes[0]} to {sizes[-1]} records", "flat within 10 %", spread,
                        spread <= 0.10),
                 Target("a GPU worker's host memory on COCO (estimate)", "<= 6 GiB", estimate_gib, estimate_gib <= 6)],
        notes=[f"Streamed, the peak grows {spread:.1%} from {sizes[0]} to {sizes[-1]} records; held whole it grows "
               "with the records (the earlier reader's, which every worker used).",
               f"A GPU worker's host memory on COCO, estimated: the streamed pipeline's peak ({max(peaks):.0f} MB, "
               f"flat in the records, so COCO's 118 287 too) + the network with its optimizer slots and moving "
               f"average on the host ({model_mb:.0f} MB; on a GPU they sit on the device, so an upper bound) + rank 0's "
               f"val set of 5 000 held whole for evaluation ({val_mb:.0f} MB) = {estimate_gib:.2f} GiB.",
               "The records repeat a pool of pictures: decoding costs the same, the page cache holds fewer "
               "distinct bytes; RSS does not count the page cache."],
    ), args.out)


def argparse_suppress() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
