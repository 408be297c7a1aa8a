"""The report channel's two ends, on local queues: rank 0's sender and the owner's merge of
loops and Ray Train reports into one stream in step order (:mod:`detsweep.trainables.channel`);
and the channel itself, a Ray actor. The same code in a real Ray Train run:
``tests/test_train.py``."""

import queue
import threading

import pytest

from detsweep.trainables.channel import (
    Evaluation,
    EvaluationError,
    LoopMetrics,
    LoopSender,
    RayReport,
    RunEnded,
    RunError,
    TrainingFailed,
    WorkersFailed,
    in_step_order,
)


class Notes:
    """What the owner is told beside the stream, in the order told."""

    def __init__(self):
        self.told: list[tuple[str, object]] = []

    def note_replayed(self, step: int) -> None:
        self.told.append(("replayed", step))

    def note_worker_failure(self, reason: str) -> None:
        self.told.append(("failed", reason))


def loop(step: int, milestone: bool = False, elsewhere: bool = False, **metrics) -> LoopMetrics:
    return LoopMetrics(step, {"step": step, "source": "loop", **metrics}, milestone or elsewhere,
                       evaluated_elsewhere=elsewhere)


def report(step: int, checkpoint: str | None = "ckpt") -> RayReport:
    return RayReport(step, {"step": step, "source": "ray"}, checkpoint)


def stream(*items) -> list[tuple[int, str, str | None]]:
    """What ``in_step_order`` passes on once ``items`` and the end have arrived, as (step, source, checkpoint)."""
    arrived = queue.Queue()
    for item in [*items, RunEnded()]:
        arrived.put(item)
    return [(r.metrics["step"], r.metrics["source"], r.checkpoint) for r in in_step_order(arrived)]


def test_loops_after_a_milestone_wait_for_its_report_and_the_report_stands_for_the_milestone():
    # Rank 0 trains on past step 2 while Ray Train's report of it waits for a poll.
    assert stream(loop(1), loop(2, milestone=True), loop(3), loop(4), report(2)) == [
        (1, "loop", None), (2, "ray", "ckpt"), (3, "loop", None), (4, "loop", None)]


def test_a_loop_is_passed_on_as_soon_as_nothing_before_it_is_pending():
    arrived = queue.Queue()
    passed = in_step_order(arrived)
    arrived.put(loop(1))
    assert next(passed).step == 1  # without waiting for the end
    arrived.put(loop(2, milestone=True))
    arrived.put(loop(3))
    got = []
    reader = threading.Thread(target=lambda: got.append(next(passed)))
    reader.start()
    reader.join(timeout=0.5)
    assert reader.is_alive() and not got  # step 3 waits behind step 2's report
    arrived.put(report(2))
    reader.join(timeout=5)
    assert got[0].step == 2 and got[0].checkpoint == "ckpt"
    assert next(passed).step == 3


def test_a_restarted_worker_group_replays_from_its_checkpoint_and_no_step_is_passed_on_twice():
    # Checkpoint at 2; the first workers die after sending loop 3 and milestone 4, whose report
    # never reached Ray Train. The restarted group goes on from step 2's checkpoint.
    items = [loop(1), loop(2, milestone=True), report(2), loop(3, attempt=1), loop(4, milestone=True),
             loop(3, attempt=2), loop(4, milestone=True), loop(5), report(4)]
    assert [(step, source) for step, source, _ in stream(*items)] == [(1, "loop"), (2, "ray"), (3, "loop"),
                                                                       (4, "ray"), (5, "loop")]
    arrived, notes = queue.Queue(), Notes()
    items.insert(5, WorkersFailed("the actor died unexpectedly"))  # Ray Train's poll saw it
    for item in [*items, RunEnded()]:
        arrived.put(item)
    assert [r.step for r in in_step_order(arrived, notes=notes)] == [1, 2, 3, 4, 5]
    # passed on, then trained again: said, not dropped silently
    assert notes.told == [("failed", "the actor died unexpectedly"), ("replayed", 3)]


