"""The model zoo's RetinaNet as ``import-odapi`` carries it (ResNet-50 FPN, levels 3-7, 640 x 640
stretched, l2 on every kernel): seconds per training step and the process's peak memory, on
the raccoon photos, against the same network at 256 px in the same run.

    .venv/bin/python -m bench.zoo_retinanet [--smoke] [--steps N] [--batch N]

Each size trains in a process of its own (detsweep's loop, no Ray), so that its peak resident
memory is its own.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

from .common import RACCOON, REPO, Entry, arguments, median, record

CONFIG = REPO / "configs" / "odapi" / "ssd_resnet50_v1_fpn_640x640.config"
WARM_UP = 2  # loops left out: tracing, first allocations


def train_process() -> None:
    """Run as ``--train SIZE STEPS BATCH BACKBONE``: train, print each loop's time and the peak RSS as JSON."""
    size, steps, batch, backbone = sys.argv[sys.argv.index("--train") + 1:][:4]
    from detsweep.config import load_trial_config
    from detsweep.train import run_training

    config = load_trial_config(CONFIG, [
        f"model.image_size={size}", f"model.backbone={backbone}", "model.num_classes=1", f"train.batch_size={batch}",
        f"train.num_steps={steps}", "train.steps_per_loop=1", "optimizer.learning_rate.total_steps=1000",
        "optimizer.learning_rate.warmup_steps=1", "optimizer.learning_rate.learning_rate_base=0.004",
        "optimizer.learning_rate.warmup_learning_rate=0.001", "data.train.format=tfrecord",
        f"data.train.annotations={RACCOON / 'data' / 'test.record'}",
        f"data.train.label_map={RACCOON / 'training' / 'object-detection.pbtxt'}",
    ])
    ends: list[float] = []
    run_training(config, lambda metrics, checkpoint, milestone, pictures: ends.append(time.perf_counter()))
    seconds = [later - earlier for earlier, later in zip(ends, ends[1:])][WARM_UP - 1:]
    print(json.dumps({"seconds_per_step": seconds,
                      "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2}))


def train(size: int, steps: int, batch: int, backbone: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "bench.zoo_retinanet", "--train", str(size), str(steps), str(batch),
                             backbone], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    if "--train" in sys.argv:
        return train_process()
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="steps per size, the first two left out")
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    sizes, backbone, steps = ((128, 128), "resnet_tiny", 4) if args.smoke else ((640, 256), "resnet50", args.steps)
    rows = [["input", "seconds per step (median)", "images/s", "peak RSS (GiB)"]]
    per_step = {}
    for size in dict.fromkeys(sizes):
        run = train(size, steps, args.batch, backbone)
        per_step[size] = median(run["seconds_per_step"])
        rows.append([f"{size} x {size}", per_step[size], args.batch / per_step[size], run["peak_rss_gib"]])
    big, small = sizes
    record("zoo_retinanet", Entry(
        title="The zoo's RetinaNet as imported, training on 2 cores (bench/zoo_retinanet.py)",
        settings={"config": str(CONFIG.relative_to(REPO)), "backbone": backbone, "batch": args.batch,
                  "steps": steps, "warm_up_loops": WARM_UP, "data": "raccoon test.record (40 photos)"},
        rows=rows,
        notes=[f"{big} px costs {per_step[big] / per_step[small]:.1f}x the step of {small} px in the same run "
               f"({(big / small) ** 2:.1f}x the pixels).",
               "CPU only: a GPU node's figures are not measured here."],
    ), args.out)


if __name__ == "__main__":
    main()
