"""``make demo`` as a new user meets it, twice: in a fresh clone of this repository's last
commit on a quiet machine (the install included), then again in that clone while another
program keeps both cores busy. The demo is the same sweep on any machine when both runs train
the same trials to the same steps and the same trial wins. About 11 minutes on 2 cores, so
``make bench`` leaves it out: run it alone, on an otherwise quiet machine.

    .venv/bin/python -m bench.demo [--out FILE]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import Entry, Target, arguments, fresh_clone, record

GOAL_S = 300  # a fresh clone's make demo, install included, on a quiet machine
BUSY = "while True: pass"  # one per core: the machine's other work, at the same priority as the demo


def demo(clone: Path, log: Path) -> tuple[float, dict]:
    """Seconds ``make demo`` took in ``clone``, and ``detsweep status --json`` of the sweep it ran."""
    runs = clone / "demo-out" / "ray"
    before = set(runs.glob("*")) if runs.exists() else set()
    start = time.monotonic()
    with log.open("a") as out:
        code = subprocess.run(["make", "demo"], cwd=clone, stdout=out, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - start
    if code != 0:
        raise SystemExit(f"bench.demo: make demo failed (exit {code}); nothing recorded, see {log}")
    [folder] = set(runs.glob("*")) - before
    status = subprocess.run([str(clone / ".venv" / "bin" / "detsweep"), "status", str(folder / "quickstart"),
                             "--json"], cwd=clone, capture_output=True, text=True, check=True)
    return seconds, json.loads(status.stdout)


def describe(config: dict) -> str:
    """A trial named by its drawn values, e.g. ``learning_rate_base=0.0412, moving_average_decay=0.995``."""
    return ", ".join(f"{path.rsplit('.', 1)[-1]}={value:.4g}" if isinstance(value, float) else
                     f"{path.rsplit('.', 1)[-1]}={value}" for path, value in sorted(config.items()))


def outcome(report: dict) -> dict[str, tuple[str, int, float | None]]:
    """Each trial, by its drawn values: its status, its last step and its best ``eval/AP_best``."""
    return {describe(trial["config"]): (trial["status"], int(trial["metrics"].get("step", 0)),
                                        trial["metrics"].get(report["metric"])) for trial in report["trials"]}


def decisions(report: dict) -> tuple[dict[str, tuple[str, int]], str]:
    """What a sweep decided: each trial's status and last step, and the winner."""
    return ({name: (status, step) for name, (status, step, _) in outcome(report).items()},
            describe(report["best"]["config"]))


def main() -> None:
    args = arguments(__doc__.splitlines()[0]).parse_args()
    commit, clone, folder = fresh_clone("detsweep-demo-")
    log = folder / "make.log"
    print(f"make demo twice in {clone} (commit {commit}), the second beside two busy processes; output in {log}",
          flush=True)
    quiet_s, quiet = demo(clone, log)
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    try:
        busy_s, loaded = demo(clone, log)
    finally:
        for process in busy:
            process.kill()
    rows = [["run", "seconds", "trials: status at step (eval/AP_best)", "winner"]]
    for name, seconds, report in (("fresh clone, install included, quiet", quiet_s, quiet),
                                  ("installed, both cores busy", busy_s, loaded)):
        trials = "; ".join(f"{trial}: {status} at {step} ({score:.4f})" if score is not None else
                           f"{trial}: {status} at {step}" for trial, (status, step, score) in
                           sorted(outcome(report).items()))
        rows.append([name, round(seconds), trials, decisions(report)[1]])
    same = decisions(quiet) == decisions(loaded)
    identical = outcome(quiet) == outcome(loaded)
    record("demo", Entry(
        title="make demo from a fresh clone, quiet and with both cores busy (bench/demo.py)",
        settings={"commit": commit, "sweep": "sweeps/quickstart.yaml", "busy": f"2 x python -c '{BUSY}'"},
        rows=rows,
        targets=[Target("a fresh clone's make demo, install included, quiet (s)", f"<= {GOAL_S}", quiet_s,
                        quiet_s <= GOAL_S),
                 Target("both cores busy: the same trials reach the same steps and the same trial wins", "same",
                        float(same), same)],
        notes=[f"Every trial's eval/AP_best the same in both runs, to the last digit: {identical}."],
    ), args.out)
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