def test_what_a_restart_says_once_on_a_replayed_step_goes_on_with_the_next_step_passed_on():
    # The restarted group's first loop (step 3, passed on before the failure) carries its
    # start-up and restore metrics: they reach the owner with step 4, not with the dropped 3.
    arrived = queue.Queue()
    for item in [loop(1), loop(2, milestone=True), report(2), loop(3),
                 loop(3, **{"restore/step": 2, "startup/total_s": 9.0}), loop(4), RunEnded()]:
        arrived.put(item)
    passed = {r.step: r.metrics for r in in_step_order(arrived)}
    assert sorted(passed) == [1, 2, 3, 4] and "restore/step" not in passed[3]
    assert passed[4]["restore/step"] == 2 and passed[4]["startup/total_s"] == 9.0 and passed[4]["source"] == "loop"


def test_a_step_trained_again_replaces_the_one_not_yet_passed_on():
    arrived = queue.Queue()
    for item in [loop(1, milestone=True), loop(2, attempt=1), loop(2, attempt=2), report(1), RunEnded()]:
        arrived.put(item)
    assert [r.metrics.get("attempt") for r in in_step_order(arrived)] == [None, 2]


def test_a_run_that_ends_before_a_milestones_report_still_passes_on_its_loops():
    assert stream(loop(1), loop(2, milestone=True), loop(3)) == [(1, "loop", None), (2, "loop", None),
                                                                 (3, "loop", None)]


def evaluation(step: int) -> Evaluation:
    return Evaluation(step, {"eval/AP": step / 100})


def test_an_evaluation_elsewhere_joins_its_checkpoints_step_and_the_loops_after_it_wait_for_it():
    # Rank 0 trains steps 3 and 4 while the task evaluates step 2's checkpoint.
    arrived = queue.Queue()
    settled = []
    for item in [loop(1), loop(2, elsewhere=True), report(2), loop(3), loop(4), evaluation(2), RunEnded()]:
        arrived.put(item)
    passed = [(r.step, r.metrics.get("eval/AP"), r.metrics["source"], r.checkpoint)
              for r in in_step_order(arrived, settled.append)]
    assert passed == [(1, None, "loop", None), (2, 0.02, "ray", "ckpt"), (3, None, "loop", None),
                      (4, None, "loop", None)]
    assert settled == [2]


def test_a_step_waits_for_its_evaluation_even_when_its_report_is_there():
    arrived = queue.Queue()
    passed = in_step_order(arrived)
    for item in [loop(1, elsewhere=True), report(1), loop(2)]:
        arrived.put(item)
    got = []
    reader = threading.Thread(target=lambda: got.append(next(passed)))
    reader.start()
    reader.join(timeout=0.5)
    assert reader.is_alive() and not got
    arrived.put(evaluation(1))
    reader.join(timeout=5)
    assert got[0].metrics["eval/AP"] == 0.01 and got[0].metrics["source"] == "ray"


def test_settled_is_called_once_the_consumer_is_done_with_the_evaluated_step():
    arrived = queue.Queue()
    settled = []
    for item in [loop(1, elsewhere=True), report(1), evaluation(1), RunEnded()]:
        arrived.put(item)
    passed = in_step_order(arrived, settled.append)
    next(passed)
    assert settled == []  # the consumer holds step 1: its checkpoint must stay
    assert list(passed) == [] and settled == [1]


def test_a_replayed_evaluation_of_a_step_passed_on_is_dropped_but_settled():
    settled = []
    arrived = queue.Queue()
    for item in [loop(1, elsewhere=True), report(1), evaluation(1), loop(1, elsewhere=True), report(1),
                 evaluation(1), RunEnded()]:
        arrived.put(item)
    assert [r.step for r in in_step_order(arrived, settled.append)] == [1]
    assert settled == [1, 1]


