"""Where a command's CPU goes, by kind of process: every process that runs while it does (Ray's
daemons and actors included, however they were started), its CPU seconds from when it was
first seen, and how often its threads were switched in and out (wakeups), grouped by its
title (``ray::TrainController``, ``dashboard.py``, …); then the whole machine's CPU seconds
(``/proc/stat``). Nothing else should run. Processes are looked at every ``--every`` seconds:
what one spends after the last look before it ends is missed (the machine's figure has it).
``--from``/``--for`` count a window of the run only (steady training, past start-up).

    .venv/bin/python -m bench.process_cpu [--every 0.2] [--from S] [--for S] -- COMMAND ...

e.g. ``-- .venv/bin/detsweep launch tiny.yaml``: a trial's processes beside its worker's.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


def title(process: psutil.Process) -> str:
    """``ray::TrainController`` for a Ray actor (its title, without the method it runs), the
    script for a Python process, else the executable's name."""
    words = process.cmdline() or [process.name()]
    if words[0].startswith("ray::"):
        return words[0].split(".")[0]
    if "python" in words[0].rsplit("/", 1)[-1]:
        return " ".join(word.rsplit("/", 1)[-1] for word in words[1:3])[:60].replace("\n", " ")
    return words[0].rsplit("/", 1)[-1]


def machine_cpu_s() -> float:
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, *_ = (int(value) for value in stat.readline().split()[1:])
    return (user + nice + system + irq + softirq) / 100


def switches(pid: int) -> int:
    """Context switches of all of a process's threads (``/proc/PID/status`` counts one thread's)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += sum(int(line.split()[1]) for line in (task / "status").read_text().splitlines()
                         if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))
    return total


@dataclass
class Watched:
    by_title: dict[str, tuple[int, float, float]]  # title → (processes, CPU seconds, wakeups per second)
    machine_cpu_s: float
    wall_s: float  # of the window counted
    exit_code: int


def watch(command: list[str], every: float, start: float = 0.0, length: float = math.inf) -> Watched:
    """Run ``command`` and count what its processes spend from ``start`` seconds after it began,
    for ``length`` seconds (or until it ends)."""
    first, last, titles = {}, {}, {}
    running = subprocess.Popen(command)
    began = time.time()
    opens, closes = began + start, began + start + length
    opened, machine_at_open = None, 0.0  # when the window opened, and the machine's CPU seconds then
    while True:
        done, now = running.poll() is not None, time.time()
        if opened is None and now >= opens:
            opened, machine_at_open = now, machine_cpu_s()
        for process in psutil.process_iter():
            try:
                key = (process.pid, process.create_time())
                times = process.cpu_times()
                spent = (times.user + times.system, switches(process.pid))
                if opened is None:  # before the window: where the process stands when it opens
                    first[key] = spent
                    continue
                first.setdefault(key, spent if key[1] < opens else (0.0, 0))
                last[key] = spent
                # A Ray worker is known by the actor it becomes, whatever it was called before.
                name = title(process)
                if key not in titles or (name.startswith("ray::") and name != "ray::IDLE"):
                    titles[key] = name
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):  # it ended
                continue
        if done or now >= closes:
            break
        time.sleep(every)
    wall = time.time() - opened if opened is not None else 0.0
    machine = machine_cpu_s() - machine_at_open if opened is not None else 0.0
    by_title: dict[str, list[tuple[float, int]]] = collections.defaultdict(list)
    for key, (seconds, count) in last.items():
        spent = (seconds - first[key][0], count - first[key][1])
        if spent[0] >= 0.05:
            by_title[titles[key]].append(spent)
    running.wait()
    return Watched({name: (len(spent), sum(s for s, _ in spent), sum(n for _, n in spent) / max(wall, 1e-9))
                    for name, spent in by_title.items()}, machine, wall, running.returncode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=0.2, help="seconds between two looks at the processes")
    parser.add_argument("--from", dest="start", type=float, default=0.0, help="count from this many seconds in")
    parser.add_argument("--for", dest="length", type=float, default=math.inf, help="count this many seconds")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    watched = watch(command, args.every, args.start, args.length)
    print("| CPU s | wakeups/s | processes | process |\n|---|---|---|---|")
    for name, (count, seconds, wakeups) in sorted(watched.by_title.items(), key=lambda item: -item[1][1]):
        print(f"| {seconds:.1f} | {wakeups:.0f} | {count} | {name} |")
    print(f"\nall processes seen: {sum(s for _, s, _ in watched.by_title.values()):.1f} CPU s; the machine: "
          f"{watched.machine_cpu_s:.1f} CPU s in {watched.wall_s:.1f} s; exit code {watched.exit_code}")
    raise SystemExit(watched.exit_code)


if __name__ == "__main__":
    main()
