"""A sweep of hundreds to thousands of trials through detsweep's real driver (bench/large_sweep.py).

    .venv/bin/python -m bench.large_sweep [--smoke] [--sizes 200 1000 2000] [--sqlite] [--reuse]

What runs is ``detsweep launch``'s own code (``sweeps.launch.launch``): preflight, the real
Tuner with Optuna's TPE and ASHA, the console, the run closer, each trial's own process
(``trainables.trial.run_trial``: its ``TrialRun`` and writer, its run channel, its end) and
the sweep's end (results, MLflow, study, importance, registration). Only the training is a
stand-in (:func:`simulated_training`, in place of Ray Train in each trial's process): it
reports the recorded curve of ``bench/curves.json`` nearest the trial's values, a report
every 20 steps to 300 (``SECONDS_PER_REPORT`` apart), a checkpoint of ``CHECKPOINT_MB`` of
random bytes every 60 steps, and logs its node's system metrics to the run as a worker does.
No Ray Train run is started (its controller and workers are not on this path).

The cluster is a local Ray head of 32 logical CPUs (``ray start``); the tracking stack is the
shipped one (MLflow's basic-auth server over HTTPS on PostgreSQL, its artifacts and Tune's
storage in an S3 bucket of moto's server), or with ``--sqlite`` MLflow's embedded default in
a local folder. ``--reuse``: Tune reuses trial actors (no process start per trial).

Measured per size: the sweep's wall time, the driver's CPU seconds and peak memory, the
console's redraws, most rows and time per redraw, the delay from a trial's report to Tune's
callbacks (after the scheduler decided) with the share of the sweep Tune's loop ran and the
share it was ready but waited for a core (the kernel's schedstat: on 2 cores loaded by 32
trials, what the delay is made of), the machine's load average, TPE's suggestion time, the
sweep's end (``finish``),
writes lost and runs left open, then ``status``, ``best`` and ``importance`` as commands, and
the head's processes and memory per running trial (trial actors, run channels).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

from ray.tune import Callback

from detsweep.sweeps.progress import SweepProgress

from .common import BENCH, REPO, Entry, Target, arguments, free_port, record

AT_ONCE = 32
SECONDS_PER_REPORT = 0.2  # a trial's 15 reports in 3 s: trials of a few seconds
CHECKPOINT_MB = 2
CHECKPOINT_EVERY = 60
ASHA = "{type: asha, grace_period: 60, reduction_factor: 3}"
# Tune waits 2 s for a reused actor's last trial to end, then fails the next trial; a trial's
# end (its run closed, its monitor's last samples) takes longer on 2 cores loaded by 32 trials.
REUSED = {"TUNE_FUNCTION_THREAD_TIMEOUT_S": "60"}
TARGETS = {"delay_median_s": 1.0, "console_share_of_core": 0.05, "end_s": 120.0, "status_s": 10.0, "best_s": 10.0}


# --- in each trial's process: the training's stand-in ------------------------------------

_CURVES = None


def simulated_training(request, on_report: Callable, notes=None, channel=None) -> str | None:
    """``trainer.stream_training``'s contract without Ray Train: the nearest recorded curve's
    reports in step order from the trial's start (a restore's step), each to ``on_report``,
    with a checkpoint every ``CHECKPOINT_EVERY`` steps; the node's system metrics on the run."""
    import ray.train

    from detsweep.checkpoints import read_step
    from detsweep.trainables.channel import Report
    from detsweep.trainables.worker import NodeMonitor

    global _CURVES
    if _CURVES is None:
        from detsweep.sweeps.replay import Curves

        recorded = json.loads((BENCH / "curves.json").read_text())
        _CURVES = Curves(recorded["paths"], [t["config"] for t in recorded["trials"]],
                         [t["reports"] for t in recorded["trials"]])
    start = 0
    if request.restore_from:
        from detsweep.checkpoints import local_folder

        with local_folder(request.restore_from) as folder:
            start = read_step(folder)
    monitor = NodeMonitor(channel, None) if channel is not None and request.system_metrics else None
    scratch = Path(tempfile.mkdtemp(prefix="bench-trial-"))
    try:
        for recorded in _CURVES.reports[_CURVES.nearest(request.sampled)]:
            step = int(recorded["step"])
            if step <= start or step > request.config.train.num_steps:
                continue
            time.sleep(SECONDS_PER_REPORT)
            checkpoint = None
            if step % CHECKPOINT_EVERY == 0:
                checkpoint = ray.train.Checkpoint.from_directory(str(checkpoint_folder(scratch / f"step_{step}", step,
                                                                                     request.config)))
            on_report(Report(step, {**recorded, "reported_at": time.time()}, checkpoint))
    finally:
        if monitor is not None:
            monitor.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return None


