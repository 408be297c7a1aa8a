from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
RACCOON = SHARED / "datasets" / "raccoon"
RACCOON_PIPELINE = RACCOON / "training" / "ssd_mobilenet_v1_pets.config"
# pytest-timeout fails a test past its limit (pyproject.toml, or the test's own mark) with
# nothing of its subprocesses' output, and leaves them (a sweep, a Ray job) running. So every
# wait on a subprocess ends this long before the running test's limit: the subprocess is
# killed with its session, and the test fails with its stderr.
MARGIN_S = 30
_deadline = math.inf
T = TypeVar("T")


# Each variable a tool finds its home folders by, and where it points inside the tests' home.
_HOME_FOLDERS = {"HOME": "", "XDG_CONFIG_HOME": ".config", "XDG_CACHE_HOME": ".cache",
                 "XDG_DATA_HOME": ".local/share", "XDG_STATE_HOME": ".local/state"}
_user_home: dict[str, str | None] = {}  # what they were before the run


def pytest_configure(config: pytest.Config) -> None:
    """The tests and every process they start get a home folder of their own, removed at the
    end: the tools write their settings and caches there (matplotlib's font cache, Keras's
    keras.json, MLflow's telemetry id, Chromium's profile), never into the user's. Set before
    collection, because matplotlib and Keras read it when first imported."""
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="detsweep-tests-home-"))
    _user_home.update({name: os.environ.get(name) for name in _HOME_FOLDERS})
    for name, folder in _HOME_FOLDERS.items():
        os.environ[name] = str(home / folder)
    os.putenv = _not_while_ray_is_connected(os.putenv)


def _not_while_ray_is_connected(putenv: Callable) -> Callable:
    """``putenv`` (which ``os.environ`` calls on each write), refused for a variable the
    environment does not hold yet while this process's Ray driver is connected, unless Ray
    itself writes it: glibc's ``setenv`` then grows the array, and frees the one that the
    driver's threads may be reading with ``getenv`` at that moment (a SIGSEGV in Ray's metrics
    thread, seen once in a full suite). Replacing a value, or removing one, frees nothing. So
    a test sets what it needs before ``ray.init``, and no driver stays connected from one test
    to the next (pytest adds ``PYTEST_CURRENT_TEST`` as each test starts)."""

    def guarded(name: bytes | str, value: bytes | str) -> None:
        connected = getattr(sys.modules.get("ray"), "is_initialized", lambda: False)
        if (os.fsdecode(name) not in os.environ and connected()
                and not any(f"{os.sep}ray{os.sep}" in frame.filename for frame in traceback.extract_stack())):
            raise AssertionError(f"{os.fsdecode(name)} added to os.environ while this process's Ray driver is connected")
        putenv(name, value)

    return guarded


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    if not _user_home:  # configure never ran: HOME is still the user's own
        return
    home = os.environ["HOME"]
    for name, value in _user_home.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(home, ignore_errors=True)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item):
    """The running test's deadline, counted as pytest-timeout counts it: set-up included.
    With ``DETSWEEP_TEST_LOAD=FILE``, a line per test in FILE: its wall time, the CPU the whole
    machine spent meanwhile, and the children of this process that tests before it left (a file
    run alone is often faster than in the suite: this says where the difference went)."""
    global _deadline
    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 0)
    _deadline = time.monotonic() + limit - MARGIN_S if limit else math.inf
    out = os.environ.get("DETSWEEP_TEST_LOAD")
    if not out:
        yield
        return
    import json

    import psutil

    busy = sum(psutil.cpu_times()[:3])  # user, nice, system: every core's
    start = time.monotonic()
    left = [" ".join(process.info["cmdline"] or ())[:100] for process in psutil.process_iter(["cmdline", "ppid"])
            if process.pid != os.getpid() and process.info["ppid"] == os.getpid()]
    yield
    with open(out, "a") as lines:
        print(json.dumps({"test": item.nodeid, "wall_s": round(time.monotonic() - start, 1),
                          "cpu_s": round(sum(psutil.cpu_times()[:3]) - busy, 1), "children_before": left}), file=lines)


def time_left(timeout: float | None = None) -> float | None:
    """``timeout``, cut to what the running test has left before its limit (less a margin);
    None when neither bounds the wait."""
    left = _deadline - time.monotonic() if timeout is None else min(timeout, _deadline - time.monotonic())
    return None if left == math.inf else max(1.0, left)