def test_pictures_travel_beside_the_metrics_and_reach_the_owner_with_their_step_once():
    """Rank 0's pictures (the schedule's with its first loop, the detections' at an inline
    evaluation) and an evaluation task's go with their step's report, as files, never among
    the metrics; a replayed step's pictures go with it, dropped."""
    arrived = queue.Queue()
    first = LoopMetrics(1, {"step": 1}, False, pictures={"learning_rate.png": b"schedule"})
    inline = LoopMetrics(2, {"step": 2}, True, pictures={"detections/step_000002.png": b"inline"})
    elsewhere = Evaluation(3, {"eval/AP": 0.3}, pictures={"detections/step_000003.png": b"task"})
    replayed = LoopMetrics(2, {"step": 2}, True, pictures={"detections/step_000002.png": b"again"})
    for item in [first, inline, report(2), loop(3, elsewhere=True), report(3), elsewhere, replayed, report(2),
                 RunEnded()]:
        arrived.put(item)
    passed = [(r.step, r.pictures, sorted(r.metrics)) for r in in_step_order(arrived)]
    assert passed == [(1, {"learning_rate.png": b"schedule"}, ["step"]),
                      (2, {"detections/step_000002.png": b"inline"}, ["source", "step"]),
                      (3, {"detections/step_000003.png": b"task"}, ["eval/AP", "source", "step"])]


def test_a_run_that_fit_ended_with_an_error_ends_the_stream_with_it_after_every_step():
    arrived, passed = queue.Queue(), []
    for item in [loop(1), loop(2), RunEnded("WorkerGroupError: the placement group was removed")]:
        arrived.put(item)
    with pytest.raises(RunError, match=r"^WorkerGroupError: the placement group was removed$"):
        for got in in_step_order(arrived):
            passed.append(got.step)
    assert passed == [1, 2]


def test_a_failed_evaluation_ends_the_stream_with_its_reason():
    arrived = queue.Queue()
    for item in [loop(1, elsewhere=True), report(1), Evaluation(1, {}, failure="val.record: no such file")]:
        arrived.put(item)
    with pytest.raises(EvaluationError, match="the evaluation of step 1 failed: val.record: no such file"):
        list(in_step_order(arrived))


def test_a_training_that_failed_passes_on_every_step_before_it_then_ends_with_its_reason():
    # Rank 0's last loop was a milestone: Ray Train's report of it arrives after rank 0's reason.
    arrived, passed = queue.Queue(), []
    for item in [loop(1), loop(2, milestone=True), TrainingFailed("loss is NaN/Inf at step 3"), report(2), RunEnded()]:
        arrived.put(item)
    with pytest.raises(RunError, match=r"^loss is NaN/Inf at step 3$"):
        for got in in_step_order(arrived):
            passed.append((got.step, got.metrics["source"], got.checkpoint))
    assert passed == [(1, "loop", None), (2, "ray", "ckpt")]


def test_a_worker_whose_devices_are_not_as_sized_ends_the_run_at_once_whatever_ray_train_does_next():
    """Said before any loop, by any worker: the merge raises without waiting for Ray Train's
    restarts (which would find the same devices) or for the run's end."""
    arrived, raised = queue.Queue(), []
    for item in [TrainingFailed("scaling: found 1 replica(s) in step on node-2", at_start=True),
                 WorkersFailed("the worker raised"), loop(1)]:
        arrived.put(item)

    def merge() -> None:
        try:
            list(in_step_order(arrived))
        except RunError as error:
            raised.append(str(error))

    reader = threading.Thread(target=merge, daemon=True)
    reader.start()
    reader.join(timeout=5)
    assert raised == ["scaling: found 1 replica(s) in step on node-2"]


def test_a_restart_after_rank_0_said_why_it_failed_gets_a_say_of_its_own():
    # Rank 0 diverged, then a worker died before the run ended: Ray Train restarts the group
    # from its checkpoint, and this time it trains to the end.
    arrived = queue.Queue()
    for item in [loop(1), TrainingFailed("loss is NaN/Inf at step 2"), WorkersFailed("the worker died"), loop(2),
                 RunEnded()]:
        arrived.put(item)
    assert [r.step for r in in_step_order(arrived)] == [1, 2]


