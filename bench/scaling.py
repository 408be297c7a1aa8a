"""Scaling: the quickstart trial through Ray Train with 1 worker (all cores) and with 2 workers
(MultiWorkerMirroredStrategy, the cores split), same global batch. With ``--gpu``: single-GPU
images/s of RetinaNet with a ResNet-50 encoder at 640 px, float32 against ``mixed_float16``
(detsweep's loop, in-process).

    .venv/bin/python -m bench.scaling [--smoke] [--windows N]
    .venv/bin/python -m bench.scaling --gpu [--batch-size 16]
"""

from __future__ import annotations

import argparse
import os

from detsweep.cluster import fast_allocator

from .common import Entry, Target, arguments, record
from .train_step import bench_config, run_contender, span_rate, under_ray_train


def workers(args) -> None:
    windows, steps_per_loop = (3, 2) if args.smoke else (args.windows, 10)
    cores = os.cpu_count() or 1
    layouts = {1: [f"scaling.cpus_per_worker={cores}"],
               2: ["scaling.num_workers=2", f"scaling.cpus_per_worker={max(1, cores // 2)}"]}
    rates = {}
    for count, overrides in layouts.items():
        config = bench_config(windows, steps_per_loop, args.smoke, overrides)
        rates[count] = span_rate(under_ray_train(config), config.train.batch_size).wall
    rows = [["workers", "CPUs each", "images/s", "vs 1 worker"]]
    rows += [[count, layouts[count][-1].split("=")[1], rate, rate / rates[1]] for count, rate in rates.items()]
    record("scaling_cpu", Entry(
        title="Scaling on this machine: 1 vs 2 Ray Train workers (bench/scaling.py)",
        settings={"config": "configs/quickstart.yaml", "global_batch_size": 8, "steps_per_loop": steps_per_loop,
                  "windows": windows},
        rows=rows,
        notes=["Two workers on one machine split its cores and add an all-reduce per step: on a 2-core machine "
               "this measures the cost of MultiWorkerMirroredStrategy, not a speed-up."],
    ), args.out)


def gpu(args) -> None:
    size, batch, windows = (128, 2, 3) if args.smoke else (640, args.batch_size, args.windows)
    overrides = ["model.backbone=resnet50", f"model.image_size={size}", f"data.train.image_size={size}",
                 f"train.batch_size={batch}", "model.max_level=7", "model.head_conv_layers=4"]
    rates = {}
    for policy in ("float32", "mixed_float16"):  # detsweep's loop, each in a process of its own
        run = argparse.Namespace(smoke=False, overrides=[*overrides, f"train.mixed_precision={policy}"],
                                 batch_size=batch)
        rates[policy] = run_contender("loop", fast_allocator(), run, windows, 2 if args.smoke else 10).wall
    speedup = rates["mixed_float16"] / rates["float32"]
    record("scaling_gpu", Entry(
        title="One GPU: RetinaNet ResNet-50 at 640 px, float32 vs mixed_float16 (bench/scaling.py --gpu)",
        settings={"image_size": size, "batch_size": batch, "windows": windows, "encoder": "resnet50 (random init)"},
        rows=[["precision", "images/s"], *[[policy, rate] for policy, rate in rates.items()],
              ["mixed_float16 / float32", speedup]],
        targets=[Target("mixed_float16 / float32", "> 1.0 on a GPU", speedup, speedup > 1.0)],
    ), args.out)


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--gpu", action="store_true", help="the single-GPU float32 vs mixed_float16 run")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    (gpu if args.gpu else workers)(args)


if __name__ == "__main__":
    main()