@pytest.fixture
def write(tmp_path: Path):
    """Write a text file into the test's temporary folder and return its path."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return _write


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run the installed ``detsweep`` command as a user would, in a separate process; past
    ``timeout`` seconds (or the test's own limit) it is killed with everything it started."""
    command = [sys.executable, "-m", "detsweep.cli", *args]
    return run_bounded(command, cwd=cwd or REPO, env=cli_environment(env), timeout=timeout)


# What no ``detsweep`` call a test makes inherits from this process but from its ``env``:
# ``mlflow.set_tracking_uri`` here (a check, a module fixture's set-up) writes the URI into
# ``os.environ``.
UNINHERITED = ("MLFLOW_TRACKING_URI",)


def run_here(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``detsweep`` called in this process, for a test of what a command that only reads and
    answers says (``validate``, ``data inspect``, ``optimizer``, ``best``, ``status``,
    ``export``), not of its process: TensorFlow, keras-hub and MLflow are imported here once,
    where each ``run_cli`` imports them again (seconds apiece). Its result as ``run_cli`` gives
    it, in the environment ``cli_environment`` gives, for the call alone."""
    import io

    from detsweep.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd or REPO), set_environment({**dict.fromkeys(UNINHERITED), **(env or {})}), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["detsweep", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def set_environment(env: dict[str, str | None]) -> Iterator[None]:
    """``env`` in ``os.environ`` while the block runs (None: the variable is not there), and
    what was there before after it."""

    def put(values: dict[str, str | None]) -> None:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    before = {name: os.environ.get(name) for name in env}
    put(env)
    try:
        yield
    finally:
        put(before)


def side_by_side(calls: list[Callable[[], T]]) -> list[T]:
    """Each call's result, two calls at a time: a ``detsweep`` subprocess that
    refuses is mostly one core's Python start-up and imports, one that trains through Ray
    mostly waits on Ray's processes starting one after another, and the machine has two."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda call: call(), calls))


def cli_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a ``detsweep`` subprocess, with ``env`` added, without
    ``UNINHERITED``. Ray's authentication mode is inherited: a cluster this process started
    (``ray.init``, ``cluster_utils``) wrote "token" there, which its clients need; a cluster
    started otherwise gives its clients its own (``cluster_parts.AUTH``)."""
    inherited = {name: value for name, value in os.environ.items() if name not in UNINHERITED}
    return {**inherited, "PYTHONUNBUFFERED": "1", **(env or {})}


def run_bounded(command: list[str], timeout: float | None = None, **options) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True)`` in a session of its own,
    whose every process is killed when ``timeout`` passes, or before the test's own limit
    (then the test fails, saying so)."""
    timeout = time_left(timeout)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, **options)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(process)
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(command[2:])} still ran after {timeout:.0f} s; its stderr ends:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll ``condition`` every second; fail saying ``what`` did not happen in ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} after {seconds:.0f} s"
        time.sleep(1)


def run_on_two_cpu_devices(script: str, *args: str, timeout: float = 180) -> dict:
    """``script`` in a Python process of its own whose CPU is two logical devices, which stand
    in for two GPUs (TensorFlow fixes its devices when its runtime starts, and this process's
    has started); returns the JSON its last line prints."""
    import json

    preamble = ("import tensorflow as tf\n"
                "tf.config.set_logical_device_configuration(tf.config.list_physical_devices('CPU')[0], "
                "[tf.config.LogicalDeviceConfiguration()] * 2)\n")
    result = run_bounded([sys.executable, "-c", preamble + script, *args], timeout=timeout, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def run_on_terminal(command: list[str], timeout: float | None = None, **options) -> tuple[subprocess.CompletedProcess, str]:
    """``run_bounded`` with stderr on a pseudo-terminal, as a person at a terminal runs
    ``detsweep … --json > report.json``: returns the result (stdout captured) and everything
    the terminal was sent, control sequences included."""
    timeout = time_left(timeout)
    import pty
    import threading

    leader, follower = pty.openpty()
    sent: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every process holding the terminal has closed it
                return
            if not chunk:
                return
            sent.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=follower, text=True,
                               start_new_session=True, **options)
    os.close(follower)
    try:
        stdout, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(process)
        process.communicate()
        pytest.fail(f"{' '.join(command[2:])} still ran after {timeout:.0f} s")
    finally:
        reader.join(timeout=30)
        os.close(leader)
    return subprocess.CompletedProcess(command, process.returncode, stdout, None), b"".join(sent).decode(errors="replace")


