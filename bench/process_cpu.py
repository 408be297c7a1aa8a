"""Where a command's CPU goes, by kind of process: every process that runs while it does (Ray's
daemons and actors included, however they were started), its CPU seconds from when it was
first seen, grouped by its title (``ray::TrainController``, ``dashboard.py``, …); then the
whole machine's CPU seconds over the command (``/proc/stat``). Nothing else should run.
Processes are looked at every ``--every`` seconds: what one spends after the last look
before it ends is missed (the machine's figure has it).

    .venv/bin/python -m bench.process_cpu [--every 0.2] -- COMMAND ...

e.g. ``-- .venv/bin/detsweep launch tiny.yaml``: a trial's processes beside its worker's.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import time

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


def watch(command: list[str], every: float) -> tuple[dict[str, tuple[int, float]], float, float, int]:
    """Run ``command``; per title (processes, CPU seconds), the machine's CPU seconds, the wall
    seconds and the command's exit code."""
    first, last, titles = {}, {}, {}
    started, machine = time.time(), machine_cpu_s()
    running = subprocess.Popen(command)
    while True:
        done = running.poll() is not None
        for process in psutil.process_iter():
            try:
                key = (process.pid, process.create_time())
                times = process.cpu_times()
                seconds = times.user + times.system
                first.setdefault(key, seconds if key[1] < started else 0.0)
                last[key] = seconds
                # A Ray worker is known by the actor it becomes, whatever it was called before.
                now = title(process)
                if key not in titles or (now.startswith("ray::") and now != "ray::IDLE"):
                    titles[key] = now
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if done:
            break
        time.sleep(every)
    by_title: dict[str, list[float]] = collections.defaultdict(list)
    for key, seconds in last.items():
        if seconds - first[key] >= 0.05:
            by_title[titles[key]].append(seconds - first[key])
    return ({name: (len(spent), sum(spent)) for name, spent in by_title.items()},
            machine_cpu_s() - machine, time.time() - started, running.returncode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=0.2, help="seconds between two looks at the processes")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    by_title, machine, wall, code = watch(command, args.every)
    print("| CPU s | processes | process |\n|---|---|---|")
    for name, (count, seconds) in sorted(by_title.items(), key=lambda item: -item[1][1]):
        print(f"| {seconds:.1f} | {count} | {name} |")
    print(f"\nall processes seen: {sum(s for _, s in by_title.values()):.1f} CPU s; the machine: {machine:.1f} CPU s "
          f"in {wall:.1f} s; exit code {code}")
    raise SystemExit(code)


if __name__ == "__main__":
    main()
