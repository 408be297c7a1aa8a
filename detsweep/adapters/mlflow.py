"""MLflow's undocumented parts (MLflow 3.17): the system-metrics monitor attached to a run that
another process opened, and ``mlflow gc`` run in this process.

MLflow documents system metrics only for the run a process starts itself
(``mlflow.start_run(log_system_metrics=True)``), which would also end it; a trial's run is opened
by the trial's process and each node's first worker only adds its node's metrics to it. And
``mlflow gc`` takes its database's URI on the command line only, where every user of the machine
would read it: run in-process, the URI stays in this process's memory.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["SystemMetrics", "collect_garbage", "start_system_metrics"]


class SystemMetrics(Protocol):
    def finish(self) -> None: ...


def start_system_metrics(run_id: str, tracking_uri: str, node_id: str | None = None) -> SystemMetrics:
    """Start sampling this node's CPU, memory, disk, network (and GPUs, with nvidia-ml-py) into the
    run ``run_id``, named ``system/<node_id>/…`` when ``node_id`` is given, after the steps its
    system metrics already reached (a restarted worker continues them). A sample is logged at
    once and one at ``finish()`` (a trial stopped or ended within the first interval has its
    node's figures all the same), which stops it and leaves the run as it is.
    MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL sets how often it samples in between."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, node_id=node_id, resume_logging=True, tracking_uri=tracking_uri)
    sample = _Sampled(monitor)
    sample.log()  # before its thread starts: never two samplers at once
    monitor.start()
    return sample


class _Sampled:
    def __init__(self, monitor):
        self.monitor = monitor

    def log(self) -> None:
        self.monitor.collect_metrics()
        self.monitor.publish_metrics(self.monitor.aggregate_metrics())
        self.monitor.mlflow_logger.flush()

    def finish(self) -> None:
        self.monitor.finish()  # its sampling thread has ended: this one samples alone
        self.log()


def collect_garbage(backend_store_uri: str, tracking_uri: str) -> None:
    """``mlflow gc --backend-store-uri URI --tracking-uri URI``: delete for good the runs, logged
    models and experiments in the ``deleted`` stage, with their artifacts, which are reached through
    ``tracking_uri`` (a tracking server that proxies them, with the credentials in this process's
    environment; the store itself when there is no server)."""
    from mlflow.cli import gc

    gc.main(["--backend-store-uri", backend_store_uri, "--tracking-uri", tracking_uri], standalone_mode=False)
