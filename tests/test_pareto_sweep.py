"""A multi-objective sweep of tiny models, end to end: architectures measured before the
trials, a constraint that leaves one untrained, the Pareto front handed over on the parent
run, in ``launch --json``, by ``detsweep best --pareto`` and in the registry; and a sweep no
trial of which meets its constraint."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from .conftest import foreign_lines, run_cli, run_here
from .tiny_sweeps import launch_json, results_of, tiny_sweep

HEADS = "model.head_conv_layers"


def by_hand(points: dict[str, tuple[float, float]], reference: tuple[float, float]) -> tuple[set[str], float]:
    """The front of (loss, latency) points, both less-is-better, and the area it dominates up to
    ``reference``: every point no other beats on both, then their staircase, slice by slice."""
    front = {name for name, (a, b) in points.items()
             if not any(x <= a and y <= b and (x, y) != (a, b) for x, y in points.values())}
    ordered = sorted(points[name] for name in front)  # by loss; latency falls along it
    area = 0.0
    for (loss, latency), after in zip(ordered, [*ordered[1:], (reference[0], None)]):
        area += (after[0] - loss) * (reference[1] - latency)
    return front, area


@pytest.fixture(scope="module")
def front_sweep(tmp_path_factory) -> tuple[Path, Path, object, dict]:
    """Three head depths ranked on the val loss and the served latency, the deepest breaking
    ``serve/params <= 6e6``: its folder, its file, the launch and ``launch --json``'s report."""
    tmp_path = tmp_path_factory.mktemp("front")
    sweep = tiny_sweep(tmp_path, f"""
  algorithm: grid
  num_samples: 1
  objectives:
    - {{metric: eval/loss, mode: min}}
    - {{metric: serve/latency_ms, mode: min, reference: 1000}}
  constraints: ["serve/params <= 6e6"]
  space:
    {HEADS}: {{grid: [0, 1, 4]}}
""", num_steps=20, every=10, name="front")
    result, report = launch_json(str(sweep), cwd=tmp_path)
    return tmp_path, sweep, result, report


