"""A detsweep checkpoint folder by its file names, read without TensorFlow: ``ckpt.*`` (model,
optimizer, moving averages, step; written by :mod:`detsweep.train.checkpoint`), the as-run
``config.yaml`` and ``meta.json`` (step, categories with their original ids)."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from detsweep.config import TrialConfig, validate
from detsweep.config.loader import read_yaml_mapping
from detsweep.errors import DetsweepError

PREFIX = "ckpt"
CONFIG_FILE = "config.yaml"
META_FILE = "meta.json"


# pyarrow's filesystem names, by the URI scheme that opens them again.
_SCHEMES = {"s3": "s3", "gcs": "gs"}


def is_uri(location: str | Path) -> bool:
    """A bucket (``s3://…``, ``gs://…``) rather than a folder of this machine."""
    return "://" in str(location)


def checkpoint_uri(checkpoint) -> str:
    """Where a Ray checkpoint lives, as every node and every later command can open it: its
    folder, or in a bucket its URI (Ray's ``checkpoint.path`` alone has lost the scheme)."""
    kind = checkpoint.filesystem.type_name
    return checkpoint.path if kind == "local" else f"{_SCHEMES.get(kind, kind)}://{checkpoint.path}"


def check_checkpoint(directory: str | Path, field: str = "") -> str | Path:
    """``directory`` (a Path, or a bucket's URI as given) when it holds a detsweep checkpoint,
    else one line naming ``field`` (where the folder was given) and what was expected in it."""
    import pyarrow.fs

    if is_uri(directory):
        filesystem, path = pyarrow.fs.FileSystem.from_uri(str(directory))
        kinds = [info.type for info in filesystem.get_file_info([f"{path}/{CONFIG_FILE}", f"{path}/{PREFIX}.index"])]
        found = all(kind == pyarrow.fs.FileType.File for kind in kinds)
    else:
        directory = Path(directory)
        found = (directory / CONFIG_FILE).is_file() and (directory / f"{PREFIX}.index").is_file()
    if not found:
        raise DetsweepError(f"{field + ': ' if field else ''}{directory} is not a detsweep checkpoint "
                            f"(expected {CONFIG_FILE} and {PREFIX}.index in it)")
    return directory


@contextlib.contextmanager
def local_folder(location: str | Path) -> Iterator[Path]:
    """``location`` as a folder of this machine for the block: a folder as it is, a bucket's
    URI downloaded into a scratch folder that the block's end removes."""
    if not is_uri(location):
        yield Path(location)
        return
    import pyarrow.fs

    with tempfile.TemporaryDirectory(prefix="detsweep-download-") as scratch:
        pyarrow.fs.copy_files(str(location), scratch)
        yield Path(scratch)


def read_meta(directory: str | Path) -> dict[str, Any]:
    """``meta.json`` of a checkpoint folder, or of one in a bucket (that file alone is read)."""
    if not is_uri(directory):
        return json.loads((Path(directory) / META_FILE).read_text())
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(f"{str(directory).rstrip('/')}/{META_FILE}")
    with filesystem.open_input_stream(path) as stream:
        return json.loads(stream.readall())


def read_step(directory: str | Path) -> int:
    return int(read_meta(directory)["step"])


def read_config_tree(directory: str | Path) -> dict[str, Any]:
    """The as-run config, as written (not validated): for merging into another config."""
    return read_yaml_mapping(Path(directory) / CONFIG_FILE)


def read_config(directory: str | Path, overrides: list[str] = ()) -> TrialConfig:
    path = Path(directory) / CONFIG_FILE
    return validate(TrialConfig, read_yaml_mapping(path), str(path), overrides)
