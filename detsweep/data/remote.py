"""Datasets in a bucket: ``annotations``, ``images`` and ``label_map`` may be URIs
(``s3://…``, ``gs://…``), read through pyarrow's filesystems as Ray reads its storage
(``AWS_ENDPOINT_URL`` and the usual credential chain for S3; boto3 for S3's ETags).

Each node copies what it reads once into its own cache folder (``DETSWEEP_DATA_CACHE``,
default ``~/.cache/detsweep/data``) and reads it from there: the driver's check reads the
very files the workers will. A copy is keyed by its content's version: an S3 folder's by its
objects' keys and ETags, other schemes' by their files' sizes and modification times (a
rewrite that keeps both is not seen). The driver fixes a dataset's version at launch
(``version``, :func:`pinned`); a node whose listing differs refuses to train, so new data
under an old URI is a new copy and no two nodes of one sweep train on different versions.
A copy lands under a scratch name and is renamed into place when whole (S3 objects fetched
only while their ETag is the listed one), so a process killed mid-way leaves nothing a later
one would take for the data.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from detsweep.config import DatasetConfig
from detsweep.errors import DetsweepError

CACHE = "DETSWEEP_DATA_CACHE"
FIELDS = ("annotations", "images", "label_map")


def cache_folder() -> Path:
    return Path(os.environ.get(CACHE) or "~/.cache/detsweep/data").expanduser()


def bucket_uris(config: DatasetConfig, where: str = "data") -> list[tuple[str, str]]:
    """``(field, URI)`` of each bucket URI among ``config``'s paths."""
    return [(f"{where}.{field}", part) for field in FIELDS for part in (getattr(config, field) or "").split(",")
            if "://" in part]


def pinned(config: DatasetConfig, where: str = "data") -> DatasetConfig:
    """``config`` with the version its bucket data has now (the driver's, at launch), to be trained on everywhere."""
    uris = bucket_uris(config, where)
    if not uris:
        return config
    return config.model_copy(update={"version": dataset_version([content_version(uri, field) for field, uri in uris])})


def with_local_copies(config: DatasetConfig, where: str = "data") -> DatasetConfig:
    """``config`` with every bucket URI among its paths replaced by this node's copy of the
    version ``config.version`` fixed (else of what is there now)."""
    uris = bucket_uris(config, where)
    if not uris:
        return config
    versions = {uri: content_version(uri, field) for field, uri in uris}
    found = dataset_version([versions[uri] for _, uri in uris])
    if config.version and found != config.version:
        raise DetsweepError(f"{where}: found its bucket data at version {found[:12]}, expected {config.version[:12]}, "
                            "the version the run was launched with: the data under its URIs changed since (launch "
                            "again to train on it)")
    changed = {field: ",".join(local_copy(part, versions[part], f"{where}.{field}") if "://" in part else part
                               for part in getattr(config, field).split(","))
               for field in FIELDS if "://" in (getattr(config, field) or "")}
    return config.model_copy(update=changed)


def dataset_version(versions: list[ContentVersion]) -> str:
    return hashlib.sha256(json.dumps([version.digest for version in versions]).encode()).hexdigest()[:24]


class ContentVersion:
    """What is under a URI now: each file's path under it and its ETag (S3) or size and
    modification time; ``digest`` names the whole."""

    def __init__(self, uri: str, folder: bool, entries: list[tuple[str, str]]):
        self.uri, self.folder, self.entries = uri, folder, sorted(entries)
        self.digest = hashlib.sha256(json.dumps(self.entries).encode()).hexdigest()[:24]


def content_version(uri: str, field: str) -> ContentVersion:
    """The version of the file or folder at ``uri``; one line when it cannot be reached or is not there."""
    import pyarrow.fs

    filesystem, path, kind = _look_up(uri, field, "this node")
    folder = kind == pyarrow.fs.FileType.Directory
    if uri.startswith("s3://"):
        return ContentVersion(uri, folder, _etags(path, folder, field))
    infos = filesystem.get_file_info(pyarrow.fs.FileSelector(path, recursive=True)) if folder else \
        [filesystem.get_file_info(path)]
    return ContentVersion(uri, folder, [(info.path[len(path):].lstrip("/"), f"{info.size}:{info.mtime_ns}")
                                        for info in infos if info.type == pyarrow.fs.FileType.File])


def local_copy(uri: str, version: ContentVersion, field: str) -> str:
    """This node's copy of ``version`` of the file or folder at ``uri``, made on first use."""
    scheme, _, rest = uri.partition("://")
    keyed = cache_folder() / scheme / f"{rest.strip('/')}@{version.digest}"
    target = keyed if version.folder else keyed / Path(rest).name
    if target.exists():
        return str(target)
    scratch = keyed.with_name(f".{keyed.name}.partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    if scheme == "s3":
        _fetch_s3(rest, version, scratch, field)
    else:
        _copy_and_check(uri, version, scratch if version.folder else scratch / Path(rest).name, field)
    try:
        os.rename(scratch, keyed)
    except OSError:  # another process of this node made it first: theirs is whole too
        shutil.rmtree(scratch, ignore_errors=True)
    return str(target)


def _etags(path: str, folder: bool, field: str) -> list[tuple[str, str]]:
    """``(key under path, ETag)`` of the S3 object ``bucket/key`` or of every object under the prefix."""
    import boto3
    import botocore.exceptions

    bucket, _, key = path.partition("/")
    client = boto3.client("s3")
    try:
        if not folder:
            return [("", client.head_object(Bucket=bucket, Key=key)["ETag"])]
        prefix = key.rstrip("/") + "/" if key else ""
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [(item["Key"][len(prefix):], item["ETag"]) for page in pages for item in page.get("Contents", [])
                if not item["Key"].endswith("/")]
    except botocore.exceptions.BotoCoreError as error:
        raise DetsweepError(f"{field}: found s3://{path}, expected S3 to list it ({error})") from None
    except botocore.exceptions.ClientError as error:
        raise DetsweepError(f"{field}: found s3://{path}, expected S3 to list it ({error.response['Error']['Message']})") from None


def _fetch_s3(rest: str, version: ContentVersion, into: Path, field: str) -> None:
    """Each object of ``version`` into ``into``, only if its ETag is still the listed one."""
    import boto3
    import botocore.exceptions

    bucket, _, key = rest.strip("/").partition("/")
    client = boto3.client("s3")
    for relative, etag in version.entries:
        source = f"{key}/{relative}" if version.folder else key
        target = into / (relative if version.folder else Path(key).name)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            body = client.get_object(Bucket=bucket, Key=source, IfMatch=etag)["Body"]
            with target.open("wb") as stream:
                for chunk in body.iter_chunks(1 << 20):
                    stream.write(chunk)
        except botocore.exceptions.ClientError as error:
            raise DetsweepError(f"{field}: s3://{bucket}/{source} changed while this node copied it "
                                f"({error.response['Error'].get('Message', error)}); launch again") from None


def _copy_and_check(uri: str, version: ContentVersion, into: Path, field: str) -> None:
    """A copy of ``uri`` into ``into`` by pyarrow; its listing must not have changed meanwhile."""
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(uri)
    pyarrow.fs.copy_files(path, str(into), source_filesystem=filesystem,
                          destination_filesystem=pyarrow.fs.LocalFileSystem())
    if content_version(uri, field).digest != version.digest:
        raise DetsweepError(f"{field}: {uri} changed while this node copied it; launch again")


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
