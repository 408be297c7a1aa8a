"""Real Tune PBT, with detsweep's checkpoint retention, on a bucket: two trials whose
checkpoints are a few bytes (no training), one fast and good, one slow and poor. When the
slow one reaches its perturbation the fast one is far ahead: the slow one exploits the
checkpoint the fast one had at its last perturbation, older than the ones it wrote since.

    python -m tests.pbt_retention_probe STORAGE_URI REPORTS.jsonl

REPORTS.jsonl: every report of every trial as it was made (trial, step, time), with the
checkpoint it had restored from (the trial that wrote it, and its step)."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import ray
from ray import tune

from detsweep.sweeps.retention import KeepCheckpoints

STEPS, INTERVAL = 60, 10
WINDOW = INTERVAL + 1 + 1  # as detsweep sizes it: the interval, one checkpoint and one report apart


def trainable(config: dict) -> None:
    trial_id, start, restored = tune.get_context().get_trial_id(), 0, None
    if (checkpoint := tune.get_checkpoint()) is not None:
        with checkpoint.as_directory() as folder:
            restored = json.loads(Path(folder, "state.json").read_text())
        start = restored["step"]
    for step in range(start + 1, STEPS + 1):
        time.sleep(config["delay"])
        with Path(config["log"]).open("a") as log:  # one machine: every trial appends here
            log.write(json.dumps({"trial": trial_id, "step": step, "at": time.time(), "restored": restored}) + "\n")
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "state.json").write_text(json.dumps({"step": step, "owner": trial_id}))
            tune.report({"step": step, "score": config["quality"] * step}, checkpoint=tune.Checkpoint.from_directory(folder))


def main(storage: str, out: str) -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    pbt = tune.schedulers.PopulationBasedTraining(
        time_attr="step", metric="score", mode="max", perturbation_interval=INTERVAL, quantile_fraction=0.5,
        hyperparam_mutations={"quality": [1.0, 2.0]}, resample_probability=0.0)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"CPU": 1}),
        param_space={"log": out, "delay": tune.grid_search([0.2, 0.6]), "quality": tune.sample_from(
            lambda spec: 2.0 if spec.config["delay"] < 0.5 else 1.0)},
        tune_config=tune.TuneConfig(scheduler=pbt, reuse_actors=False),
        run_config=tune.RunConfig(name="pbt", storage_path=storage, verbose=0,
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=None),
                                  callbacks=[KeepCheckpoints("score", "max", WINDOW)]),
    )
    grid = tuner.fit()
    for result in grid:
        if result.error:
            raise SystemExit(f"trial {result.metrics.get('trial_id')} failed: {result.error}")


if __name__ == "__main__":
    main(*sys.argv[1:])
