"""Nothing lost past one page of MLflow's answers: a sweep's end, ``best`` and the checkpoints
read every page (``tracking/pages.py``), shown with the page size lowered to a few runs and
runs made directly in a scratch store (no training: a sweep's end reads its trials from
MLflow whatever made them)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from detsweep.config import TrackingConfig
from detsweep.tracking import RunLink, open_sweep_run, resolve_backend
from detsweep.tracking import pages as pages_module
from detsweep.tracking.trial_run import METRIC_TAG, MODE_TAG, PARENT_TAG, ROLE_TAG, TRIAL_TAG

from .conftest import REPO, run_here
from .mlflow_checks import free_port

QUICKSTART_SWEEP = REPO / "sweeps" / "quickstart.yaml"
METRIC = "eval/AP_best"
LR = "optimizer.learning_rate.learning_rate_base"
COST = {"cost/cpu_hours": 0.5, "cost/gpu_hours": 0.0}


@pytest.fixture
def pages_of(monkeypatch):
    """MLflow asked for ``size`` runs (or models) a page; every page asked for is counted."""
    asked = []

    def lower(size: int) -> list:
        monkeypatch.setattr(pages_module, "PAGE_SIZE", size)
        return asked

    real = pages_module._every

    def counted(search, key):
        return real(lambda size, token: asked.append(token) or search(size, token), key)

    monkeypatch.setattr(pages_module, "_every", counted)
    return lower


def sweep_with_trials(tmp_path: Path, scores: list[float], results: str = "quickstart",
                      checkpointed: tuple[int, ...] = ()):
    """A sweep's parent run and a trial run per score, made oldest first, each with the score
    at step 10 and its swept value; the trials at ``checkpointed`` places with a READY
    checkpoint scored by it. Returns the sweep, its link, and the trial runs' ids in order."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep
    from detsweep.tracking.checkpoint_models import log_checkpoint

    sweep = load_sweep(QUICKSTART_SWEEP)
    link = open_sweep_run(sweep, str(tmp_path / "ray" / results), resolve_backend(TrackingConfig(), cwd=tmp_path),
                          as_run(sweep))
    client = MlflowClient(link.uri)
    run_ids = []
    for place, score in enumerate(scores):
        trial_id = f"{results}_{place:05d}"
        tags = {TRIAL_TAG: trial_id, ROLE_TAG: "trial", PARENT_TAG: link.parent_run_id, METRIC_TAG: METRIC,
                MODE_TAG: "max"}
        run_id = client.create_run(link.experiment_id, run_name=f"trial_{trial_id}", tags=tags).info.run_id
        point = Metric(METRIC, score, int(time.time() * 1000), 10)
        client.log_batch(run_id, metrics=[point], params=[_param(LR, 0.01 * (place + 1))])
        if place in checkpointed:
            folder = tmp_path / f"checkpoint_{trial_id}"
            folder.mkdir()
            (folder / "meta.json").write_text(json.dumps({"step": 10}))
            log_checkpoint(client, link.experiment_id, run_id, folder, 10, [point])
        run_ids.append(run_id)
    return sweep, link, run_ids


def _param(key: str, value: float):
    from mlflow.entities import Param

    return Param(key, str(value))


def outcome(trial_id: str, score: float, status: str) -> dict:
    """A trial as ``launch``'s summary reads it from Tune's folder."""
    return {"trial_id": trial_id, "status": status, "metrics": {"step": 10 if status == "TERMINATED" else 5, METRIC: score},
            "config": {}, "checkpoint": None, "error": None, "cost": dict(COST), "infeasible": None}


def report_of(sweep, trials: list[dict], folder: str = "unused") -> dict:
    trials = sorted(trials, key=lambda trial: -trial["metrics"][METRIC])
    return {"name": sweep.name, "path": folder, "metric": METRIC, "mode": "max", "trials": trials,
            "best": trials[0], "cost": {key: sum(t["cost"][key] for t in trials) for key in COST}}


