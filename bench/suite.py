"""The two commands as a new user meets them: ``git clone`` of this repository's last commit
into a fresh folder, then ``make test`` there (install included), then ``make demo`` (the venv
already made). A run whose tests all passed is recorded as ``suite``; a failed one records
nothing and keeps its folder for a look. Each test file's seconds (set-up included, from
pytest's JUnit report) are a row of their own, so that the next change sees what it cost.
About 35-55 minutes on 2 cores, as fast as the machine is that day, so ``make bench`` leaves it
out: run it alone.

    .venv/bin/python -m bench.suite [--out FILE]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

from .common import REPO, Entry, arguments, fresh_clone, median, record

PASSED = re.compile(r"=+ (\d+) passed.* in ([\d.]+)s")


def seconds_per_file(junit: Path) -> list[tuple[str, float]]:
    """Each test file's seconds in pytest's JUnit report (its tests' set-up, call and tear-down),
    slowest first."""
    spent: Counter[str] = Counter()
    for case in ElementTree.parse(junit).iter("testcase"):
        spent[file_of(case)] += float(case.get("time", 0))
    return [(name, round(seconds, 1)) for name, seconds in spent.most_common()]


def file_of(case: ElementTree.Element) -> str:
    """``test_a.py`` for a JUnit test case of ``tests.test_a`` or ``tests.test_a.TestGroup``."""
    return next(f"{part}.py" for part in case.get("classname", "").split(".") if part.startswith("test_"))


def slowest_tests(junit: Path, count: int = 20) -> list[tuple[str, float]]:
    """The ``count`` slowest tests in pytest's JUnit report (``file.py::name``, seconds), slowest
    first: where the next fold of the suite would pay."""
    cases = [(f"{file_of(case)}::{case.get('name')}", float(case.get("time", 0)))
             for case in ElementTree.parse(junit).iter("testcase")]
    return [(name, round(seconds, 1)) for name, seconds in sorted(cases, key=lambda case: -case[1])[:count]]


def timed(command: list[str], folder: Path, log: Path, env: dict[str, str] | None = None) -> float:
    """Seconds ``command`` took in ``folder``, its output appended to ``log``; exits if it failed."""
    start = time.monotonic()
    with log.open("a") as out:
        code = subprocess.run(command, cwd=folder, stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, **(env or {})}).returncode
    if code != 0:
        raise SystemExit(f"bench.suite: {' '.join(command)} failed (exit {code}); nothing recorded, see {log}")
    return time.monotonic() - start


def machine_gauge(repeats: int = 3) -> float:
    """Seconds for a fixed pure-Python loop, the median of ``repeats``: the machine's speed the
    hour the suite ran, so that a change's cost can be told from the machine's (here the gauge
    once doubled within hours, and so did a bare process's start-up)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        total = 0
        for i in range(20_000_000):
            total += i
        times.append(time.perf_counter() - start)
    return round(median(times), 2)


def floor_gauge(repeats: int = 3) -> float:
    """Seconds from a bare process's fork to its first training step (``bench.startup``'s floor),
    the median of ``repeats``: the work the suite is made of (TensorFlow's import, a trace, a
    step). It tracks the suite where the Python loop does not: on a day the suite took 1.5x its
    usual time, the loop read 0.79 s (1.0 usual) and the floor 13.5 s (10.4 s in ``startup_1w``)."""
    from .startup import floor_of, start_floor

    return round(median([sum(floor_of(start_floor()).values()) for _ in range(repeats)]), 1)


def main() -> None:
    args = arguments(__doc__.splitlines()[0]).parse_args()
    commit, clone, folder = fresh_clone("detsweep-suite-")
    log = folder / "make.log"
    (folder / "shared").symlink_to(REPO.parent / "shared")  # the datasets, where CI has them too
    print(f"make test, then make demo, in {clone} (commit {commit}); their output in {log}", flush=True)
    junit = folder / "junit.xml"
    # Before the suite, with nothing else running. The floor runs this tree's venv (the clone has
    # none yet): it gauges the machine, not the commit.
    gauge, floor = machine_gauge(), floor_gauge()
    test = timed(["make", "test"], clone, log, env={"PYTEST_ADDOPTS": f"--junitxml={junit}"})
    output = log.read_text()
    [(passed, pytest_seconds)] = PASSED.findall(output)[-1:]
    seed = re.search(r"--randomly-seed=(\d+)", output)
    demo = timed(["make", "demo"], clone, log)
    record("suite", Entry(
        title="make test and make demo from a clean clone (bench/suite.py)",
        settings={"commit": commit, "seed": seed.group(1) if seed else "?"},
        rows=[["figure", "value"], ["make test, install included (s)", round(test)],
              ["pytest (s)", round(float(pytest_seconds))], ["tests passed", int(passed)],
              ["make demo, installed (s)", round(demo)], ["machine gauge: 20 million additions in Python (s)", gauge],
              ["machine gauge: a bare process's fork to its first training step (s)", floor],
              *[[f"{name} (s)", seconds] for name, seconds in seconds_per_file(junit)]],
        notes=["One run: the suite's time follows the machine's speed that day more than any one change.",
               "Slowest tests (s): " + "; ".join(f"{name} {seconds}" for name, seconds in slowest_tests(junit))],
    ), args.out)
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
