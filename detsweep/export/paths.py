"""Paths checked before anything slow starts, and export folders written whole or not at all
(into a hidden sibling first, renamed at the end). No TensorFlow here: errors come at once."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from detsweep.errors import DetsweepError

INFO_FILE = "detsweep.json"  # beside an export's saved_model.pb: its step, categories and weights


def check_exported(directory: str | Path) -> Path:
    """A SavedModel written by ``detsweep export``, before TensorFlow loads to read it."""
    directory = Path(directory)
    if not (directory / "saved_model.pb").is_file() or not (directory / INFO_FILE).is_file():
        raise DetsweepError(f"{directory}: not a SavedModel from detsweep export "
                            f"(expected saved_model.pb and {INFO_FILE})")
    return directory


def check_new_folder(path: Path) -> None:
    """Exports never mix with (or replace) files that are already there."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise DetsweepError(f"{path}: already exists and is not an empty folder; expected a new or empty folder")


@contextlib.contextmanager
def staged_folder(path: Path) -> Iterator[Path]:
    """A new folder beside ``path`` to fill; it becomes ``path`` when the block ends, and is
    removed if the block fails."""
    check_new_folder(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
    staging.mkdir()
    try:
        yield staging
        if path.exists():
            path.rmdir()  # empty: checked above
        staging.rename(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def check_images(paths: Sequence[str | Path], out_dir: str | Path | None) -> None:
    """Every image exists, and no two would be drawn into the same ``out_dir/<stem>.png``."""
    for path in paths:
        if not Path(path).is_file():
            raise DetsweepError(f"{path}: image not found")
    stems = [Path(path).stem for path in paths]
    twice = sorted({stem for stem in stems if stems.count(stem) > 1})
    if out_dir is not None and twice:
        raise DetsweepError(f"--out {out_dir}: two images named {twice[0]} would both be drawn into {twice[0]}.png")
