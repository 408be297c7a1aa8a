"""Scaling: the quickstart trial through Ray Train with 1 worker (all cores) and with 2 workers
(MultiWorkerMirroredStrategy, the cores split), same global batch. With ``--gpu``: a ResNet-50
FPN RetinaNet at 640 px (the zoo's network, as ``sweeps/coco_gpu.yaml`` trains one) on one GPU and on every GPU here, in
float32 and ``mixed_float16``, with and without XLA (detsweep's loop, in-process); it refuses
on a machine without GPUs, and ``--gpu --smoke`` runs it tiny on two logical CPU devices.

    .venv/bin/python -m bench.scaling [--smoke] [--windows N]
    .venv/bin/python -m bench.scaling --gpu [--batch-size 16] [--windows N]
"""

from __future__ import annotations

import os

from .common import Entry, arguments, record
from .train_step import bench_config, span_rate, under_ray_train


def workers(args) -> None:
    windows, steps_per_loop = (3, 2) if args.smoke else (args.windows, 10)
    cores = os.cpu_count() or 1
    layouts = {"1": [f"scaling.cpus_per_worker={cores}"],
               "2": ["scaling.num_workers=2", f"scaling.cpus_per_worker={max(1, cores // 2)}"],
               "1, XLA": [f"scaling.cpus_per_worker={cores}", "train.jit_compile=true"]}
    if args.smoke:  # one layout checks the script; tests/test_train runs two workers, test_train_step XLA
        layouts = {"1": layouts["1"]}
    rates = {}
    for name, overrides in layouts.items():
        config = bench_config(windows, steps_per_loop, args.smoke, overrides)
        rates[name] = span_rate(under_ray_train(config), config.train.batch_size).wall
    rows = [["workers", "CPUs each", "images/s", "vs 1 worker"]]
    rows += [[name, layouts[name][0 if "XLA" in name else -1].split("=")[1], rate, rate / rates["1"]]
             for name, rate in rates.items()]
    record("scaling_cpu", Entry(
        title="Scaling on this machine: 1 vs 2 Ray Train workers, and 1 with XLA (bench/scaling.py)",
        settings={"config": "configs/quickstart.yaml", "global_batch_size": 8, "steps_per_loop": steps_per_loop,
                  "windows": windows},
        rows=rows,
        notes=["Two workers on one machine split its cores and add an all-reduce per step: on a 2-core machine "
               "this measures the cost of MultiWorkerMirroredStrategy, not a speed-up.",
               "1, XLA: train.jit_compile, each step's forward and backward pass compiled by XLA (one run each: "
               "single runs spread about 8 % here)."],
    ), args.out)


# A ResNet-50 FPN RetinaNet, levels 3-7 (random encoder weights: the speed is the same).
# Its image size is the run's own (640 px; the smoke's smaller).
COCO_GPU = ["model.backbone=resnet50", "model.max_level=7", "model.head_conv_layers=4"]


