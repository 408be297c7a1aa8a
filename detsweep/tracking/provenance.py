"""What a run ran on, as tags: the versions of the libraries a detector's results depend on,
Python's, and the hash of the lock file that fixed every package. Each run's tags come from
the process that writes it (the sweep's driver for its run, a trial's own process, maybe on
another node, for the trial's), so a node set up differently shows on its trials' runs."""

from __future__ import annotations

import functools
import hashlib
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import detsweep

LIBRARIES = ("ray", "tensorflow", "keras", "keras-hub", "mlflow", "optuna")
VERSION_TAG = "detsweep.version."  # + the distribution's name
PYTHON_TAG = "detsweep.python"
LOCK_TAG = "detsweep.lock"
LOCK_HASH_LENGTH = 16  # hex digits of the SHA-256: enough to tell two lock files apart


def lock_file() -> Path:
    """``uv.lock`` of the checkout detsweep runs from: it is installed editable, and a
    cluster's nodes run from a copy of the checkout."""
    return Path(detsweep.__file__).resolve().parents[1] / "uv.lock"


@functools.cache
def run_environment_tags() -> dict[str, str]:
    """``detsweep.version.<dist>`` for each of :data:`LIBRARIES` that is installed (read from
    its metadata: nothing is imported), ``detsweep.python``, and ``detsweep.lock``: the first
    16 hex digits of the lock file's SHA-256, or ``none`` without one. Read once per process:
    none of it changes while it runs; so each call returns the same dict, to merge, not change."""
    return library_versions() | {PYTHON_TAG: platform.python_version(), LOCK_TAG: lock_hash(lock_file())}


def library_versions() -> dict[str, str]:
    """A library that is not installed has no tag: a run says what it had, not what it lacked."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[VERSION_TAG + name] = version(name)
        except PackageNotFoundError:
            continue
    return versions


def lock_hash(path: Path) -> str:
    """The lock file's SHA-256, shortened; ``none`` when there is none (a copy without it)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:LOCK_HASH_LENGTH]
    except FileNotFoundError:
        return "none"


def environment_of(tags: dict[str, str]) -> dict[str, str]:
    """A run's environment tags by their short names (``python``, ``ray``, …, ``lock``), in
    the order ``detsweep best`` shows them; empty for a run older than the tags."""
    shown = {"python": tags.get(PYTHON_TAG)}
    shown |= {name: tags.get(VERSION_TAG + name) for name in LIBRARIES}
    shown["lock"] = tags.get(LOCK_TAG)
    return {name: value for name, value in shown.items() if value is not None}
