"""A trial's end when Tune stops it (``trainables/trial.py:ending_on_stop``), in a real Tune run
on a local cluster of this module's own, with the trial's real MLflow run (sqlite)."""

from __future__ import annotations

import json
from pathlib import Path

from detsweep.config import TrackingConfig
from detsweep.tracking import open_sweep_run, resolve_backend

from .conftest import REPO, connected_to


def test_a_trial_tune_stops_at_a_report_has_written_what_it_reported_when_tune_is_done_with_it(local_cluster, tmp_path):
    """Tune stops each trial at its first report while its MLflow writer is 3 s behind (a slow
    server): the first by handing its actor the second trial (``reuse_actors``: ``reset_config``,
    which waits 2 s for the trial's thread), the second with ``stop``. Each ends first
    (``TrialEnd``): when ``fit()`` returns, the checkpoint of each trial's report is READY in
    MLflow, uploaded by the trial's own process (nobody else uploads one), and both trials ran
    in one process (a reset that found the thread still writing would have cost a new one).
    Their Ray Train runs are left for their next start or the sweep's end: Tune waits for a
    stopping trial, and so do the trials waiting for its resources."""
    from mlflow import MlflowClient
    from ray import tune

    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep
    from detsweep.tracking.checkpoint_models import checkpoints, step_of
    from detsweep.trainables.trial import ending_on_stop

    sweep = load_sweep(REPO / "sweeps" / "quickstart.yaml")
    backend = resolve_backend(TrackingConfig(), cwd=tmp_path)
    link = open_sweep_run(sweep, str(tmp_path / "ray" / "quickstart"), backend, as_run(sweep))
    checkpoint = tmp_path / "checkpoint_10"
    checkpoint.mkdir()
    (checkpoint / "meta.json").write_text(json.dumps({"step": 10}))
    train_runs = tmp_path / "train"
    left = ["other-train-t3-1", "stopped-train-t1-1", "stopped-train-t1-2", "stopped-train-t2-1"]
    for name in left:
        (train_runs / name).mkdir(parents=True)

    def stopped_while_writing(config: dict) -> None:
        import os
        import time

        import ray.train

        from detsweep.tracking.trial_run import RunLink, TrialIdentity, TrialRun
        from detsweep.trainables.trial import TrialEnd

        trial = config["trial"]
        run = TrialRun(RunLink(**config["link"]), TrialIdentity(trial, f"trial_{trial}"), sweep.base)
        (Path(config["processes"]) / trial).write_text(str(os.getpid()))
        end = TrialEnd(run, config["storage"], f"stopped-train-{trial}-")
        run.writer.submit("a slow server", lambda: time.sleep(3))
        run.log_report({"step": 10, "train/loss": 1.0, "eval/AP_best": 0.2},
                       ray.train.Checkpoint.from_directory(config["checkpoint"]))
        try:  # as ``run_trial``: released at its report (SystemExit there), the thread ends the trial
            ray.tune.report({"eval/AP_best": 0.2})
            ray.tune.report({"eval/AP_best": 0.3})  # Tune stopped it at the first: never here
        except BaseException:
            end()
            raise

    client = MlflowClient(backend.uri)  # MLflow's imports before Ray connects (conftest: no setenv then)
    with connected_to(local_cluster):
        tune.Tuner(
            ending_on_stop(stopped_while_writing),
            param_space={"link": link.to_dict(), "storage": str(train_runs), "checkpoint": str(checkpoint),
                         "trial": tune.grid_search(["t1", "t2"]), "processes": str(tmp_path)},
            tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=True),
            run_config=tune.RunConfig(name="stopped", storage_path=str(tmp_path / "ray"),
                                      stop={"training_iteration": 1}, verbose=0),
        ).fit()

    runs = client.search_runs([link.experiment_id], filter_string="tags.`detsweep.trial_id` LIKE 't%'")
    assert sorted(run.data.tags["detsweep.trial_id"] for run in runs) == ["t1", "t2"]
    for run in runs:
        models = checkpoints(client, [link.experiment_id], run.info.run_id, ready=False)
        assert [(step_of(m), str(m.status)) for m in models] == [(10, "READY")]
    assert (tmp_path / "t1").read_text() == (tmp_path / "t2").read_text()
    assert sorted(path.name for path in train_runs.iterdir()) == left
