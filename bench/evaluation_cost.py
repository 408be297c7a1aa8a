"""What an evaluation of val2017's size costs against the training it interrupts, for the COCO
recipe (``sweeps/coco_gpu.yaml``: the zoo's RetinaNet ResNet-50 at 640 px, 80 classes, batch 64
on two GPU workers, an evaluation every 2 500 steps, raw and moving-average weights each).

Measured here: inference per image on 300 generated 640 x 480 JPEGs (the evaluation pipeline,
the network, detections to COCO's form), at an evaluation batch of 8 and of 32, and the input
pipeline alone; COCOeval on 5 000 images' detections (100 each, as the network keeps) by
pycocotools and by faster-coco-eval; the model's training rate here; and what an asynchronous
evaluation pays each time before its first image (rebuilding the model from the checkpoint,
reading the val set). Then one evaluation's share of training, at this machine's speed and at a
GPU's, the GPU's throughput an assumption (no GPU here), for each lever.

    .venv/bin/python -m bench.evaluation_cost [--smoke]
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path

from .common import REPO, Entry, Target, arguments, record
from .data_memory import write_records

VAL_IMAGES = 5000  # val2017
SAMPLE = 300
EVAL_EVERY, BATCH, WORKERS, PASSES = 2500, 64, 2, 2  # sweeps/coco_gpu.yaml; raw and moving-average weights
# Assumptions, no GPU here: one V100-class GPU's RetinaNet ResNet-50 640 px, mixed precision.
GPU_INFERENCE = 100.0  # images/s at an evaluation batch of 8 (the OD API zoo lists 46 ms an image at batch 1)
GPU_TRAINING = 40.0  # images/s a worker trains
CPUS_PER_WORKER = 8  # coco_gpu.yaml: the input pipeline and COCOeval run on these


def trial_config(pattern: str, steps: int, extra: list[str]):
    from detsweep.config import load_trial_config

    return load_trial_config(REPO / "configs" / "quickstart.yaml", [
        f"data.train={{format: tfrecord, annotations: '{pattern}'}}", "data.val=null", "model.backbone=resnet50",
        "model.image_size=640", "model.image_resizer=fixed_shape", "model.num_classes=80", "train.batch_size=8",
        f"train.num_steps={steps}", f"train.steps_per_loop={steps // 2}", f"train.checkpoint_every={steps}",
        f"train.eval_every={steps}", f"optimizer.learning_rate.total_steps={steps}",
        "optimizer.learning_rate.warmup_steps=0", f"scaling.cpus_per_worker={os.cpu_count()}", *extra])


def training_rate_and_checkpoint(pattern: str, steps: int, into: Path, extra: list[str]) -> float:
    """The model trained ``steps`` steps here: the second loop's images/s (the first traces); its last checkpoint kept."""
    import shutil

    from detsweep.train import run_training

    reports = []

    def keep(metrics, checkpoint, milestone, pictures):
        reports.append(metrics)
        if checkpoint is not None:
            shutil.copytree(checkpoint, into)

    run_training(trial_config(pattern, steps, extra), keep)
    return reports[-1]["train/images_per_sec"]


def inference(checkpoint: Path, val_pattern: str, batch: int) -> tuple[float, float, float, float, float]:
    """Seconds per image of one pass (pipeline, network, detections to COCO's form) past a first
    batch (tracing), of the input pipeline alone, of the detections' conversion to COCO's form
    (a batch's, again and again); the seconds to rebuild the model from the checkpoint and
    to read the val set (what an async evaluation pays first)."""
    from detsweep.config import DatasetConfig
    from detsweep.data import load_dataset
    from detsweep.data.processing import InputSpec
    from detsweep.evaluation import to_coco_detections
    from detsweep.train.evaluate import Evaluator
    from detsweep.train.restore import load_trained_model

    started = time.perf_counter()
    trained = load_trained_model(checkpoint)
    rebuilt = time.perf_counter() - started
    started = time.perf_counter()
    val_set = load_dataset(DatasetConfig(format="tfrecord", annotations=val_pattern), verify=False)
    read = time.perf_counter() - started
    evaluator = Evaluator(trained.model, val_set, InputSpec.of(trained.config.model), batch, losses=trained.losses)
    images = len(val_set.examples)
    first = next(iter(evaluator.batches))
    found = {key: value.numpy() for key, value in evaluator.step(first)[0].items()}  # traced
    image_ids, repeats = found.pop("image_id"), 20
    started = time.perf_counter()
    evaluator.detect_all()
    whole = (time.perf_counter() - started) / images
    started = time.perf_counter()
    for _ in evaluator.batches:
        pass
    pipeline = (time.perf_counter() - started) / images
    started = time.perf_counter()
    for _ in range(repeats):
        to_coco_detections(image_ids, found)
    conversion = (time.perf_counter() - started) / (repeats * batch)
    return whole, pipeline, conversion, rebuilt, read