def checkpoint_folder(folder: Path, step: int, config) -> Path:
    """A detsweep checkpoint's files (``checkpoints.py``): the config, the step, an index and
    ``CHECKPOINT_MB`` of random weights (nothing compresses them away)."""
    import yaml

    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    (folder / "meta.json").write_text(json.dumps({"step": step}))
    (folder / "ckpt.index").write_bytes(os.urandom(4096))
    (folder / "ckpt.data-00000-of-00001").write_bytes(os.urandom(CHECKPOINT_MB * 2 ** 20))
    return folder


def simulated_trial(tune_config: dict) -> None:
    """detsweep's trial (``run_trial``) with :func:`simulated_training` in place of Ray Train."""
    from detsweep.trainables import trial

    trial.stream_training = simulated_training
    trial.run_trial(tune_config)


# --- in the driver: what is measured --------------------------------------------------------


class Probe:
    """Tune's callbacks run after the scheduler's decision: the delay from a report's stamp to
    here is report-to-decision. Also samples the driver's memory and the head's processes."""

    def __init__(self):
        import psutil

        self.delays: list[float] = []
        self.running = 0
        self.samples: list[dict] = []
        self.loads: list[float] = []  # the machine's load average, every 5 s
        self.driver = psutil.Process()
        self.peak_rss = 0
        # Tune's loop (this, the main thread): its seconds run and seconds waiting for a core
        self._loop = Path(f"/proc/{os.getpid()}/task/{threading.main_thread().native_id}/schedstat")
        self._loop_start = self._schedstat()
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def loop_times(self) -> tuple[float, float]:
        """Seconds Tune's loop ran and seconds it was ready but waited for a core (the kernel's
        schedstat), since this probe began."""
        (ran, waited), (ran_before, waited_before) = self._schedstat(), self._loop_start
        return ran - ran_before, waited - waited_before

    def _schedstat(self) -> tuple[float, float]:
        return tuple(int(field) / 1e9 for field in self._loop.read_text().split()[:2])

    def callback(self) -> ProbeCallback:
        from bench.large_sweep import ProbeCallback  # by name, not as __main__'s (Tune pickles callbacks)

        return ProbeCallback(self)

    def _sample(self) -> None:

        while not self._stop.wait(5.0):
            self.peak_rss = max(self.peak_rss, self.driver.memory_info().rss)
            self.loads.append(os.getloadavg()[0])
            if self.running:
                self.samples.append({"running": self.running, **head_processes()})

    def stop(self) -> None:
        self._stop.set()


class ProbeCallback(Callback):
    """Hands each result to its :class:`Probe`; pickled without it (Tune saves its callbacks)."""

    def __init__(self, probe: Probe):
        self.probe = probe

    def __getstate__(self) -> dict:
        return {"probe": None}

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if self.probe is None:
            return
        if "reported_at" in result:
            self.probe.delays.append(time.time() - result["reported_at"])
        self.probe.running = sum(t.status == "RUNNING" for t in trials)


NOT_TRIALS = ("IDLE", "DashboardAgent", "RuntimeEnvAgent")  # Ray's own processes on every node


def head_processes() -> dict[str, tuple[int, float]]:
    """The actor processes on this machine by class (``ray::Class`` or ``ray::Class.method``):
    how many, and their unique MB; Ray's own and idle workers left out."""
    import psutil

    kinds: dict[str, list[float]] = {}
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or []).strip()
        if not line.startswith("ray::"):
            continue
        kind = line.removeprefix("ray::").split()[0].split(".")[0]
        if kind not in NOT_TRIALS:
            with contextlib.suppress(psutil.Error):
                kinds.setdefault(kind, []).append(process.memory_full_info().uss / 2 ** 20)
    return {kind: (len(found), sum(found)) for kind, found in kinds.items()}


class MeasuredProgress(SweepProgress):
    """The driver's console, live on a terminal (a pseudo-terminal nobody reads but a drain),
    each redraw timed; the instances made, in ``made``."""

    made: list[MeasuredProgress] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "stream": pseudo_terminal(), "live": True})
        self.draw_seconds: list[float] = []  # each redraw's wall time
        self.cpu_seconds = 0.0  # the CPU time of every call, redrawn or not (this thread's: Tune's loop)
        MeasuredProgress.made.append(self)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "draw_seconds": [], "cpu_seconds": 0.0}

    def _redraw(self, trials) -> None:
        before, started, cpu = self.redraws, time.perf_counter(), time.thread_time()
        super()._redraw(trials)
        self.cpu_seconds += time.thread_time() - cpu
        if self.redraws > before:
            self.draw_seconds.append(time.perf_counter() - started)


