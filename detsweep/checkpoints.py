"""A detsweep checkpoint folder by its file names, read without TensorFlow: ``ckpt.*`` (model,
optimizer, moving averages, step; written by :mod:`detsweep.train.checkpoint`), the as-run
``config.yaml`` and ``meta.json`` (step, categories with their original ids)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from detsweep.config import TrialConfig, validate
from detsweep.config.loader import read_yaml_mapping
from detsweep.errors import DetsweepError

PREFIX = "ckpt"
CONFIG_FILE = "config.yaml"
META_FILE = "meta.json"


def check_checkpoint(directory: str | Path, field: str = "") -> Path:
    """``directory`` as a Path when it holds a detsweep checkpoint, else one line naming
    ``field`` (where the folder was given) and what was expected in it."""
    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file() or not (directory / f"{PREFIX}.index").is_file():
        raise DetsweepError(f"{field + ': ' if field else ''}{directory} is not a detsweep checkpoint "
                            f"(expected {CONFIG_FILE} and {PREFIX}.index in it)")
    return directory


def read_meta(directory: str | Path) -> dict[str, Any]:
    return json.loads((Path(directory) / META_FILE).read_text())


def read_step(directory: str | Path) -> int:
    return int(read_meta(directory)["step"])


def read_config_tree(directory: str | Path) -> dict[str, Any]:
    """The as-run config, as written (not validated): for merging into another config."""
    return read_yaml_mapping(Path(directory) / CONFIG_FILE)


def read_config(directory: str | Path, overrides: list[str] = ()) -> TrialConfig:
    path = Path(directory) / CONFIG_FILE
    return validate(TrialConfig, read_yaml_mapping(path), str(path), overrides)