def coco_eval_seconds(images: int, seed: int = 0) -> tuple[float, float, float]:
    """COCOeval of ``images`` images' detections (7 boxes each over 80 classes, 100 detections
    each: near misses, wrong classes, strays) by pycocotools and by faster-coco-eval; and their
    largest difference over the 12 figures."""
    from detsweep.evaluation.coco import coco_stats

    rng = random.Random(seed)
    truth, detections = {"images": [], "annotations": [], "categories": [{"id": c} for c in range(1, 81)]}, []
    for image_id in range(1, images + 1):
        truth["images"].append({"id": image_id, "width": 640, "height": 480})
        for _ in range(7):
            x, y, w, h = rng.uniform(0, 560), rng.uniform(0, 400), rng.uniform(4, 160), rng.uniform(4, 160)
            category = rng.randint(1, 80)
            truth["annotations"].append({"id": len(truth["annotations"]) + 1, "image_id": image_id, "iscrowd": 0,
                                         "category_id": category, "bbox": [x, y, w, h], "area": w * h})
            detections += [{"image_id": image_id, "category_id": category if rng.random() < 0.6 else rng.randint(1, 80),
                            "score": rng.random(), "bbox": [x + rng.gauss(0, 6), y + rng.gauss(0, 6),
                                                            w * rng.uniform(0.7, 1.3), h * rng.uniform(0.7, 1.3)]}
                           for _ in range(6)]
        detections += [{"image_id": image_id, "category_id": rng.randint(1, 80), "score": rng.random(),
                        "bbox": [rng.uniform(0, 600), rng.uniform(0, 440), rng.uniform(2, 200), rng.uniform(2, 200)]}
                       for _ in range(100 - 42)]
    timings, stats = [], []
    for faster in (False, True):
        copies = [dict(detection) for detection in detections]
        started = time.perf_counter()
        stats.append(coco_stats(truth, copies, faster=faster))
        timings.append(time.perf_counter() - started)
    return timings[0], timings[1], float(abs(stats[0] - stats[1]).max())


def share(evaluation_s: float, training_s: float) -> float:
    """An inline evaluation's share of the trial's time: the workers wait for it."""
    return evaluation_s / (evaluation_s + training_s)


