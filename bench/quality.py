"""Quality bar of the quickstart trial: AP50 on held-out synthetic shapes, and the wall time
to get there, with 1 worker and with 2 workers (MultiWorkerMirroredStrategy), both through
`detsweep train` on a local Ray cluster. Writes bench/quality.json and a section of
bench/RESULTS.md.

    .venv/bin/python bench/quality.py [--set path=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "configs" / "quickstart.yaml"


def train(workers: int, overrides: list[str], storage: str) -> dict:
    command = [sys.executable, "-m", "detsweep.cli", "train", str(CONFIG), "--json", "--storage", storage,
               "--name", f"quality-{workers}w", "--set", f"scaling.num_workers={workers}"]
    for override in overrides:
        command += ["--set", override]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"training with {workers} worker(s) failed:\n{result.stderr[-3000:]}")
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    metrics = outcome["metrics"]
    return {
        "workers": workers,
        "wall_seconds": round(seconds, 1),
        "steps": outcome["steps"],
        "AP50": round(metrics["eval/AP50"], 4),
        "AP50_ema": round(metrics.get("eval_ema/AP50", float("nan")), 4),
        "AP": round(metrics["eval/AP"], 4),
        "AP_best": round(metrics["eval/AP_best"], 4),
        "images_per_sec": round(metrics["train/images_per_sec"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--workers", default="1,2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as storage:
        runs = [train(int(w), args.overrides, storage) for w in args.workers.split(",")]
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, no GPU",
        "config": str(CONFIG.relative_to(HERE.parent)),
        "overrides": args.overrides,
        "runs": runs,
    }
    (HERE / "quality.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