class Timed:
    """Wraps a callable, keeping each call's seconds."""

    def __init__(self, function: Callable):
        self.function, self.seconds = function, []

    def __call__(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self.function(*args, **kwargs)
        finally:
            self.seconds.append(time.perf_counter() - started)


def per_trial_on_head(samples: list[dict], trials: int | None = None) -> dict[str, tuple[float, float]]:
    """Per kind of actor process: how many per running trial and the unique MB of each, at the
    samples where ``trials`` ran (default: the busiest tenth)."""
    most = max(sample["running"] for sample in samples)
    chosen = [s for s in samples if (s["running"] == trials if trials else s["running"] >= 0.9 * most)]
    kinds = sorted({kind for sample in chosen for kind in sample if kind != "running"})
    return {kind: (statistics.median(s.get(kind, (0, 0.0))[0] / s["running"] for s in chosen),
                   statistics.median(s[kind][1] / s[kind][0] for s in chosen if s.get(kind, (0, 0))[0]))
            for kind in kinds}


def one_sweep(count: int, storage: str, tracking_uri: str, address: str, reuse: bool, folder: Path) -> dict:
    """Launch the sweep of ``count`` trials through ``launch``; what it cost."""
    import psutil
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from bench.large_sweep import MeasuredProgress, simulated_trial  # by name, not as __main__'s (pickled)
    from detsweep.sweeps import launch as launching
    from detsweep.sweeps import progress as progress_module
    from detsweep.sweeps import tuner
    from detsweep.sweeps.resources import TRIAL_DRIVER
    from detsweep.sweeps.spec import load_sweep
    from detsweep.trainables.trial import ending_on_stop

    name = f"large{count}"
    sweep = load_sweep(BENCH / "curves_sweep.yaml", [
        f"name={name}", f"storage={storage}", f"search.num_samples={count}", f"search.max_concurrent_trials={AT_ONCE}",
        "search.algorithm=optuna", f"search.scheduler={ASHA}", f"base.tracking.uri={tracking_uri}",
        f"base.train.checkpoint_every={CHECKPOINT_EVERY}"])
    probe, finish, suggest = Probe(), Timed(launching.finish), Timed(OptunaSearch.suggest)

    def timed_suggest(searcher, trial_id):  # a method: bound to each searcher, timed in ``suggest``
        return suggest(searcher, trial_id)

    MeasuredProgress.made.clear()

    def runs():  # each trial's process: detsweep's trial, training replaced
        return ending_on_stop(tune.with_resources(simulated_trial, TRIAL_DRIVER))

    driver, started = psutil.Process(), time.perf_counter()
    cpu_before = sum(driver.cpu_times()[:2])
    with mock.patch.object(tuner, "trainable", runs), mock.patch.object(progress_module, "SweepProgress", MeasuredProgress), \
            mock.patch.object(launching, "finish", finish), mock.patch.object(OptunaSearch, "suggest", timed_suggest):
        if reuse:
            build = tuner.build_tuner
            stack = mock.patch.object(tuner, "build_tuner", lambda *a, **k: build(*a, **k, runs=runs()))
        else:
            stack = contextlib.nullcontext()
        with stack:
            report = launching.launch(sweep, address=address, register=True, callbacks=[probe.callback()])
    wall = time.perf_counter() - started
    probe.stop()
    loop_ran, loop_waited = probe.loop_times()
    cpu = sum(driver.cpu_times()[:2]) - cpu_before
    progress = MeasuredProgress.made[0]
    redraws = progress.draw_seconds
    closed = runs_left_open(report)
    asked = {"status": report["path"], "best": name, "importance": report["path"]}
    timings = {f"{command}_s": command_seconds([command, target], tracking_uri, folder) for command, target in asked.items()}
    on_head = per_trial_on_head(probe.samples) if probe.samples else {}
    return {"trials": len(report["trials"]), "wall_s": wall, "driver_cpu_s": cpu, "driver_share_of_core": cpu / wall,
            "driver_peak_mb": probe.peak_rss / 2 ** 20, "redraws": progress.redraws, "most_rows": progress.most_rows,
            "redraw_ms": 1000 * statistics.median(redraws) if redraws else 0.0,
            "console_share_of_core": progress.cpu_seconds / wall,
            "delay_median_s": statistics.median(probe.delays), "delay_p95_s": quantile(probe.delays, 0.95),
            "loop_share_of_core": loop_ran / wall, "loop_waiting_for_core_share": loop_waited / wall,
            "load_average_median": statistics.median(probe.loads) if probe.loads else float("nan"),
            "suggest_ms_first": 1000 * statistics.median(suggest.seconds[:50]),
            "suggest_ms_last": 1000 * statistics.median(suggest.seconds[-50:]),
            "end_s": finish.seconds[0], **closed, **timings,
            "trials_failed": sum(trial["status"] == "ERROR" for trial in report["trials"]),
            "head_processes_per_trial": sum(count for count, _ in on_head.values()),
            "head_mb_per_trial": sum(count * each for count, each in on_head.values())}


def head_share(trials: int, budget_s: int, storage: str, tracking_uri: str, address: str) -> list[list]:
    """Real trials (Ray Train, quickstart's training), ``trials`` at once until ``budget_s``:
    per kind of process, how many per running trial and the unique MB of each, at the samples
    where every trial ran. The trial's process, its channel and Ray Train's controller run on the
    head; the workers go where their resources are (GPU nodes on a cluster). On this one machine
    every process is on the head, so the table says what is not a training worker, not where
    Ray Train places its helpers on a cluster."""
    from detsweep.sweeps.launch import launch
    from detsweep.sweeps.spec import load_sweep

    sweep = load_sweep(BENCH / "curves_sweep.yaml", [
        "name=headshare", f"storage={storage}", f"search.num_samples={trials}", f"search.max_concurrent_trials={trials}",
        "search.algorithm=random", f"search.time_budget_s={budget_s}", f"base.tracking.uri={tracking_uri}",
        "base.train.num_steps=100000", "base.optimizer.learning_rate.total_steps=100000"])
    probe = Probe()
    launch(sweep, address=address, register=False, callbacks=[probe.callback()])
    probe.stop()
    if not any(sample["running"] == trials for sample in probe.samples):
        raise SystemExit(f"no sample had {trials} trials running at once within {budget_s} s")
    rows = [["process", "beside its training worker", "per running trial", "MB each (unique)"]]
    for kind, (per_trial, each) in per_trial_on_head(probe.samples, trials).items():
        rows.append([kind, kind != "RayTrainWorker", per_trial, each])
    return rows


def pseudo_terminal():
    """A terminal for the console to draw on, its output read and dropped by a thread."""
    import pty

    reader, writer = pty.openpty()

    def drain() -> None:
        with contextlib.suppress(OSError):
            while os.read(reader, 65536):
                pass

    threading.Thread(target=drain, daemon=True).start()
    return os.fdopen(writer, "w")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def runs_left_open(report: dict) -> dict[str, int]:
    """The sweep's trial runs in MLflow: how many are still RUNNING, and how many lost writes."""
    from mlflow import MlflowClient

    from detsweep.tracking.pages import every_run

    client = MlflowClient(report["mlflow"]["tracking_uri"])
    runs = [run for run in every_run(client, [report["mlflow"]["experiment_id"]],
                                     f"tags.mlflow.parentRunId = '{report['mlflow']['parent_run_id']}'")]
    return {"runs": len(runs), "runs_open": sum(run.info.status == "RUNNING" for run in runs),
            "lost_writes": sum(bool(run.data.tags.get("detsweep.lost_writes")) for run in runs)}


PROFILES = os.environ.get("BENCH_PROFILES")  # a folder: each command run once more under cProfile, saved there


def command_seconds(command: list[str], tracking_uri: str, folder: Path) -> float:
    """Seconds for ``detsweep COMMAND…`` as a user runs it, with the sweep's tracking server."""
    started = time.perf_counter()
    run_command(command, tracking_uri, folder)
    seconds = time.perf_counter() - started
    if PROFILES:
        run_command(command, tracking_uri, folder, ["-m", "cProfile", "-o", f"{PROFILES}/{command[0]}.prof"])
    return seconds


def run_command(command: list[str], tracking_uri: str, folder: Path, python: list[str] = ()) -> None:
    result = subprocess.run([sys.executable, *python, "-m", "detsweep", *command], cwd=folder, capture_output=True,
                            text=True, env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri})
    if result.returncode != 0:
        raise SystemExit(f"detsweep {' '.join(command)} failed: {result.stderr[-2000:]}")


