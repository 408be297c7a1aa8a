"""Connecting to Ray: a local cluster by default, any cluster by address."""

from __future__ import annotations

import ctypes.util
import logging
import os
import socket
import tempfile
from pathlib import Path

from detsweep.adapters.ray import train_environment
from detsweep.errors import DetsweepError

# TensorFlow's CPU kernels allocate and free large buffers at every step; glibc's malloc hands
# them back to the kernel and faults them in again. tcmalloc keeps them: it more than doubled
# the quickstart's speed when TensorFlow copied tensors at every step (a OneDeviceStrategy on
# the CPU); on today's path paired runs show no gain beyond their noise (bench/allocator.py),
# so nothing installs it: a node that has it (a cluster's setup command) gets it.
TCMALLOC = "libtcmalloc_minimal.so.4"
# Where Ray keeps a run's results and checkpoints when it is given no storage path.
RAY_RESULTS = "~/ray_results"


def fast_allocator() -> dict[str, str]:
    """``LD_PRELOAD`` of tcmalloc for Ray's worker processes, by its soname, so that every node
    finds its own copy (Debian/Ubuntu: ``apt-get install libtcmalloc-minimal4``); nothing when
    this machine lacks it or the user preloads something already."""
    if "LD_PRELOAD" in os.environ or not ctypes.util.find_library("tcmalloc_minimal"):
        return {}
    # tcmalloc reports every allocation above 1 GiB on stderr; a large batch makes many.
    return {"LD_PRELOAD": TCMALLOC, "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40)}


def run_folder(storage: str | None, name: str) -> str:
    """Where Ray Train keeps the run ``name``: under ``storage`` (a folder or a bucket's URI) or
    ``~/ray_results``."""
    if storage and "://" in storage:
        return f"{storage.rstrip('/')}/{name}"
    return str(Path(storage or RAY_RESULTS).expanduser() / name)


def remove_run_folders(storage: str | None, prefix: str) -> None:
    """Delete the Ray Train runs whose names start with ``prefix`` (folders, or a bucket's
    prefixes), runs that have ended."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.fs

    root = run_folder(storage, "")
    try:
        filesystem, path = pyarrow.fs.FileSystem.from_uri(root if "://" in root else os.path.abspath(root))
        found = filesystem.get_file_info(pyarrow.fs.FileSelector(path.rstrip("/"), allow_not_found=True))
        ended = [info.path for info in found
                 if info.type == pyarrow.fs.FileType.Directory and info.base_name.startswith(prefix)]
        with ThreadPoolExecutor(8) as pool:  # a bucket's prefixes: each deletion is requests of its own
            list(pool.map(filesystem.delete_dir, ended))
    except (OSError, ValueError) as error:  # gone already, or the store refused: it only costs space
        logging.getLogger(__name__).warning("could not delete the Ray Train runs %s*: %s", prefix, error)


def check_storage(storage: str | None, where: str = "--storage") -> None:
    """A results folder this machine cannot make, or a bucket that does not exist or cannot be
    read, is refused before anything starts: Ray would fail once the cluster is up."""
    if storage and "://" in storage:
        check_bucket(storage, where)
        return
    path = Path(storage or RAY_RESULTS).expanduser().absolute()
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    try:  # os.access says yes to root everywhere, /proc included: try it
        os.rmdir(tempfile.mkdtemp(dir=existing))
    except OSError as error:
        raise DetsweepError(f"{where}: found {str(path)!r}, expected a folder this machine can write "
                            f"(cannot make a folder in {existing}: {error.strerror or type(error).__name__})") from None


def check_bucket(uri: str, where: str) -> None:
    """The bucket of ``uri`` exists and these credentials list it (pyarrow's filesystems, as Ray
    opens them: ``AWS_ENDPOINT_URL`` and the usual credential chain for S3)."""
    import pyarrow.fs

    try:
        filesystem, path = pyarrow.fs.FileSystem.from_uri(uri)
        bucket = path.split("/", 1)[0]
        found = filesystem.get_file_info(bucket).type
    except (OSError, ValueError) as error:  # no such scheme, no credentials, no answer
        raise DetsweepError(f"{where}: found {uri!r}, expected a bucket this machine can reach "
                            f"({str(error).splitlines()[0]})") from None
    if found == pyarrow.fs.FileType.NotFound:
        raise DetsweepError(f"{where}: found {uri!r}, expected an existing bucket (there is no bucket {bucket!r})")


def check_address(address: str | None, where: str = "--address") -> None:
    """An address where no cluster answers is refused at once, in one line: ``ray.init`` would
    retry it for minutes. ``auto`` and no address are Ray's to resolve (it fails fast)."""
    if address in (None, "", "auto", "local"):
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise DetsweepError(f"{where}: found {address!r}, expected HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as error:
        raise DetsweepError(f"{where} {address}: no Ray cluster answers there "
                            f"({error.strerror or type(error).__name__})") from None


def address_own_cluster() -> None:
    """Ray worker set-up on a local cluster: the worker's own cluster becomes its ``RAY_ADDRESS``.
    Inside a worker Ray finds "the" cluster for its State API by guessing over the machine (the
    one ``ray start`` last started, else the only one running); Ray Train's PlacementGroupCleaner
    asks it whether a trial's controller lives, and removed a live trial's CPUs when the answer
    came from another cluster on the same machine."""
    import ray

    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


def connect(address: str | None = None, env: dict[str, str] | None = None, *, cluster_logs: bool = True) -> None:
    """``ray.init`` once per process: ``address`` of a running cluster (``auto``: the one
    ``ray start`` started on this machine), else ``RAY_ADDRESS``, else a new local cluster of its
    own; ``env`` is added to every Ray worker's environment (MLflow credentials), with Ray
    Train's settings (:func:`detsweep.adapters.ray.train_environment`). Without ``cluster_logs``
    the cluster's own processes (raylets, workers) print nothing here: for a caller that only
    asks the cluster questions and answers in one line."""
    import ray

    if ray.is_initialized():
        return
    check_address(*(address, "--address") if address else (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS"))
    # Without an address ray.init joins the cluster `ray start` last started on this machine,
    # if one runs: a sweep meant for this machine alone would land on someone else's cluster.
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    runtime_env: dict = {"env_vars": {**train_environment(local=address == "local"), **fast_allocator(), **(env or {})}}
    if address == "local":
        # Other clusters may run on this machine: each worker asks its own (address_own_cluster).
        runtime_env["worker_process_setup_hook"] = f"{__name__}.{address_own_cluster.__name__}"
    try:
        # Not without Ray's dashboard (3-4 s of CPU per run): it serves the State API, through which
        # Ray Train's PlacementGroupCleaner sees a stopped trial's controller die and frees its
        # placement group; without it the next trial waited minutes for the CPUs (bench/RESULTS.md).
        ray.init(address=address, logging_level=logging.WARNING, configure_logging=True,
                 runtime_env=runtime_env, log_to_driver=cluster_logs)
    except ConnectionError as error:
        raise DetsweepError(f"--address {address}: no Ray cluster answers there ({error})") from None
