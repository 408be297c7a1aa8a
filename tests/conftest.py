from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
RACCOON = SHARED / "datasets" / "raccoon"
RACCOON_PIPELINE = RACCOON / "training" / "ssd_mobilenet_v1_pets.config"


@pytest.fixture
def write(tmp_path: Path):
    """Write a text file into the test's temporary folder and return its path."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return _write


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the installed ``detsweep`` command as a user would, in a separate process."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "detsweep.cli", *args], capture_output=True, text=True, cwd=cwd or REPO, env=env
    )


@pytest.fixture(autouse=True)
def own_tracking_uri(monkeypatch):
    """``mlflow.set_tracking_uri`` also sets ``MLFLOW_TRACKING_URI`` in ``os.environ``, where
    every later ``detsweep`` subprocess would inherit it: each test starts without one."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