@contextlib.contextmanager
def ray_head(env: dict[str, str], folder: Path) -> Iterator[str]:
    """``ray start --head`` of ``AT_ONCE`` logical CPUs with ``env`` (the trials' credentials,
    the repo on PYTHONPATH, as a head's set-up gives its raylet), as the suite starts one
    (``tests/cluster_parts.py``); its address. This process joins it with the same auth mode."""
    from tests.cluster_parts import AUTH, ray_start_head

    port = free_port()
    with mock.patch.dict(os.environ, {**env, **AUTH, "PYTHONPATH": str(REPO)}), \
            ray_start_head(folder, port, [f"--num-cpus={AT_ONCE}"], {}):
        try:
            yield f"127.0.0.1:{port}"
        finally:
            import ray

            ray.shutdown()  # before the head goes: a driver left joined to a dead head is ended by Ray


@contextlib.contextmanager
def tracking(sqlite: bool, folder: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    """The tracking URI, Tune's storage and the environment trials need: the cluster's stack
    (MLflow on PostgreSQL, S3), or MLflow's embedded SQLite and a local folder."""
    if sqlite:
        yield f"sqlite:///{folder / 'mlflow.db'}", str(folder / "ray"), {}
        return
    from .tracking_load import tracking_stack

    with tracking_stack(folder) as stack:
        bucket = stack.s3.new_bucket("sweeps")
        yield stack.uri, f"s3://{bucket}/ray", {**stack.client_env, **stack.s3.env}


def sweep_entry(measured: list[dict], sqlite: bool, reuse: bool, notes: list[str] = ()) -> tuple[str, Entry]:
    """The sweeps' record: a column per size (growth reads across), the targets at the largest."""
    header = ["trials", *[row["trials"] for row in measured]]
    largest = measured[-1]
    targets = [Target(f"{what} at {largest['trials']} trials", f"<= {goal}", largest[what], largest[what] <= goal)
               for what, goal in TARGETS.items()] + [
        Target(f"runs left open at {largest['trials']} trials", "== 0", largest["runs_open"], largest["runs_open"] == 0),
        Target(f"lost writes at {largest['trials']} trials", "== 0", largest["lost_writes"], largest["lost_writes"] == 0)]
    return "large_sweep" + ("_sqlite" if sqlite else "") + ("_reused" if reuse else ""), Entry(
        title=f"A simulated sweep through the real driver, {'SQLite' if sqlite else 'the cluster stack'}"
              f"{', reused actors' if reuse else ''} (bench/large_sweep.py)",
        settings={"curves": "bench/curves.json", "search": "optuna (TPE)", "scheduler": ASHA, "at_once": AT_ONCE,
                  "report_every_s": SECONDS_PER_REPORT, "checkpoint_mb": CHECKPOINT_MB,
                  "ray": f"ray start --head, {AT_ONCE} logical CPUs", "tracking": "sqlite" if sqlite else
                  "MLflow basic-auth server over HTTPS, PostgreSQL, S3 (moto)", "reused_actors": reuse},
        rows=[header, *[[key, *[row[key] for row in measured]] for key in measured[0] if key != "trials"]],
        targets=targets, notes=list(notes))


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", help="trials per sweep (default 200 1000 2000; none: "
                        "only the head's share)")
    parser.add_argument("--sqlite", action="store_true", help="MLflow's embedded SQLite instead of the cluster's stack")
    parser.add_argument("--reuse", action="store_true", help="Tune reuses trial actors")
    parser.add_argument("--head-trials", type=int, default=None, help="real trials at once for the head's share "
                        "(default 4; 0: not measured)")
    args = parser.parse_args()
    sizes = ([40] if args.smoke else [200, 1000, 2000]) if args.sizes is None else args.sizes
    head_trials = (2 if args.smoke else 4) if args.head_trials is None else args.head_trials
    # ``timeout`` or a CI's cancel: the stack's servers, the Ray head and the folder still go
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    folder = Path(tempfile.mkdtemp(prefix="bench-large-"))
    folder.chmod(0o755)  # postgres reads its folder in it
    measured = []
    try:
        with tracking(args.sqlite, folder) as (uri, storage, env), mock.patch.dict(os.environ, env), \
                ray_head({**env, **(REUSED if args.reuse else {})}, folder) as address:
            for count in sizes:  # recorded at each size: a long run cut short keeps what it measured
                measured.append(one_sweep(count, storage, uri, address, args.reuse, folder))
                print(json.dumps(measured[-1]), flush=True)
                record(*sweep_entry(measured, args.sqlite, args.reuse), args.out)
            if head_trials:
                record("head_share", Entry(
                    title="The head's share of a running trial, real trials (bench/large_sweep.py)",
                    settings={"trials_at_once": head_trials, "config": "bench/curves_sweep.yaml's base (quickstart)",
                              "ray": f"ray start --head, {AT_ONCE} logical CPUs"},
                    rows=head_share(head_trials, 120 if args.smoke else 180, storage, uri, address)), args.out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