def gpu(args) -> None:
    """Every GPU TensorFlow sees here (``--smoke``: two logical CPU devices stand in): images/s
    of detsweep's step on one device and on all of them, float32 and ``mixed_float16``, each with
    and without XLA, scaling efficiency and peak device memory.
    One process: the precision policy is set before each model is built."""
    import sys

    import tensorflow as tf

    if args.smoke:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        devices = ["/cpu:0", "/cpu:1"]
    else:
        devices = [f"/gpu:{index}" for index, _ in enumerate(tf.config.list_physical_devices("GPU"))]
    if not devices:
        seen = ", ".join(d.name.removeprefix("/physical_device:") for d in tf.config.list_physical_devices())
        print(f"bench.scaling --gpu: found no GPU (TensorFlow sees {seen}), expected a machine with GPUs "
              "(--smoke runs it on two logical CPU devices)", file=sys.stderr)
        raise SystemExit(2)
    size, per_device, windows, steps = (64, 2, 2, 1) if args.smoke else (640, args.batch_size, args.windows, 10)
    rows = [["precision", "XLA", "devices", "images/s", "per device / one device's without XLA", "peak device memory (GB)"]]
    one_device: dict[str, float] = {}  # by precision, without XLA
    # The smoke run checks the script's paths in float32 without XLA alone: a CPU runs float16 at
    # ~1 image/s, and XLA on two logical devices is tests/test_train_step's.
    for policy in ("float32",) if args.smoke else ("float32", "mixed_float16"):
        for jit, count in ((False, 1), (False, len(devices))) if args.smoke else (
                (False, 1), (True, 1), (False, len(devices)), (True, len(devices))):
            if count > 1 and len(devices) == 1:  # one GPU here: its one-device rows are all there is
                continue
            overrides = [*([] if args.smoke else COCO_GPU), f"model.image_size={size}", f"data.train.image_size={size}",
                         f"train.batch_size={per_device * count}", f"train.mixed_precision={policy}",
                         f"train.jit_compile={str(jit).lower()}"]
            config = bench_config(windows, steps, args.smoke, overrides)
            rate, peak = device_rate(config, devices[:count], windows, steps)
            if (count, jit) == (1, False):
                one_device[policy] = rate
            rows.append([policy, "on" if jit else "off", count, rate, rate / (count * one_device[policy]),
                         "n/a (CPU)" if peak is None else peak / 1e9])
    record("scaling_gpu", Entry(
        title=("Two logical CPU devices standing in for GPUs" if args.smoke else "This machine's GPUs") + ": "
              "a ResNet-50 RetinaNet by precision, XLA and devices (bench/scaling.py --gpu)",
        settings={"devices": devices, "image_size": size, "batch_per_device": per_device, "windows": windows,
                  "steps_per_loop": steps, "encoder": "resnet50 (random init)" if not args.smoke else "quickstart's"},
        rows=rows,
        notes=["images/s from the end of the first loop (tracing) to the end of the last. Per device against one "
               "device without XLA, at the same precision: on all devices, the scaling efficiency; with XLA, its "
               "speed-up.",
               "Not yet run on a GPU: our machines have none."],
    ), args.out)


def device_rate(config, devices: list[str], windows: int, steps: int) -> tuple[float, float | None]:
    """detsweep's loop on ``devices`` (a MirroredStrategy over several, NCCL between GPUs):
    images/s after the first loop, and the first device's peak memory (None on a CPU)."""
    import time

    import keras
    import tensorflow as tf

    from detsweep.data import load_dataset
    from detsweep.data.pipeline import training_dataset
    from detsweep.data.processing import InputSpec
    from detsweep.train.checkpoint import build_training_state
    from detsweep.train.step import make_train_loop

    gpus = devices[0].startswith("/gpu")
    first = devices[0].lstrip("/").upper()  # its name for the memory statistics, e.g. GPU:0
    if gpus:
        tf.config.experimental.reset_memory_stats(first)
    keras.mixed_precision.set_global_policy(config.train.mixed_precision)
    keras.utils.set_random_seed(config.train.seed)
    strategy = (tf.distribute.OneDeviceStrategy(devices[0]) if len(devices) == 1 else tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.NcclAllReduce() if gpus else None))
    train_set = load_dataset(config.data.train, verify=False)
    with strategy.scope():
        state, losses = build_training_state(config, len(train_set.categories))
    data = training_dataset(train_set, InputSpec(config.model.image_size), config.data.augmentation,
                            config.train.batch_size, seed=0)
    batches = iter(strategy.experimental_distribute_dataset(data))
    loop = make_train_loop(strategy, state.model, losses, state.optimizer, state.moving_average, state.step,
                           jit_compile=config.train.jit_compile)
    marks = []
    for _ in range(windows):
        float(loop(batches, tf.constant(steps))["loss"])  # waits for the loop's end
        marks.append(time.perf_counter())
    rate = (windows - 1) * steps * config.train.batch_size / (marks[-1] - marks[0])
    peak = tf.config.experimental.get_memory_info(first)["peak"] if gpus else None
    return rate, peak


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--gpu", action="store_true", help="the GPU run: precision, XLA, one device and all")
    parser.add_argument("--batch-size", type=int, default=16, help="--gpu: images per device")
    args = parser.parse_args()
    (gpu if args.gpu else workers)(args)


if __name__ == "__main__":
    main()
