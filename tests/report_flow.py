"""Run by ``tests/test_train.py`` in a process of its own (a Ray cluster of its own, started
with the caller's environment): one training through Ray Train, with every item that reached
the run's report queue (loops, Ray Train's reports, evaluations), in the order it arrived, and how many had arrived at each of Ray
Train's polls of its workers. Prints them as one JSON object.

    python -m tests.report_flow --set train.steps_per_loop=1 ...
"""

from __future__ import annotations

import argparse
import json
import queue
import tempfile

from ray.train.v2._internal.execution.callback import WorkerGroupCallback

from detsweep.cluster import connect
from detsweep.config import load_trial_config
from detsweep.trainables.channel import Evaluation, LoopMetrics, RayReport, RunChannel, RunEnded, in_step_order
from detsweep.trainables.request import TrainingRequest
from detsweep.trainables.trainer import make_trainer

from .conftest import REPO


class CountAtPolls(WorkerGroupCallback):
    """In Ray Train's controller: at each poll of the workers, how many items the queue holds."""

    def __init__(self, reports: RunChannel, counts: RunChannel):
        self.reports, self.counts = reports, counts

    def after_worker_group_poll_status(self, worker_group_status) -> None:
        self.counts.put(self.reports.qsize())


def describe(item) -> list:
    if isinstance(item, LoopMetrics):
        return ["loop", item.step, item.milestone, item.at]
    if isinstance(item, Evaluation):  # train.evaluation: async
        return ["evaluation", item.step, item.started, item.ended]
    assert isinstance(item, RayReport), item
    return ["report", item.step, item.checkpoint is not None]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    config = load_trial_config(REPO / "configs" / "quickstart.yaml", parser.parse_args().overrides)
    connect(None)
    reports, counts = RunChannel(), RunChannel()
    reports.publish("settled", 10**9)  # nobody passes steps on until the end: no evaluation waits for it
    with tempfile.TemporaryDirectory() as storage:
        make_trainer(TrainingRequest(config, "report-flow", storage), reports,
                     callbacks=[CountAtPolls(reports, counts)]).fit()
    arrived = [reports.get() for _ in range(reports.qsize())]
    replay: queue.Queue = queue.Queue()
    for item in [*arrived, RunEnded()]:
        replay.put(item)
    print(json.dumps({
        "arrived": [describe(item) for item in arrived],
        "at_polls": [counts.get() for _ in range(counts.qsize())],
        "in_order": [[report.step, report.checkpoint is not None, "eval/AP" in report.metrics]
                     for report in in_step_order(replay)],
    }))


if __name__ == "__main__":
    main()