def test_detsweep_train_says_when_ray_train_restarts_its_workers_and_why(capsys):
    """``detsweep train`` hears of failed workers through :class:`ConsoleNotes`: one line on its
    console for each restart, with the reason Ray Train gave (``ForwardReports`` puts it on the
    queue; a sweep's trials note it on their MLflow run instead, ``test_cluster_sweeps.py``)."""
    from detsweep.trainables.trainer import ConsoleNotes

    arrived = queue.Queue()
    for item in [loop(1), loop(2, milestone=True), report(2), WorkersFailed("ActorDiedError: the worker died"),
                 loop(3), RunEnded()]:
        arrived.put(item)
    assert [r.step for r in in_step_order(arrived, notes=ConsoleNotes())] == [1, 2, 3]
    assert capsys.readouterr().out == ("workers failed: ActorDiedError: the worker died (Ray Train restarts them from "
                                       "the last checkpoint while scaling.max_failures allows)\n")


@pytest.fixture
def channel(ray_driver):
    """A real run channel (its actor) on a small local cluster of this test module's own."""
    from detsweep.trainables.channel import RunChannel

    return RunChannel()


def test_the_sender_delivers_in_order_and_flush_returns_once_all_is_on_the_channel(channel):
    sender = LoopSender(channel)
    for step in range(1, 51):
        sender.send(loop(step))  # a put on a local queue: the training thread never waits for Ray
    sender.flush()
    assert channel.qsize() == 50  # nothing still on its way
    assert [channel.get().step for _ in range(50)] == list(range(1, 51))


def test_the_sender_says_at_flush_that_the_channel_is_gone(channel):
    import ray

    ray.kill(channel.actor)  # its owner's process died
    sender = LoopSender(channel)
    sender.send(loop(1))
    with pytest.raises(RuntimeError, match="^the run's report channel is gone: "):
        sender.flush()


def test_a_published_value_reaches_whoever_waits_for_it_once_it_is_high_enough(channel):
    """The owner publishes the MLflow run for the workers' system metrics once it is open, and
    each evaluated step it passed on (``settled``): a reader waits until the value is there and
    at least what it asked for, and gets None past its timeout, never an exception."""
    import ray

    settled = channel.actor.read.remote("settled", 30, 2)  # an evaluation task waiting for its step 2
    target = channel.actor.read.remote("system_metrics", 30, None)  # a worker's node monitor
    channel.publish("settled", 1)
    assert ray.wait([settled, target], num_returns=2, timeout=0.5)[0] == []  # step 1 is not the one waited for
    channel.publish("settled", 3)
    channel.publish("system_metrics", {"run_id": "r1", "uri": "http://x"})
    assert ray.get([settled, target]) == [3, {"run_id": "r1", "uri": "http://x"}]
    assert channel.read("settled", 0.1, at_least=2) == 3  # published before the read: at once
    assert channel.read("never", 0.1) is None


def test_a_stopped_trials_node_logs_its_last_system_metrics_before_the_process_ends(channel, tmp_path):
    """Tune ends a stopped trial's process, and its workers with it, where no ``finally`` runs:
    the owner asks the nodes' monitors for their last samples first (``trial.last_samples``),
    and waits for one still starting (here, still waiting for the run to open). A trial stopped
    within the first sampling interval (10 s) has its node's figures all the same: the sample at
    the monitor's start and its last."""
    from mlflow import MlflowClient

    from detsweep.trainables.channel import STOPPING
    from detsweep.trainables.trial import last_samples
    from detsweep.trainables.worker import NodeMonitor

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("stopped")).info.run_id
    monitor = NodeMonitor(channel, None)  # made at the first report, before the run is open
    stopping = threading.Thread(target=last_samples, args=(channel,))
    stopping.start()
    assert channel.read(STOPPING, 30) is True  # the stop began
    channel.publish("system_metrics", {"run_id": run_id, "uri": uri})  # then the run opens
    stopping.join(timeout=60)
    assert not stopping.is_alive() and monitor.ended
    history = client.get_metric_history(run_id, "system/cpu_utilization_percentage")
    assert len(history) >= 2, history  # more only if the stop took longer than an interval