def main() -> None:
    args = arguments(__doc__.splitlines()[0]).parse_args()
    from detsweep.train.strategy import use_worker_cpus

    use_worker_cpus(os.cpu_count() or 1)
    sample, steps, coco_images = (16, 2, 50) if args.smoke else (SAMPLE, 6, VAL_IMAGES)
    with tempfile.TemporaryDirectory(prefix="detsweep-bench-eval-") as scratch:
        val_pattern, _ = write_records(Path(scratch) / "val", sample, shards=1, seed=1)
        train_pattern, _ = write_records(Path(scratch) / "train", 64, shards=2, seed=2)
        checkpoint = Path(scratch) / "checkpoint"
        small = ["model.backbone=resnet_tiny", "model.image_size=128"] if args.smoke else []  # only checks the script
        train_rate = training_rate_and_checkpoint(train_pattern, steps, checkpoint, small)
        at_8 = inference(checkpoint, val_pattern, 8)
        at_32 = inference(checkpoint, val_pattern, 32 if not args.smoke else 8)
    pycocotools_s, faster_s, difference = coco_eval_seconds(coco_images)
    scale = VAL_IMAGES / coco_images  # COCOeval grows with the images (smoke: extrapolated)
    pycocotools_s, faster_s = pycocotools_s * scale, faster_s * scale
    per_image, pipeline_per_image, conversion, rebuilt, read = at_8
    training_images = EVAL_EVERY * BATCH

    # Here: rank 0 runs both passes over 5 000 images, then COCOeval twice; two workers train meanwhile idle.
    here_eval = PASSES * (VAL_IMAGES * per_image + pycocotools_s)
    here_training = training_images / (WORKERS * train_rate)
    # At a GPU's speed: the network at GPU_INFERENCE; the CPU-bound parts as measured, the input
    # pipeline over the worker's 8 CPUs (here: 2) beside the network, the conversion to COCO's form after it.
    cpu_scale = (os.cpu_count() or 1) / CPUS_PER_WORKER
    gpu_pass = VAL_IMAGES * (max(1 / GPU_INFERENCE, pipeline_per_image * cpu_scale) + conversion)
    gpu_training = training_images / (WORKERS * GPU_TRAINING)
    levers = {
        "as before (pycocotools, batch 8)": PASSES * (gpu_pass + pycocotools_s),
        "faster-coco-eval": PASSES * (gpu_pass + faster_s),
        "faster-coco-eval, batch 32 (the CPU's per-image ratio)": PASSES * (gpu_pass * at_32[0] / per_image + faster_s),
        "faster-coco-eval, inference sharded over 2 workers (built; at a GPU's speed an estimate)":
            PASSES * (gpu_pass / 2 + faster_s),
        "async: off the training path (estimate: one more GPU worker held per trial)": 0.0,
    }
    rows = [["what", "here (2 CPUs)", "at a GPU's speed (assumed)"],
            ["inference, s an image, batch 8 (pipeline, network, to COCO's form)", per_image, 1 / GPU_INFERENCE],
            ["inference, s an image, batch 32", at_32[0], "-"],
            ["input pipeline alone, s an image", pipeline_per_image, pipeline_per_image * cpu_scale],
            ["detections to COCO's form, s an image", conversion, conversion],
            ["COCOeval on 5 000 images, pycocotools, s", pycocotools_s, pycocotools_s],
            ["COCOeval on 5 000 images, faster-coco-eval, s", faster_s, faster_s],
            ["an async evaluation's start: model rebuilt from the checkpoint, s", rebuilt, "-"],
            [f"an async evaluation's start: val set of {sample} read, s", read, "-"],
            ["training between evaluations (2 500 steps of 64 on 2 workers), s", here_training, gpu_training],
            ["one evaluation (2 passes, 2 COCOevals), s", here_eval, levers["as before (pycocotools, batch 8)"]],
            ["an evaluator actor keeping the model and val set (not built): the start it saves, share of an "
             "evaluation with faster-coco-eval", "-", share(rebuilt + read * VAL_IMAGES / sample, levers["faster-coco-eval"])]]
    rows += [[f"share of the trial's time: {name}", share(here_eval, here_training) if name.startswith("as before")
              else "-", share(seconds, gpu_training)] for name, seconds in levers.items()]
    chosen = levers["faster-coco-eval"]
    record("evaluation_cost", Entry(
        title="An evaluation of val2017's size against the training it interrupts (bench/evaluation_cost.py)",
        settings={"model": "RetinaNet ResNet-50, 640 px fixed_shape, 80 classes (random weights: 100 detections an "
                  "image)", "measured_on": f"{sample} generated 640 x 480 JPEGs, extrapolated to {VAL_IMAGES}",
                  "recipe": "sweeps/coco_gpu.yaml: batch 64, 2 workers, eval every 2 500 steps, raw and averaged "
                  "weights", "gpu_assumed": f"inference {GPU_INFERENCE:.0f} images/s, training {GPU_TRAINING:.0f} "
                  "images/s a GPU", "training_here_images_per_s": train_rate, "threads": os.cpu_count()},
        rows=rows,
        targets=[Target("faster-coco-eval against pycocotools, largest difference over COCOeval's 12 figures",
                        "<= 1e-6", difference, difference <= 1e-6),
                 Target("an evaluation's share of training at a GPU's speed, with faster-coco-eval", "<= 10 %",
                        share(chosen, gpu_training), share(chosen, gpu_training) <= 0.10)],
        notes=["No GPU here: the GPU column takes the network's throughput as assumed (settings) and every CPU-bound "
               "part as measured here (the input pipeline over a GPU worker's 8 CPUs; COCOeval, one thread, as here).",
               "Inline evaluation is sharded over the trial's workers (built); its GPU figure divides the inference "
               "by the workers. An evaluator actor that keeps its model and val set is not built: an async "
               "evaluation pays the start measured above (the val set's read scaled to 5 000) at every evaluation."],
    ), args.out)


if __name__ == "__main__":
    main()