def test_a_two_objective_sweep_hands_over_the_front_a_hand_computation_gives(front_sweep):
    """Three head depths, ranked on the val loss and the served latency, each architecture
    measured once before the trials (every report Tune hears of a trial, and its run at step 0,
    carry its cost); the deepest head breaks ``serve/params <= 6e6`` (7.3 M parameters): its
    trial is recorded with its cost and never trained. The front over the two trained
    trials and its hypervolume (up to the loss of the worst of them and the stated 1000 ms)
    are what a hand computation from their runs' logged metrics gives, on the parent run
    (``pareto.csv``, ``pareto.png``, ``pareto/hypervolume``), in ``launch --json``, and from
    MLflow alone (``best --pareto``); each front model is a registered version tagged with its
    place, and the champion is the best loss among the trials that met the constraint."""
    from mlflow import MlflowClient

    tmp_path, _, result, report = front_sweep
    assert result.returncode == 0, result.stderr[-3000:]
    trials = {t["trial_id"]: t for t in report["trials"]}
    deep = {t for t, trial in trials.items() if trial["config"][HEADS] == 4}
    assert len(trials) == 3 and len(deep) == 1
    assert {trials[t]["status"] for t in deep} == {"INFEASIBLE"}
    assert {trials[t]["infeasible"] for t in deep} == {"serve/params is 7.28282e+06, expected <= 6e+06"}
    assert {trials[t]["status"] for t in set(trials) - deep} == {"TERMINATED"}
    [t] = deep
    assert f"trial {t} not trained: {trials[t]['infeasible']} (search.constraints)" in result.stderr.splitlines()
    assert not foreign_lines(result.stderr), foreign_lines(result.stderr)  # only detsweep's own lines

    client = MlflowClient(report["mlflow"]["tracking_uri"])
    runs = {t: client.get_run(trial["mlflow_run_id"]) for t, trial in trials.items()}
    rows = results_of(Path(report["path"]))
    for t in deep:  # recorded with its cost, never trained: no training metric, no Ray Train run, one report
        assert runs[t].data.tags["detsweep.infeasible"] == trials[t]["infeasible"]
        assert runs[t].data.metrics["serve/params"] == 7282815
        assert not [k for k in runs[t].data.metrics if k.startswith(("train/", "eval"))], runs[t].data.metrics
        assert [row["step"] for row in rows[t]] == [0] and math.isnan(rows[t][0]["eval/loss"])
        assert trials[t]["checkpoint"] is None
    assert not list(Path(report["path"]).parent.glob("front-train-*"))

    trained = set(trials) - deep
    for t in trained:  # its architecture's cost, measured before the trials: at step 0 and on every Tune report
        cost = {k: v for k, v in runs[t].data.metrics.items() if k.startswith("serve/")}
        assert set(cost) == {"serve/latency_ms", "serve/size_mb", "serve/params"} and cost["serve/latency_ms"] > 0
        assert [m.step for m in client.get_metric_history(runs[t].info.run_id, "serve/params")] == [0]
        assert [row["step"] for row in rows[t]] == [10, 20]
        assert all({k: row[k] for k in cost} == pytest.approx(cost) for row in rows[t]), rows[t]
    assert sorted(runs[t].data.metrics["serve/params"] for t in trained) == [2562175, 3742335]

    # the hand computation, from what the trained trials' runs logged
    points = {t: (runs[t].data.metrics["eval/loss"], runs[t].data.metrics["serve/latency_ms"])
              for t in trained}
    worst_loss = max(loss for loss, _ in points.values())
    front, area = by_hand(points, (worst_loss, 1000.0))
    pareto = report["pareto"]
    assert {m["trial_id"] for m in pareto["trials"]} == front
    assert pareto["reference"] == {"eval/loss": worst_loss, "serve/latency_ms": 1000.0}
    assert pareto["hypervolume"] == pytest.approx(area, rel=1e-9)
    assert [m["place"] for m in pareto["trials"]] == [f"{i} of {len(front)}" for i in range(1, len(front) + 1)]
    assert pareto["candidates"] == 2

    parent = report["mlflow"]["parent_run_id"]
    assert client.get_run(parent).data.metrics["pareto/hypervolume"] == pytest.approx(area, rel=1e-9)
    artifacts = {a.path for a in client.list_artifacts(parent)}
    assert {"pareto.csv", "pareto.png"} <= artifacts
    csv_rows = Path(client.download_artifacts(parent, "pareto.csv", str(tmp_path))).read_text().splitlines()
    assert len(csv_rows) == 1 + 2 and sum(bool(line.split(",")[1]) for line in csv_rows[1:]) == len(front)
    assert Path(client.download_artifacts(parent, "pareto.png", str(tmp_path))).read_bytes()[:4] == b"\x89PNG"

    shown = run_here("best", "front", "--pareto", "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["pareto"] == pareto  # from MLflow alone, the same front

    # the registry: each front model a version tagged with its place; the champion the best loss
    versions = {v.tags["source_run_id"]: v for v in client.search_model_versions("name = 'front'")}
    placed = {v.tags["source_run_id"]: v.tags["pareto_place"] for v in versions.values() if "pareto_place" in v.tags}
    assert placed == {m["run_id"]: m["place"] for m in pareto["trials"]}
    best = min(points, key=lambda t: points[t][0])
    assert report["best"]["trial_id"] == best
    registered = report["mlflow"]["registered_model"]  # (the rerun's test may crown another since)
    champion = client.get_model_version("front", str(registered["version"]))
    assert champion.tags["source_run_id"] == trials[best]["mlflow_run_id"] and registered["champion"] == registered["version"]


T_95_1 = 6.313752  # Student's t, 95th percentile, 1 degree of freedom (a 90 % two-sided interval over 2 seeds)


def test_a_rerun_of_the_two_trained_configurations_over_two_seeds_says_whether_the_lead_is_real(front_sweep):
    """The sweep's two trained configurations (the third never trained) again, 10 steps each
    on seeds 1 and 2 (the sweep used 0), FIFO, as a sweep of its own: each objective's table
    holds the runs' final metrics, each lead is the paired t interval of their differences,
    the verdicts are said, each seed's front counted; the rerun and its source are tagged
    both ways; ``best`` ranks the source's trials alone, each with its rerun mean; and
    ``--register`` crowns the best mean loss, with the table as the version's description;
    resumed, the finished rerun ends with the same table."""
    from mlflow import MlflowClient

    from detsweep.tracking.sweep_run import RERUN_OF_TAG, RERUN_RANK_TAG, RERUN_TRIAL_TAG, RERUNS_TAG

    tmp_path, _, _, source = front_sweep
    result = run_cli("rerun", source["path"], "--top", "2", "--seeds", "2", "--set", "base.train.num_steps=10",
                     "--json", "--register", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    rerun = report["rerun"]
    trained = [t["trial_id"] for t in source["trials"] if t["status"] == "TERMINATED"]  # the source's order
    assert rerun["seeds"] == [1, 2] and len(report["trials"]) == 4
    assert {row["trial_id"] for row in rerun["rows"]} == set(trained)
    client = MlflowClient(report["mlflow"]["tracking_uri"])
    runs = [client.get_run(trial["mlflow_run_id"]) for trial in report["trials"]]
    for row in rerun["rows"]:  # the table's values are the runs' final metrics
        assert row["rank"] == trained.index(row["trial_id"]) + 1
        for seed, value in row["seeds"].items():
            [run] = [r for r in runs if r.data.tags[RERUN_TRIAL_TAG] == row["trial_id"] and r.data.params["train.seed"] == seed]
            assert run.data.metrics[row["objective"]] == pytest.approx(value) and run.info.status == "FINISHED"
            assert run.data.tags[RERUN_RANK_TAG] == str(row["rank"]) and int(run.data.params["train.num_steps"]) == 10
    for objective in ("eval/loss", "serve/latency_ms"):  # both less-is-better: the lead is the 2nd's excess
        leader, second = [row for row in rerun["rows"] if row["objective"] == objective]
        differences = [second["seeds"][seed] - leader["seeds"][seed] for seed in ("1", "2")]
        mean, half = sum(differences) / 2, T_95_1 * abs(differences[0] - differences[1]) / 2
        assert leader["lead"] is None and leader["mean"] <= second["mean"]
        assert (second["lead"], second["lead_low"], second["lead_high"]) == pytest.approx((mean, mean - half, mean + half))
    assert all(verdict in result.stderr for verdict in rerun["verdicts"]) and len(rerun["verdicts"]) == 2
    assert set(rerun["on_the_front"]) == set(trained) and sum(rerun["on_the_front"].values()) >= 2
    # linked both ways, the table on the rerun's parent run
    parent = report["mlflow"]["parent_run_id"]
    assert client.get_run(parent).data.tags[RERUN_OF_TAG] == source["mlflow"]["parent_run_id"]
    assert client.get_run(source["mlflow"]["parent_run_id"]).data.tags[RERUNS_TAG] == parent
    assert "rerun.csv" in {a.path for a in client.list_artifacts(parent)}
    loss_leader = next(row for row in rerun["rows"] if row["objective"] == "eval/loss" and row["lead"] is None)
    assert client.get_run(parent).data.metrics[f"rerun/eval/loss/rank_{loss_leader['rank']}/mean"] == pytest.approx(
        loss_leader["mean"])
    # best: the source's trials alone, ranked, each trained one with its rerun's mean
    shown = run_here("best", "front", "--json", cwd=tmp_path)
    ranked = json.loads(shown.stdout)["trials"]
    assert sorted(t["trial_id"] for t in ranked) == sorted(t["trial_id"] for t in source["trials"])
    means = {row["trial_id"]: row["mean"] for row in rerun["rows"] if row["objective"] == "eval/loss"}
    assert {t["trial_id"]: t["rerun"]["mean"] for t in ranked if t["rerun"]} == pytest.approx(means)
    assert "rerun: mean" in run_here("best", "front", cwd=tmp_path).stdout
    # registered by its mean: the champion, whatever the single-run champion scored
    champion = client.get_model_version_by_alias("front", "champion")
    assert int(champion.version) == report["mlflow"]["registered_model"]["version"]
    assert champion.tags["rerun_of_trial"] == loss_leader["trial_id"] and champion.tags["rerun_seeds"] == "1,2"
    assert float(champion.tags["score"]) == pytest.approx(loss_leader["mean"])
    assert rerun["verdicts"][0] in champion.description
    # a rerun is a sweep like any: resumed from its folder, it ends with the same table
    resumed = run_cli("resume", report["path"], "--no-register", "--json", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["rerun"]["rows"] == rerun["rows"]


def test_a_constraint_no_architecture_meets_is_one_line_before_ray_starts(tmp_path):
    """The driver measures every architecture the space holds before Ray starts: when none meets
    the constraints, no trial could train, and the launch ends there, in one line. (One
    architecture, each of two learning rates: a second would only be measured too.)"""
    sweep = tiny_sweep(tmp_path, """
  algorithm: grid
  num_samples: 1
  constraints: ["serve/params <= 1000"]
  space:
    model.head_conv_layers: {grid: [0]}
    optimizer.learning_rate.learning_rate_base: {grid: [0.01, 0.02]}
""", name="nothing-fits")
    result = run_cli("launch", str(sweep), cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"detsweep: error: {sweep}: search.constraints: found the space's one architecture not meeting them "
        "(serve/params is 2.56218e+06, expected <= 1000), expected at least one: no trial could train")
    assert "Traceback" not in result.stderr and not (tmp_path / "ray").exists()


def test_of_several_architectures_none_meeting_the_constraints_the_first_is_named():
    from detsweep.evaluation.objectives import Constraint
    from detsweep.sweeps.serving import none_meet

    bounds = [Constraint("serve/params", "<=", 1000), Constraint("serve/latency_ms", "<=", 5)]
    costs = [{"serve/params": 2e6, "serve/latency_ms": 4.0}, {"serve/params": 3e6, "serve/latency_ms": 9.0}]
    assert none_meet(bounds, costs) == ("found none of the space's 2 architectures meeting them (the first: "
                                        "serve/params is 2e+06, expected <= 1000), expected at least one: no trial "
                                        "could train")


def test_a_sweep_whose_trials_all_broke_the_constraints_ends_in_one_line(capsys):
    """Trials drawn at random may all land on architectures that break the constraints though
    others meet them: the sweep's end says so, exit code 1 (``sweep_summary``, what ``launch``
    prints)."""
    import io

    from detsweep.sweeps.commands import sweep_summary

    trials = [{"trial_id": f"t{i}", "status": "INFEASIBLE", "metrics": {"step": 0}, "config": {HEADS: 4},
               "infeasible": "serve/params is 7.28282e+06, expected <= 6e+06"} for i in range(2)]
    report = {"trials": trials, "best": None, "metric": "eval/loss", "path": "/nowhere",
              "cost": {"cost/cpu_hours": 0.0, "cost/gpu_hours": 0.0}}
    assert sweep_summary(report, False, io.StringIO()) == 1
    assert capsys.readouterr().err == ("detsweep: no trial met search.constraints, so none was trained: serve/params is "
                              "7.28282e+06, expected <= 6e+06\n")
