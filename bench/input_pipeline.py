"""Input pipeline: images/s of detsweep's tf.data pipeline on the raccoon photos at the
training resolution, against what the model consumes on this machine (the train step of
``configs/raccoon.yaml``, in-process). Both use every core, one after the other.

And the pipeline per thread at the zoo RetinaNet's input (``configs/odapi/ssd_resnet50_v1_fpn_640x640.config``:
``fixed_shape_resizer`` 640 x 640, ``random_horizontal_flip`` and its ``random_crop_image``), tf.data
held to one thread, against the 80 images/s a thread must give.

    .venv/bin/python -m bench.input_pipeline [--smoke] [--batches N]
"""

from __future__ import annotations

import os
import time

from .common import RACCOON, REPO, Entry, Target, arguments, median, record, throughputs

CONFIG = REPO / "configs" / "raccoon.yaml"


def pipeline_rates(config, batches: int, repeats: int) -> list[float]:
    """Images/s of the training pipeline (decode, resize, flip, pad, normalise, batch), each
    repeat a fresh pipeline past its first batch (autotuning and file-cache warm-up)."""
    from detsweep.data import load_dataset
    from detsweep.data.pipeline import training_dataset
    from detsweep.data.processing import InputSpec

    train_set = load_dataset(config.data.train)
    rates = []
    for repeat in range(repeats):
        data = iter(training_dataset(train_set, InputSpec(config.model.image_size), config.data.augmentation,
                                     batch_size=config.train.batch_size, seed=repeat))
        next(data)
        started = time.perf_counter()
        for _ in range(batches):
            next(data)
        rates.append(batches * config.train.batch_size / (time.perf_counter() - started))
    return rates


def per_thread_rates(config, batches: int, repeats: int) -> tuple[list[float], list[float]]:
    """Images/s of the training pipeline at 640 px with the zoo RetinaNet's augmentations, tf.data
    on one thread (its private thread pool, one op at a time), each repeat a fresh pipeline past
    its first batch; and the cores the process kept busy meanwhile (1.0: one thread did the work)."""
    import tensorflow as tf

    from detsweep.config import AugmentationConfig, ModelConfig
    from detsweep.data import load_dataset
    from detsweep.data.pipeline import training_dataset
    from detsweep.data.processing import InputSpec

    spec = InputSpec.of(ModelConfig(image_size=640, image_resizer="fixed_shape"))
    zoo = AugmentationConfig(random_horizontal_flip=0.5, random_crop_image={
        "min_object_covered": 0.0, "min_aspect_ratio": 0.75, "max_aspect_ratio": 3.0, "min_area": 0.75,
        "max_area": 1.0, "overlap_thresh": 0.0})
    one_thread = tf.data.Options()
    one_thread.threading.private_threadpool_size = 1
    one_thread.threading.max_intra_op_parallelism = 1
    train_set = load_dataset(config.data.train)
    rates, cores = [], []
    for repeat in range(repeats):
        data = iter(training_dataset(train_set, spec, zoo, batch_size=config.train.batch_size, seed=repeat)
                    .with_options(one_thread))
        next(data)
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(batches):
            next(data)
        wall = time.perf_counter() - started
        rates.append(batches * config.train.batch_size / wall)
        cores.append((time.process_time() - cpu) / wall)
    return rates, cores


def consumption_rates(overrides: list[str], windows: int, steps_per_loop: int) -> list[float]:
    """Images/s of the train step: detsweep's loop, in-process, no evaluation."""
    from detsweep.config import load_trial_config
    from detsweep.train import run_training

    steps = windows * steps_per_loop
    training = load_trial_config(CONFIG, [
        "data.val=null", f"train.num_steps={steps}", f"train.steps_per_loop={steps_per_loop}",
        f"train.eval_every={steps}", f"train.checkpoint_every={steps}", f"optimizer.learning_rate.total_steps={steps}",
        "optimizer.learning_rate.warmup_steps=0", f"scaling.cpus_per_worker={os.cpu_count()}", *overrides])
    marks = []
    run_training(training, lambda metrics, checkpoint, milestone, pictures: marks.append((int(metrics["step"]), time.time())))
    return throughputs(marks, training.train.batch_size, skip=0)


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()
    if not RACCOON.exists():
        raise SystemExit(f"{RACCOON}: the raccoon dataset is not there (it sits in ../shared beside the repository)")
    from detsweep.config import load_trial_config
    from detsweep.train.strategy import use_worker_cpus

    use_worker_cpus(os.cpu_count() or 1)
    overrides = ["data.train.subset=[0, 16]"] if args.smoke else []
    config = load_trial_config(CONFIG, overrides)
    batches, repeats = (2, 1) if args.smoke else (args.batches, 3)
    supply = median(pipeline_rates(config, batches, repeats))
    per_thread, cores = (median(figures) for figures in per_thread_rates(config, batches, repeats))
    demand = median(consumption_rates(overrides, *((3, 1) if args.smoke else (6, 5))))
    record("input_pipeline", Entry(
        title="Input pipeline vs the model's consumption (bench/input_pipeline.py)",
        settings={"config": "configs/raccoon.yaml", "image_size": config.model.image_size,
                  "batch_size": config.train.batch_size, "images": len(range(*config.data.train.subset)),
                  "threads": os.cpu_count(), "per_thread": "640 px fixed_shape, random_crop_image (min_object_covered "
                  "0, aspect 0.75-3, area 0.75-1, overlap_thresh 0) and random_horizontal_flip, 1 tf.data thread"},
        rows=[["what", "images/s (median)"], ["tf.data pipeline (decode JPEG, resize, flip, pad, normalise)", supply],
              ["train step (consumption)", demand], ["ratio", supply / demand],
              ["tf.data pipeline per thread, 640 px, zoo RetinaNet augmentations (decode, crop, flip, resize, "
               "normalise)", per_thread]],
        targets=[Target("pipeline / consumption", ">= 4x", supply / demand, supply / demand >= 4),
                 Target("images/s per pipeline thread at 640 px, zoo RetinaNet augmentations", ">= 80", per_thread,
                        per_thread >= 80)],
        notes=["The pipeline is read alone, past its first batch; in training it runs beside the step, "
               "ahead of it by tf.data's prefetch.",
               f"Per thread: tf.data's private thread pool of 1 and intra-op parallelism 1; the process kept "
               f"{cores:.2f} cores busy meanwhile (the thread, and the reading loop)."],
    ), args.out)


if __name__ == "__main__":
    main()
