"""Datasets in a bucket: ``annotations``, ``images`` and ``label_map`` may be URIs
(``s3://…``, ``gs://…``), read through pyarrow's filesystems as Ray reads its storage
(``AWS_ENDPOINT_URL`` and the usual credential chain for S3).

Each node copies what it reads once into its own cache folder (``DETSWEEP_DATA_CACHE``,
default ``~/.cache/detsweep/data``) and reads it from there: the driver's check reads the
very files the workers will. A copy lands under a scratch name and is renamed into place
when whole, so a process killed mid-way leaves nothing a later one would take for the data.
The cache is keyed by URI: new data under an old URI needs the cache folder emptied.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from detsweep.config import DatasetConfig
from detsweep.errors import DetsweepError

CACHE = "DETSWEEP_DATA_CACHE"
FIELDS = ("annotations", "images", "label_map")


def cache_folder() -> Path:
    return Path(os.environ.get(CACHE) or "~/.cache/detsweep/data").expanduser()


def with_local_copies(config: DatasetConfig, where: str = "data") -> DatasetConfig:
    """``config`` with every bucket URI among its paths replaced by this node's copy."""
    changed = {}
    for field in FIELDS:
        value = getattr(config, field)
        if value and "://" in value:
            changed[field] = ",".join(local_copy(part, f"{where}.{field}") if "://" in part else part
                                      for part in value.split(","))
    return config.model_copy(update=changed) if changed else config


def local_copy(uri: str, field: str) -> str:
    """This node's copy of the file or folder at ``uri``, made on first use."""
    import pyarrow.fs

    scheme, _, rest = uri.partition("://")
    target = cache_folder() / scheme / rest.strip("/")
    if target.exists():
        return str(target)
    filesystem, path, kind = _look_up(uri, field, "this node")
    scratch = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    folder = kind == pyarrow.fs.FileType.Directory
    (scratch if folder else scratch.parent).mkdir(parents=True, exist_ok=True)
    pyarrow.fs.copy_files(path, str(scratch), source_filesystem=filesystem,
                          destination_filesystem=pyarrow.fs.LocalFileSystem())
    try:
        os.rename(scratch, target)
    except OSError:  # another process of this node made it first: theirs is whole too
        shutil.rmtree(scratch, ignore_errors=True)
    return str(target)


def check_locations(config: DatasetConfig, where: str, local: bool = True) -> list[str]:
    """Every bucket URI of ``config`` names something, and with ``local`` every other path
    too; nothing is read or copied (``detsweep validate`` asks before a cluster exists).
    Returns the paths left unchecked: folders of the cluster's nodes, not of this machine."""
    unchecked = []
    for field in FIELDS:
        for part in filter(None, (getattr(config, field) or "").split(",")):
            if "://" in part or local:
                _look_up(part if "://" in part else os.path.abspath(part), f"{where}.{field}", "this machine", part)
            else:
                unchecked.append(f"{where}.{field}: {part}")
    return unchecked


def _look_up(uri: str, field: str, reader: str, given: str | None = None):
    """``uri``'s filesystem, path and kind; one line when ``reader`` cannot reach it or it is not there."""
    import pyarrow.fs

    try:
        filesystem, path = pyarrow.fs.FileSystem.from_uri(uri)
        kind = filesystem.get_file_info(path).type
    except (OSError, ValueError) as error:  # no such scheme, no credentials, no answer
        raise DetsweepError(f"{field}: found {given or uri!r}, expected a file or folder {reader} can reach "
                            f"({str(error).splitlines()[0]})") from None
    if kind == pyarrow.fs.FileType.NotFound:
        raise DetsweepError(f"{field}: found {given or uri!r}, expected a file or folder there")
    return filesystem, path, kind