def plain(terminal: str) -> str:
    """What a terminal was sent, without its colours and cursor moves."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal)


def changed_pixels(png: bytes, reference: bytes):
    """Where two PNGs of one size differ by more than a rounding (30 levels in a channel), as a mask."""
    import io

    import numpy as np
    from PIL import Image

    first, second = (np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int) for data in (png, reference))
    assert first.shape == second.shape
    return np.abs(first - second).max(axis=-1) > 30


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL ``process`` and every process of its session (it was started with start_new_session)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended already
        pass


def commands_in_session(session: int) -> dict[int, str]:
    """The processes of one session (a command started with ``start_new_session``: what it
    started, and only that), by pid: their command lines."""
    return _commands_where(os.getsid, session)


def commands_in_group(group: int) -> dict[int, str]:
    """The processes of one process group, by pid: their command lines."""
    return _commands_where(os.getpgid, group)


def _commands_where(key: Callable[[int], int], value: int) -> dict[int, str]:
    import psutil

    found = {}
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(OSError, psutil.Error):  # it ended while we looked
            if key(process.pid) == value:
                found[process.pid] = " ".join(process.info["cmdline"] or ())
    return found


@pytest.fixture(autouse=True)
def nothing_into_the_users_ray_results():
    """A test keeps its runs in its own folders: ``~/ray_results``, where detsweep puts a run
    given no storage, gains nothing."""
    folder = Path("~/ray_results").expanduser()
    before = set(os.listdir(folder)) if folder.is_dir() else set()
    yield
    added = (set(os.listdir(folder)) if folder.is_dir() else set()) - before
    assert not added, f"the test wrote into {folder}: {sorted(added)}"


@pytest.fixture(autouse=True)
def own_tracking_uri(monkeypatch):
    """``mlflow.set_tracking_uri`` also sets ``MLFLOW_TRACKING_URI`` in ``os.environ``, where
    every later ``detsweep`` subprocess would inherit it: each test starts without one."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[str]:
    """A local Ray cluster of a test module's own (2 CPUs, its processes only); its address."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


@pytest.fixture
def ray_driver(local_cluster: str) -> Iterator[None]:
    """This process connected to the module's cluster for one test (never from one test to
    the next: ``_not_while_ray_is_connected``)."""
    with connected_to(local_cluster):
        yield


@contextlib.contextmanager
def connected_to(address: str) -> Iterator[None]:
    import ray

    ray.init(address=address, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()


# Every kind of line detsweep itself prints on the console while it trains or sweeps.
OUR_LINES = re.compile("|".join([
    r"logs: /\S+ \(Ray's, Tune's and TensorFlow's own output; --verbose shows it here\)",
    r"MLflow: .+", r"detsweep: .+", r"fine-tune: .+",
    r".+: \d+ images?, \d+ box(es)?, \d+ categor(y|ies)(; .+)?",  # a dataset's summary
    r"trial \w+ (started: .*|step \d+/\d+.*|finished at step .+|stopped early by the scheduler at step .+|errored: .+"
    r"|not trained: .+ \(search\.constraints\))",
    r"trial +status +step .+", r"(\w+_\d{5}|[0-9a-f]{8}) +(PENDING|RUNNING|PAUSED|TERMINATED|STOPPED|ERROR|INFEASIBLE)\b.*",  # the trial table
    r"serving cost of .+: [\d.]+ ms, [\d.]+ MB, [\d,]+ parameters(; int8 .+)?",
    r"first loop after .+", r"step \d+/\d+ .+", r"finished at step \d+", r"  [\w/]+ +-?[\d.]+",
    r"checkpoint: .+", r"MLflow run: \w+",
    r"waiting for \d+ (nodes? of type \S+|trial worker\(s\)) .+",  # a trial waits for nodes to start
    r"importance: .+", r"\S+: \d+ trials compared at step \d+, .+", r"  \S+ +[\d.]+ \[[\d.]+, [\d.]+\]  fANOVA .+",
]))


def foreign_lines(*outputs: str) -> list[str]:
    """The lines of ``outputs`` that detsweep did not write (Ray's, TensorFlow's, …)."""
    return [line for text in outputs for line in text.splitlines() if line.strip() and not OUR_LINES.fullmatch(line)]


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """An S3 API server on loopback for the whole run (moto's ``moto_server``): buckets for
    sweeps' results and datasets, reached as AWS is, through ``AWS_ENDPOINT_URL``."""
    from .cluster_parts import s3_server

    with s3_server(tmp_path_factory.mktemp("s3") / "moto.log") as server:
        yield server


@pytest.fixture(scope="session")
def tracking_stack(s3):
    """The cluster's tracking stack for the whole run, as ``ray_cluster.yaml`` starts it on the
    head: MLflow's basic-auth server over HTTPS with the certificate the head makes, its runs
    in a PostgreSQL server and its artifacts in a bucket of the S3 server (both outside "the
    cluster"), the head's secret in Secrets Manager (moto's too) and detsweep's user in the
    trials' file."""
    import shutil
    import tempfile

    from .cluster_parts import TrackingStack, postgres_server
    from .mlflow_checks import cluster_mlflow_server

    folder = Path(tempfile.mkdtemp(prefix="detsweep-tracking-"))  # not under pytest's 0700 folders: postgres reads it
    folder.chmod(0o755)
    try:
        with postgres_server(folder / "postgres") as database:
            secret = {"MLFLOW_AUTH_ADMIN_PASSWORD": "Adm1n-for-detsweep-tests",
                      "MLFLOW_FLASK_SERVER_SECRET_KEY": "detsweep-tests-key", "MLFLOW_TRACKING_USERNAME": "detsweep",
                      "MLFLOW_TRACKING_PASSWORD": "S3cret-for-detsweep-tests", "MLFLOW_BACKEND_STORE_URI": database,
                      "MLFLOW_ARTIFACTS_DESTINATION": f"s3://{s3.new_bucket('mlflow-artifacts')}/mlflow"}
            with cluster_mlflow_server(folder / "head", secret, s3.env) as head:
                yield TrackingStack(head.uri, secret, s3, "mlflow-artifacts", folder, head.said, head.authority)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def trained_sweep_launch(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess, dict]:
    """A finished quickstart sweep named ``source``, its MLflow runs in ``folder/mlflow.db``,
    its best checkpoint registered: the source of the fine-tuning tests, the checkpoint the
    export tests ship, the ASHA sweep on evaluations beside training
    (``train.evaluation: async``) and the sweep that survives a diverging trial, which
    ``test_sweep_runs`` checks (one sweep for all). Returns its folder, its file, and what
    ``launch --json`` gave.

    Its best trial (0.04) trains 150 steps on 64 images, so that its AP is above noise, in
    loops of 25 steps, with an evaluation (a Ray task of its own, while it trains on) and a
    checkpoint at 75 and 150, so that the best checkpoint is picked from two. ASHA ranks on
    the val loss at step 75: one trial at a time (each takes both CPUs: its worker and its
    evaluator), so the second (at 0.00001, which hardly learns) reaches the rung after the
    first scored there, and stops. The third (1e12) diverges in its first loop: the launch
    exits 1. MLflow samples system metrics every 10 s (its default): each trial's run holds its
    node's first and last samples however short it was, the stopped one's too."""
    from .tiny_sweeps import launch_json, tiny_sweep

    folder = tmp_path_factory.mktemp("trained")
    sweep = tiny_sweep(folder, """
  metric: eval/AP_best
  mode: max
  algorithm: grid
  num_samples: 1
  scheduler: {type: asha, grace_period: 75, reduction_factor: 2, metric: eval/loss, mode: min}
  space:
    optimizer.learning_rate.learning_rate_base: {grid: [0.04, 0.00001, 1.0e+12]}
""", num_steps=150, every=75, loop=25, name="source", data="{train: {num_images: 64}, val: {num_images: 32}}")
    sweep.write_text(sweep.read_text().replace("checkpoint_every: 75}", "checkpoint_every: 75, evaluation: async}"))
    result, report = launch_json(str(sweep), cwd=folder)
    assert result.returncode == 1 and report["best"], result.stderr[-3000:]  # 1: the diverged trial
    return folder, sweep, result, report


@pytest.fixture(scope="session")
def trained_sweep(trained_sweep_launch) -> tuple[Path, dict]:
    """``trained_sweep_launch``'s folder and report."""
    folder, _, _, report = trained_sweep_launch
    return folder, report


def without_the_unread_preset(notes: list[str], preset: str = "retinanet_resnet50_fpn_coco") -> list[str]:
    """``notes`` but the one that says ``preset`` could not be read here, which must be there:
    nothing can be downloaded on these machines (the registry name is read as a download)."""
    unread = [note for note in notes if note.startswith(f"model.weights: the preset {preset} could not be read here (")]
    assert len(unread) == 1, notes
    return [note for note in notes if note not in unread]