def ended(sweep, link, trials: list[dict], folder: Path, register: bool = True) -> dict:
    """``record_end`` of the summary ``launch`` makes of ``trials``, its folder ``folder``."""
    from dataclasses import fields

    from detsweep.sweeps.experiment import SweepResults, TrialOutcome
    from detsweep.sweeps.launch import record_end

    report = report_of(sweep, trials, str(folder))
    names = [field.name for field in fields(TrialOutcome)]
    outcomes = [TrialOutcome(**{name: trial[name] for name in names}) for trial in report["trials"]]
    return record_end(report, sweep, link, register, SweepResults(outcomes, {}))


def test_a_sweeps_end_closes_links_and_registers_trials_spread_over_three_pages(tmp_path, pages_of, capsys):
    """Ten trial runs read four a page: the sweep's end finds every one, marks the stopped
    ones early stopped, links each in ``launch --json``, and registers the best, the oldest run,
    which MLflow (newest first) puts on the last page."""
    from mlflow import MlflowClient

    scores = [0.9] + [0.1 + 0.05 * place for place in range(9)]  # the first made is the best
    sweep, link, run_ids = sweep_with_trials(tmp_path, scores, checkpointed=(0,))
    statuses = ["TERMINATED" if place % 2 == 0 else "STOPPED" for place in range(len(scores))]
    trials = [outcome(f"quickstart_{place:05d}", score, status)
              for place, (score, status) in enumerate(zip(scores, statuses))]
    asked = pages_of(4)

    report = ended(sweep, link, trials, tmp_path)

    linked = {trial["trial_id"]: trial["mlflow_run_id"] for trial in report["trials"]}
    assert linked == {f"quickstart_{place:05d}": run_id for place, run_id in enumerate(run_ids)}
    client = MlflowClient(link.uri)
    for place, run_id in enumerate(run_ids):
        run = client.get_run(run_id)
        stopped = statuses[place] == "STOPPED"
        assert run.info.status == ("KILLED" if stopped else "FINISHED"), (place, run.info.status)
        assert (run.data.tags.get("early_stopped") == "true") == stopped, place
        assert run.data.metrics["cost/cpu_hours"] == COST["cost/cpu_hours"], place
    parent = client.get_run(link.parent_run_id)
    assert parent.data.tags["detsweep.best_run_id"] == run_ids[0]
    csv = Path(client.download_artifacts(link.parent_run_id, "trials.csv", str(tmp_path))).read_text()
    assert all(run_id in csv for run_id in run_ids), csv
    registered = report["mlflow"]["registered_model"]
    assert registered is not None and report["mlflow"]["not_registered"] is None, report["mlflow"]
    version = client.get_model_version(registered["name"], str(registered["version"]))
    assert version.tags["source_run_id"] == run_ids[0] and registered["champion"] == registered["version"]
    assert f"MLflow: registered quickstart version {registered['version']}, the champion" in capsys.readouterr().out
    assert len(asked) >= 3, asked  # 10 runs at 4 a page, and the models


