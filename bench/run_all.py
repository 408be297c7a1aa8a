"""``make bench``: every benchmark, each in its own process (a fresh TensorFlow runtime and Ray
cluster), then the tables of ``bench/results.json`` rendered into ``bench/RESULTS.md``.

    .venv/bin/python -m bench.run_all [--smoke] [--out FILE] [--only name,...]

The GPU run of ``bench.scaling`` runs where this machine has a GPU, and with ``--smoke`` on two
logical CPU devices standing in for GPUs.
"""

from __future__ import annotations

import subprocess
import sys

from .common import REPO, RESULTS_JSON, RESULTS_MD, arguments, gpu_name, render

BENCHMARKS = {
    "train_step": ["bench.train_step"],
    "allocator": ["bench.allocator"],
    "startup": ["bench.startup"],
    "input_pipeline": ["bench.input_pipeline"],
    "data_memory": ["bench.data_memory"],
    "evaluation_cost": ["bench.evaluation_cost"],
    "importance": ["bench.importance"],
    "zoo_retinanet": ["bench.zoo_retinanet"],
    "int8_export": ["bench.int8_export"],
    "scaling": ["bench.scaling"],
    "scaling_gpu": ["bench.scaling", "--gpu"],
    "early_stopping": ["bench.early_stopping"],
    "replay_settings": ["bench.replay_settings"],
    "replay_scale": ["bench.replay_scale"],
    "large_sweep": ["bench.large_sweep"],
    "tracking_server": ["bench.tracking_server"],
    "tracking_load": ["bench.tracking_load"],
}


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated names, e.g. train_step,startup")
    args = parser.parse_args()
    chosen = {name: command for name, command in BENCHMARKS.items() if not args.only or name in args.only.split(",")}
    if not (gpu_name() or args.smoke) and chosen.pop("scaling_gpu", None):
        print("== scaling_gpu: left out, this machine has no GPU", flush=True)
    failed = []
    for name, (module, *flags) in chosen.items():
        print(f"== {name}", flush=True)
        command = [sys.executable, "-m", module, *flags, "--out", str(args.out), *(["--smoke"] if args.smoke else [])]
        if subprocess.run(command, cwd=REPO).returncode != 0:
            failed.append(name)
    if args.out == RESULTS_JSON:
        render()
        print(f"wrote {RESULTS_JSON.relative_to(REPO)} and {RESULTS_MD.relative_to(REPO)}")
    else:
        render(args.out, args.out.with_suffix(".md"))
    if failed:
        raise SystemExit(f"benchmarks that failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
