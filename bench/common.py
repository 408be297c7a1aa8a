"""What every benchmark shares: the machine it ran on, medians, where results are kept, and a
free port for a server (the tests take theirs here too).

Each benchmark measures contenders side by side in one run and records one entry of
``bench/results.json``: its settings, a table, ratios and the targets they are held to.
``bench/RESULTS.md`` is rendered from that file between two markers; text outside them is
written by hand (the before/after notes of optimisations) and kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS_JSON = BENCH / "results.json"
RESULTS_MD = BENCH / "RESULTS.md"
README = REPO / "README.md"
RACCOON = REPO.parent / "shared" / "datasets" / "raccoon"
BEGIN, END = "<!-- bench:begin (written by bench/run_all.py) -->", "<!-- bench:end -->"
PACKAGES = ("tensorflow", "tensorflow-cpu", "keras", "keras-hub", "ray", "mlflow")


@dataclass
class Target:
    what: str
    goal: str  # as written in the issue, e.g. ">= 1.0"
    measured: float
    met: bool


@dataclass
class Entry:
    """One benchmark's result: ``rows`` is its table (first row the header)."""

    title: str
    settings: dict
    rows: list[list]
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    date: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M"))
    machine: dict = field(default_factory=lambda: machine())


def machine() -> dict:
    memory = next((int(line.split()[1]) // 1024 ** 2 for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal")), None) if Path("/proc/meminfo").exists() else None
    return {"cores": os.cpu_count(), "memory_gib": memory, "gpu": gpu_name(), "arch": platform.machine(),
            "python": platform.python_version(), "versions": versions()}


def gpu_name() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return names or None


def versions() -> dict[str, str]:
    found = {}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def throughputs(marks: list[tuple[int, float]], batch_size: int, skip: int = 1) -> list[float]:
    """Images/s of each window between consecutive ``(step, time)`` marks, the first ``skip``
    windows left out (tracing, warm-up) and the last too (a final checkpoint)."""
    rates = [(b_step - a_step) * batch_size / (b_time - a_time)
             for (a_step, a_time), (b_step, b_time) in zip(marks, marks[1:])]
    return rates[skip:-1] if len(rates) > skip + 1 else rates[skip:]


def record(name: str, entry: Entry, path: Path = RESULTS_JSON) -> None:
    """Keep ``entry`` as the latest result of benchmark ``name`` and print its table."""
    results = json.loads(path.read_text()) if path.exists() else {}
    results[name] = asdict(entry)
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(render_entry(results[name]))


def render_entry(entry: dict) -> str:
    header, *body = entry["rows"]
    gpu = entry["machine"].get("gpu") or "no GPU"
    lines = [f"### {entry['title']}", "",
             f"{entry['date']}, {entry['machine']['cores']} cores, {entry['machine']['memory_gib']} GiB, {gpu}; "
             + ", ".join(f"{k} {v}" for k, v in entry["machine"]["versions"].items()) + ".",
             "Settings: " + ", ".join(f"`{k}={v}`" for k, v in entry["settings"].items()) + ".", "",
             "| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in body]
    if entry["targets"]:
        lines += ["", "| target | goal | measured | met |", "|---|---|---|---|"]
        lines += [f"| {t['what']} | {t['goal']} | {cell(t['measured'])} | {'yes' if t['met'] else '**no**'} |"
                  for t in entry["targets"]]
    lines += [""] + [f"\n{note}\n" if note.startswith("|") else f"- {note}" for note in entry["notes"]]  # a table stands alone
    return "\n".join(lines).rstrip() + "\n"


def cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def render(results_path: Path = RESULTS_JSON, markdown: Path = RESULTS_MD) -> None:
    """Rewrite the generated part of RESULTS.md from results.json, and README's figures."""
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    generated = "\n".join([BEGIN, "", *[render_entry(entry) for entry in results.values()], END])
    text = markdown.read_text() if markdown.exists() else "# Measured figures\n\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + generated + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n" + generated + "\n"
    markdown.write_text(text)
    if results_path == RESULTS_JSON:  # README states the recorded figures, not a smoke run's
        from .readme import rewrite

        README.write_text(rewrite(README.read_text(), results))


def fresh_clone(prefix: str) -> tuple[str, Path, Path]:
    """A ``git clone`` of this repository's last commit in a new temporary folder, as a new
    user gets it: the commit's short hash, the clone, and the folder holding it (delete it
    when done)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    clone = folder / REPO.name
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    return commit, clone, folder


def arguments(description: str) -> argparse.ArgumentParser:
    """The flags every benchmark takes: ``--smoke`` (tiny, only checks that it runs) and ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only checks the script works")
    parser.add_argument("--out", type=Path, default=RESULTS_JSON, help="the results file to update")
    return parser


# Ports a benchmark or a test may take for a server: above Ray's worker ports (10002-19999 by
# default) and below the kernel's ephemeral range (32768 on), from which any process's outgoing
# connection or bind to port 0 may take one between our check and the server's bind.
PORTS = range(20000, 32768)
_handed_out: set[int] = set()


def free_port() -> int:
    """A port nobody listens on, never handed out before in this run: the several asked for
    before any is bound (a cluster's dashboard and agents) cannot be the same one."""
    for port in random.SystemRandom().sample(PORTS, 200):  # not a seed a test may have set
        if port in _handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:  # taken
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port among 200 tried in {PORTS}")