def test_a_sweep_that_registers_nothing_says_why_in_one_line_and_in_its_json(tmp_path, capsys, monkeypatch):
    """The best trial has no complete checkpoint in MLflow, then no MLflow run at all, then the
    tracking server is away: nothing is registered, and the line and ``not_registered`` say which."""
    from detsweep.sweeps.launch import register_models

    sweep, link, run_ids = sweep_with_trials(tmp_path, [0.2, 0.6], checkpointed=(0,))  # the better one has none
    trials = [outcome("quickstart_00000", 0.2, "TERMINATED"), outcome("quickstart_00001", 0.6, "TERMINATED")]
    report = ended(sweep, link, trials, tmp_path)
    why = f"trial quickstart_00001 has no complete checkpoint in MLflow that scored {METRIC}"
    assert report["mlflow"]["registered_model"] is None and report["mlflow"]["not_registered"] == why
    assert f"MLflow: nothing registered: {why}\n" in capsys.readouterr().out

    unknown = outcome("never_opened", 0.9, "TERMINATED")  # its run never reached MLflow
    report = ended(sweep, link, [*trials, unknown], tmp_path)
    why = f"trial never_opened has no MLflow run in experiment {link.experiment_id}"
    assert report["mlflow"]["not_registered"] == why, report["mlflow"]
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("MLflow:")]
    assert printed == [f"MLflow: nothing registered: {why}"], printed

    report = ended(sweep, link, trials, tmp_path, register=False)
    assert report["mlflow"]["not_registered"] == "--no-register"

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the server is away: say so at once
    away = RunLink(f"http://127.0.0.1:{free_port()}", link.experiment_id, link.parent_run_id)
    linked = [dict(trial, mlflow_run_id=run_id) for trial, run_id in zip(trials, run_ids)]
    registered, why = register_models(report_of(sweep, linked), sweep, away, None)
    assert registered is None and why.startswith(f"trial quickstart_00001's model: MLflow at {away.uri} refused or "
                                                 "failed ("), why


def test_best_ranks_every_trial_of_two_sweeps_whose_runs_and_checkpoints_span_pages(tmp_path, pages_of):
    """Two sweeps of one experiment, four trials each, read three runs (and models) a page:
    ``best`` ranks all eight, the oldest (the best) first, with its checkpoint."""
    scores = {"first": [0.95, 0.3, 0.2, 0.4], "second": [0.5, 0.6, 0.1, 0.7]}
    made = {results: sweep_with_trials(tmp_path, values, results, checkpointed=(0, 1, 2, 3))
            for results, values in scores.items()}
    asked = pages_of(3)

    shown = run_here("best", "quickstart", "--json", cwd=tmp_path)

    assert shown.returncode == 0, shown.stderr
    ranking = json.loads(shown.stdout)
    assert sorted(ranking["parent_run_ids"]) == sorted(link.parent_run_id for _, link, _ in made.values())
    expected = sorted(((value, f"{results}_{place:05d}") for results, values in scores.items()
                       for place, value in enumerate(values)), reverse=True)
    assert [(t["value"], t["trial_id"]) for t in ranking["trials"]] == expected
    best = ranking["trials"][0]
    assert best["run_id"] == made["first"][2][0] and best["checkpoint"].startswith("models:/"), best
    assert all(trial["checkpoint"] for trial in ranking["trials"]), ranking["trials"]
    assert len(asked) >= 3 + 8, asked  # 8 trial runs three a page, and each shown trial's models


def test_a_run_on_two_pages_is_counted_once():
    """A run made while paging pushes the next page's first run back onto it."""
    from types import SimpleNamespace

    class Page(list):
        def __init__(self, items, token):
            super().__init__(items)
            self.token = token

    def run(run_id: str):
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id))

    answers = {None: Page([run("d"), run("c")], "2"), "2": Page([run("c"), run("b")], "4"), "4": Page([run("a")], None)}

    class Client:
        def search_runs(self, experiment_ids, filter_string, max_results, order_by, page_token):
            return answers[page_token]

    assert [r.info.run_id for r in pages_module.every_run(Client(), ["1"])] == ["d", "c", "b", "a"]


def test_mlflow_is_searched_only_through_the_pages_module():
    """Every listing reads all its pages: no ``search_runs`` or ``search_logged_models`` call
    elsewhere in detsweep (a new one would read one page)."""
    calls = re.compile(r"\.search_(runs|logged_models|model_versions|registered_models|experiments)\(")
    found = [f"{path.relative_to(REPO)}:{number}" for path in sorted((REPO / "detsweep").rglob("*.py"))
             if path.name != "pages.py" for number, line in enumerate(path.read_text().splitlines(), 1)
             if calls.search(line)]
    assert found == [], found
