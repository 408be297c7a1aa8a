"""Sweep files: what validates, what fails before anything starts, and how many trials a grid makes."""

import ipaddress
import json
import re
import shlex
import sys

import pytest

from detsweep.errors import DetsweepError
from detsweep.preflight.capacity import Capacity, NodeType, this_machine
from detsweep.sweeps import load_sweep
from detsweep.sweeps.launch import validation_report

from .conftest import REPO, run_bounded, run_cli, run_here, side_by_side, without_the_unread_preset
from .test_cluster_sweeps import coco_in_bucket

SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))
CLUSTER_FILE = REPO / "ray_cluster.yaml"
BASE = "base: {from: %s}\n" % (REPO / "configs" / "quickstart.yaml")


def sweep_file(write, search: str, name: str = "s") -> str:
    return str(write("sweep.yaml", f"name: {name}\n{BASE}search:\n{search}"))


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_shipped_sweep_validates(path, s3, tmp_path):
    """Each against what it is meant for: coco_gpu.yaml against the cluster file's node types
    (where a misfit or missing data is an error, not a note), with its data on the tests' S3
    server where the file names it (never AWS's); the others against this machine."""
    on_the_cluster = path.name == "coco_gpu.yaml"
    if on_the_cluster:
        coco_in_bucket(s3, tmp_path)
    cluster = ["--cluster-config", str(CLUSTER_FILE)] if on_the_cluster else []
    result = run_here("validate", str(path), *cluster, "--json", env=s3.env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["trials"] >= 1 and len(report["samples"]) == min(5, report["trials"])
    # it fits, and its data is there: nothing left unchecked (but the COCO preset's download)
    assert (without_the_unread_preset(report["notes"]) if on_the_cluster else report["notes"]) == []
    if on_the_cluster:
        assert report["sized_against"] == CLUSTER_FILE.name
        assert report["trials_at_once"] == trials_the_cluster_file_holds(load_sweep(path)) > 0
    else:
        assert report["sized_against"] == "this machine"


def trials_the_cluster_file_holds(sweep) -> int:
    """By hand, from ray_cluster.yaml: how many of ``sweep``'s trials its GPU nodes hold at
    once (the 0-CPU head holds none), each node as many workers as its GPUs and CPUs allow."""
    import yaml

    cluster = yaml.safe_load(CLUSTER_FILE.read_text())
    node = cluster["available_node_types"]["gpu_worker"]
    nodes = min(node["max_workers"], cluster["max_workers"])
    scaling = sweep.base.scaling
    per_node = min(node["resources"]["GPU"] // scaling.gpus_per_worker, node["resources"]["CPU"] // scaling.cpus_per_worker)
    return int(nodes * per_node // scaling.num_workers)


def test_grid_trial_count_collapses_parameters_a_choice_does_not_use(write):
    path = sweep_file(write, """
  algorithm: grid
  num_samples: 1
  space:
    optimizer.type: {grid: [adam, momentum]}
    optimizer.momentum_optimizer_value: {grid: [0.9, 0.99]}
    optimizer.learning_rate.learning_rate_base: {grid: [0.01, 0.02, 0.04]}
""")
    report = validation_report(load_sweep(path), this_machine())
    # adam ignores momentum: 1 x 3 + 2 x 3 = 9 trials, not 2 x 2 x 3 = 12.
    assert report["grid_points"] == 9 and report["trials"] == 9


def test_set_reaches_the_sweep_and_its_base(write):
    path = sweep_file(write, "  num_samples: 3\n")
    sweep = load_sweep(path, ["search.num_samples=2", "base.train.num_steps=40"])
    assert sweep.search.num_samples == 2 and sweep.base.train.num_steps == 40


def test_set_reaches_space_entries_whose_keys_are_dotted_paths(write):
    path = sweep_file(write, "  space:\n    optimizer.learning_rate.learning_rate_base: {distribution: uniform, min: 0.01, max: 0.02}\n")
    sweep = load_sweep(path, ["search.space.optimizer.learning_rate.learning_rate_base.max=0.05",
                              "search.space.optimizer.moving_average_decay.values=[0.99, 0.999]",
                              "search.space.optimizer.type={values: [adam, momentum]}"])
    space = sweep.search.space
    assert (space["optimizer.learning_rate.learning_rate_base"].min, space["optimizer.learning_rate.learning_rate_base"].max) == (0.01, 0.05)
    assert space["optimizer.moving_average_decay"].values == [0.99, 0.999]
    assert space["optimizer.type"].values == ["adam", "momentum"]


def test_the_scheduler_is_the_ray_tune_object_the_file_describes(write):
    from ray.tune.schedulers import PopulationBasedTraining

    from detsweep.sweeps.tuner import scheduler

    path = sweep_file(write, """
  scheduler:
    type: pbt
    perturbation_interval: 7
    quantile_fraction: 0.5
    synch: true
    mutations:
      optimizer.moving_average_decay: {values: [0.99, 0.999]}
""")
    pbt = scheduler(load_sweep(path))
    assert isinstance(pbt, PopulationBasedTraining)
    assert (pbt._synch, pbt._perturbation_interval, pbt._quantile_fraction, pbt._time_attr) == (True, 7, 0.5, "step")
    assert pbt._hyperparam_mutations == {"trial": {"optimizer": {"moving_average_decay": [0.99, 0.999]}}}


@pytest.mark.parametrize("search, expected", [
    ("  space:\n    optimizer.lerning_rate.learning_rate_base: {values: [0.1]}\n",
     "'lerning_rate' is not a field of the trial config, expected one of "),
    ("  space:\n    optimizer.lerning_rate.learning_rate_base: {values: [0.1]}\n", "(did you mean 'learning_rate'?)"),
    ("  space:\n    optimizer.type.name: {values: [adam]}\n", "search.space.optimizer.type.name: optimizer.type has no fields below it"),
    ("  space:\n    optimizer.learning_rate.learning_rate_base: {distribution: uniform, min: 0.2, max: 0.1}\n",
     "min: found 0.2, expected <= max (0.1)"),
    ("  space:\n    optimizer.learning_rate.learning_rate_base: {distribution: log_uniform_values, min: 0, max: 0.1}\n",
     "min: found 0.0, expected > 0"),
    ("  algorithm: bayes\n", "search.algorithm: found 'bayes', expected one of random, grid, optuna"),
    ("  scheduler: {type: hyperband}\n",
     "search.algorithm: found 'random', expected algorithm bohb with scheduler hyperband: BOHB decides with HyperBand's"),
    ("  algorithm: bohb\n", "search.scheduler.type: found 'fifo', expected algorithm bohb with scheduler hyperband"),
    ("  algorithm: bohb\n  scheduler: {type: hyperband}\n  space:\n    optimizer.type: {grid: [adam, sgd]}\n",
     "search.algorithm: found 'bohb', expected random or grid when the space has grid parameters"),
    ("  algorithm: bohb\n  scheduler: {type: hyperband}\n  space:\n    optimizer.moving_average_decay: "
     "{distribution: normal, mu: 0.99, sigma: 0.001}\n",
     "search.space.optimizer.moving_average_decay.distribution: found 'normal', expected a bounded distribution with "
     "algorithm bohb"),
    ("  algorithm: optuna\n  space:\n    optimizer.moving_average_decay: {distribution: normal, mu: 0.99, sigma: 0.001}\n",
     "search.space.optimizer.moving_average_decay.distribution: found 'normal', expected a bounded distribution with "
     "algorithm optuna"),
    ("  algorithm: optuna\n  space:\n    optimizer.type: {grid: [adam, sgd]}\n",
     "search.algorithm: found 'optuna', expected random or grid when the space has grid parameters"),
    ("  space:\n    optimizer.type: {values: [adam, lbfgs]}\n", "the value 'lbfgs' makes the trial invalid"),
    ("  space:\n    optimizer.moving_average_decay: {values: [0.99, 1.5]}\n", "the value 1.5 makes the trial invalid"),
    ("  space:\n    optimizer.learning_rate.learning_rate_base: {grid: [0.01, 0.02]}\n  scheduler:\n    type: pbt\n"
     "    mutations:\n      optimizer.learning_rate.learning_rate_base: {values: [0.01, 0.02]}\n",
     "search.space.optimizer.learning_rate.learning_rate_base: found 'a grid', expected values or a distribution"),
    ("  space:\n    optimizer.learning_rate.learning_rate_base: {distribution: uniform, min: 0.0001, max: 0.1}\n",
     "the value 0.0001 makes the trial invalid: optimizer.learning_rate.warmup_learning_rate: found 0.004"),
])
def test_bad_sweep_files_fail_in_one_line(write, search, expected):
    path = sweep_file(write, search)
    with pytest.raises(DetsweepError) as caught:
        load_sweep(path)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


MUTATIONS = "    mutations: {optimizer.moving_average_decay: {values: [0.99, 0.999]}}\n"


@pytest.mark.parametrize("search, overrides, expected", [
    ("  metric: eval/APP\n", [],
     "search.metric: found 'eval/APP', expected a metric training reports: train/loss, train/box_loss, "),
    ("  metric: eval/APP\n", [], "eval_ema/classification_loss, eval/AP_best (did you mean 'eval/AP'?)"),
    ("  metric: eval_ema/AP\n", ["base.optimizer.use_moving_average=false"], "search.metric: found 'eval_ema/AP'"),
    ("  scheduler: {type: asha, grace_period: 100}\n", ["base.train.num_steps=40"],
     "search.scheduler.grace_period: found 100, expected fewer steps than base.train.num_steps (40): ASHA could never stop a trial"),
    ("  scheduler: {type: asha, grace_period: 100, max_t: 80}\n", [],
     "search.scheduler.grace_period: found 100, expected fewer steps than search.scheduler.max_t (80)"),
    ("  scheduler: {type: asha, grace_period: 100}\n", ["base.train.eval_every=0"],
     "base.train.eval_every: found 0, expected a report of eval/AP_best between ASHA's first rung (step 100) and "
     "base.train.num_steps (600), or the scheduler can never act"),
    ("  scheduler: {type: asha, grace_period: 100}\n", ["base.train.eval_every=600", "base.train.checkpoint_every=600"],
     "base.train.eval_every: found 600, expected a report of eval/AP_best between ASHA's first rung (step 100)"),
    ("  metric: train/loss\n  mode: min\n  scheduler: {type: asha, grace_period: 100}\n",
     ["base.train.steps_per_loop=600", "base.train.eval_every=600", "base.train.checkpoint_every=600"],
     "base.train.steps_per_loop: found 600, expected a report of train/loss between ASHA's first rung (step 100)"),
    ("  scheduler:\n    type: pbt\n    perturbation_interval: 600\n" + MUTATIONS, [],
     "search.scheduler.perturbation_interval: found 600, expected fewer steps than base.train.num_steps (600): "
     "PBT would never perturb"),
    ("  algorithm: optuna\n  scheduler:\n    type: pbt\n" + MUTATIONS, [],
     "search.algorithm: found 'optuna', expected random or grid with scheduler pbt"),
    ("  scheduler: {type: pbt, perturbation_interval: 100}\n", [],
     "search.scheduler.mutations: found nothing, expected the paths PBT mutates"),
    ("  scheduler:\n    type: pbt\n    perturbation_interval: 100\n    mutations: {model.head_conv_layers: {values: [0, 1]}}\n",
     [], "search.scheduler.mutations.model.head_conv_layers: found 'a field of the architecture', expected "
     "training settings only (PBT copies a donor's checkpoint, which fits only its own network)"),
    ("  scheduler:\n    type: pbt\n    perturbation_interval: 100\n" + MUTATIONS, ["base.train.checkpoint_every=0"],
     "base.train.checkpoint_every: found 0, expected checkpoints for PBT to copy"),
    ("  scheduler:\n    type: pbt\n    perturbation_interval: 100\n" + MUTATIONS,
     ["base.train.eval_every=600", "base.train.checkpoint_every=600"],
     "base.train.eval_every: found 600, expected a report of eval/AP_best between PBT's first perturbation (step 100)"),
    ("  algorithm: bohb\n  scheduler: {type: hyperband}\n", ["base.train.checkpoint_every=600"],
     "base.train.checkpoint_every: found 600, expected 200 (as base.train.eval_every): HyperBand pauses trials where "
     "they report eval/AP_best and resumes them from a checkpoint there"),
    ("  algorithm: bohb\n  scheduler: {type: hyperband}\n", ["base.train.eval_every=0", "base.train.checkpoint_every=0"],
     "base.train.eval_every: found 0, expected reports of eval/AP_best before base.train.num_steps (600): HyperBand "
     "ranks trials at them"),
    ("  algorithm: bohb\n  scheduler: {type: hyperband, max_t: 800}\n", [],
     "search.scheduler.max_t: found 800, expected at most base.train.num_steps (600)"),
    ("  algorithm: bohb\n  scheduler: {type: hyperband, metric: train/loss, mode: min}\n", [],
     "search.scheduler.metric: found 'train/loss' (reported every 20 steps), expected a metric reported with "
     "search.metric 'eval/AP_best' (every 200): HyperBand ranks trials where Tune hears them"),
    ("  algorithm: optuna\n  scheduler: {type: halving}\n", [],
     "search.algorithm: found 'optuna', expected random or grid with scheduler halving"),
    # 450 steps are fewer than 600, but its rung is the report at step 600, the trials' last
    ("  scheduler: {type: halving, grace_period: 450}\n", [],
     "search.scheduler.grace_period: found 450, expected a first rung (the report of eval/AP_best at step 600) before "
     "the trials' last report (step 600): halving would rank no trial before its end"),
    ("  scheduler: {type: halving, grace_period: 200, reduction_factor: 1.5}\n", [],
     "search.scheduler.reduction_factor: found 1.5, expected at least 2: the rung after step 200 must fall on a later "
     "report of eval/AP_best (every 200 steps)"),
    ("  scheduler: {type: halving, grace_period: 200}\n", ["base.train.eval_every=0", "base.train.checkpoint_every=0"],
     "base.train.eval_every: found 0, expected reports of eval/AP_best before base.train.num_steps (600): halving "
     "ranks trials at them"),
    ("  scheduler: {type: halving, grace_period: 200}\n", ["base.train.checkpoint_every=600"],
     "base.train.checkpoint_every: found 600, expected 200 (as base.train.eval_every): halving pauses trials where "
     "they report eval/AP_best"),
    ("  scheduler: {type: asha, grace_period: 100, metric: eval/los, mode: min}\n", [],
     "search.scheduler.metric: found 'eval/los', expected a metric training reports: "),
    ("  scheduler: {type: asha, grace_period: 100, metric: train/loss}\n", [],
     "search.scheduler.mode: found None, expected scheduler.metric and scheduler.mode together"),
    ("  scheduler: {metric: train/loss, mode: min}\n", [],
     "search.scheduler.metric: found 'train/loss', expected nothing with scheduler fifo (it stops no trial)"),
    # multi-objective sweeps: what they rank on must be reported, constraints known before training
    ("  objectives: [{metric: eval/AP_best, mode: max}, {metric: serve/latncy_ms, mode: min}]\n", [],
     "search.objectives[1].metric: found 'serve/latncy_ms', expected a metric training reports or a serving cost: "),
    ("  objectives: [{metric: eval/AP_best, mode: max}, {metric: eval/AP_tiny, mode: max}]\n", [],
     "search.objectives[1].metric: found 'eval/AP_tiny', expected a metric training reports or a serving cost: "),
    ("  constraints: ['serve/latncy_ms <= 20']\n", [],
     "search.constraints[0]: found 'serve/latncy_ms', expected a serving cost, known before training: serve/latency_ms, "
     "serve/size_mb, serve/params, serve/int8_latency_ms, serve/int8_size_mb (did you mean 'serve/latency_ms'?)"),
    ("  constraints: ['eval/AP_best >= 0.2']\n", [],
     "search.constraints[0]: found 'eval/AP_best', expected a serving cost, known before training"),
    ("  constraints: ['serve/latency_ms at most 20']\n", [],
     "search.constraints[0]: found 'serve/latency_ms at most 20', expected METRIC OP NUMBER with OP one of <=, <, >=, >"),
    ("  objectives: [{metric: eval/AP_best, mode: max}, {metric: serve/latency_ms, mode: min}]\n"
     "  scheduler: {type: pbt, perturbation_interval: 200, mutations: {optimizer.moving_average_decay: {values: [0.9]}}}\n",
     [], "search.scheduler.type: found 'pbt', expected fifo or asha with objectives (asha ranks each rung by "
         "non-dominated sort; pbt ranks one metric)"),
    ("  objectives: [{metric: eval/AP_best, mode: max}, {metric: serve/latency_ms, mode: min}]\n"
     "  scheduler: {type: asha, metric: eval/loss, mode: min}\n", [],
     "search.scheduler.metric: found 'eval/loss', expected nothing with objectives"),
    ("  metric: eval/AP50\n  objectives: [{metric: eval/AP_best, mode: max}, {metric: serve/latency_ms, mode: min}]\n",
     [], "search.metric: found 'eval/AP50', expected one of the objectives with its mode"),
    ("  objectives: [{metric: eval/AP_best, mode: max}]\n", [],
     "search.objectives: found ['eval/AP_best'], expected two or more different metrics"),
    # the cadence that matters is the scheduler's metric's: train/loss at every loop, not AP at every evaluation
    ("  scheduler: {type: asha, grace_period: 100, metric: train/loss, mode: min}\n",
     ["base.train.steps_per_loop=600", "base.train.eval_every=600", "base.train.checkpoint_every=600"],
     "base.train.steps_per_loop: found 600, expected a report of train/loss between ASHA's first rung (step 100)"),
])
def test_a_metric_or_scheduler_that_cannot_work_fails_in_one_line_before_anything_runs(write, search, overrides, expected):
    path = sweep_file(write, search)
    with pytest.raises(DetsweepError) as caught:
        load_sweep(path, overrides)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_schedulers_that_can_act_are_accepted(write):
    asha = load_sweep(sweep_file(write, "  scheduler: {type: asha, grace_period: 100}\n"), ["base.train.num_steps=300"])
    pbt = load_sweep(sweep_file(write, "  scheduler:\n    type: pbt\n    perturbation_interval: 200\n" + MUTATIONS))
    loss = load_sweep(sweep_file(write, "  metric: train/loss\n  mode: min\n  scheduler: {type: asha, grace_period: 20}\n"))
    assert (asha.search.scheduler.type, pbt.search.scheduler.type, loss.search.metric) == ("asha", "pbt", "train/loss")


def test_halving_builds_one_bracket_of_every_trial_with_its_rungs_at_reports_of_the_objective(write):
    """The demo's recording in numbers: 300 steps evaluated every 20 (15 reports), a first rung
    at step 40 (2 reports) and a factor of 3: rungs at 2, 6 and 15 reports, one bracket holding
    all 16 trials, drawn by a generator that the scheduler paces (2 at once)."""
    from detsweep.sweeps.rungs import PacedVariants, Rungs
    from detsweep.sweeps.tuner import search_and_scheduler

    path = sweep_file(write, "  num_samples: 16\n  scheduler: {type: halving, grace_period: 40, reduction_factor: 3}\n")
    sweep = load_sweep(path, ["base.train.num_steps=300", "base.train.eval_every=20", "base.train.checkpoint_every=20"])
    draws, halving = search_and_scheduler(sweep, 2)
    assert isinstance(halving, Rungs) and (halving.max_t, halving.every, halving.whole_sweep) == (15, 20, True)
    assert halving.plan(0) == (16, [2, 6, 15])
    assert isinstance(draws, PacedVariants) and (draws.scheduler, draws.pace) == (halving, 2)


def test_bohb_with_hyperband_builds_tunes_objects_and_is_refused_in_one_line_where_it_is_not_installed(write):
    """``detsweep[bohb]`` is an extra: a machine without it (here hpbandster hidden from the
    import system) is told so by ``validate``, exit 2, before anything starts."""
    from ray.tune.search.bohb import TuneBOHB

    from detsweep.sweeps.rungs import Rungs
    from detsweep.sweeps.tuner import search_and_scheduler

    path = sweep_file(write, "  algorithm: bohb\n  seed: 3\n  scheduler: {type: hyperband, reduction_factor: 4}\n")
    sweep = load_sweep(path)
    bohb, hyperband = search_and_scheduler(sweep, 2)
    assert isinstance(bohb, TuneBOHB) and (bohb._max_concurrent, bohb._seed) == (2, 3)
    # time in reports of the metric: 600 steps, evaluated every 200; BOHB hears its pauses
    assert isinstance(hyperband, Rungs) and (hyperband.max_t, hyperband.eta, hyperband.max_concurrent, hyperband.every,
                                             hyperband.bohb, hyperband.whole_sweep) == (3, 4, 2, 200, bohb, False)
    hidden = ("import sys; sys.modules['hpbandster'] = None; from detsweep.cli import main; "
              f"sys.exit(main(['validate', {path!r}]))")
    result = run_bounded([sys.executable, "-c", hidden], timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"detsweep: error: {path}: search.algorithm: found 'bohb', expected it installed: hpbandster missing "
        "(pip install 'detsweep[bohb]')"), result.stderr


def test_launch_with_a_misspelt_metric_exits_2_before_ray_or_mlflow_start(tmp_path):
    result = run_cli("launch", str(REPO / "sweeps" / "quickstart.yaml"), "--set", "search.metric=eval/APP",
                     "--set", f"storage={tmp_path / 'ray'}", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"detsweep: error: {REPO / 'sweeps' / 'quickstart.yaml'}: search.metric: found 'eval/APP', "
                           "expected a metric training reports: train/loss, ")
    assert line.endswith("(did you mean 'eval/AP'?)")
    assert not (tmp_path / "ray").exists() and not (tmp_path / "mlflow.db").exists()


def test_resources_no_node_can_satisfy(write):
    path = sweep_file(write, "  num_samples: 1\n")
    sweep = load_sweep(path, ["base.scaling.cpus_per_worker=64"])
    two_cpus = Capacity((NodeType("node", {"CPU": 2.0}, 1),), "this machine")
    with pytest.raises(DetsweepError, match=r"base.scaling.cpus_per_worker: found 64, expected <= 2"):
        validation_report(sweep, two_cpus)
    assert validation_report(sweep, two_cpus, strict=False)["notes"]  # a dry run only notes it


def test_validate_command_exits_2_on_a_bad_file(write):
    path = sweep_file(write, "  num_samples: 0\n")
    result = run_cli("validate", path)
    assert result.returncode == 2 and "search.num_samples: found 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_ray_cluster_file_is_a_valid_launcher_config_that_keeps_ports_private():
    import yaml
    from ray.autoscaler._private.util import prepare_config, validate_config

    from detsweep.adapters.ray import HIDE_GPUS_ON_ZERO

    config = yaml.safe_load(CLUSTER_FILE.read_text())
    validate_config(prepare_config(config))  # what `ray up` checks, with its defaults filled in
    assert config["provider"]["type"] == "aws"
    # From outside the security group: SSH alone, from one network's range. Its members reach
    # each other on every port (Ray adds that rule), so Ray's and MLflow's ports stay inside.
    [rule] = config["provider"]["security_group"]["IpPermissions"]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 22, 22)
    assert set(rule) == {"IpProtocol", "FromPort", "ToPort", "IpRanges"}  # no IPv6 range, prefix list or group
    [allowed] = [ipaddress.ip_network(r["CidrIp"]) for r in rule["IpRanges"]]
    assert allowed.prefixlen >= 16, allowed  # an office's or a VPN's range, not the internet
    # the containers share their node's network and publish no port past the group
    docker = [word for option in config["docker"]["run_options"] + config["docker"]["worker_run_options"]
              for word in shlex.split(option)]
    assert not [word for word in docker if word in ("-P", "--publish-all") or word.startswith(("-p", "--publish"))]
    # `ray start` on each node, as Ray reads its options: the dashboard (and the Jobs API behind
    # it) on the head's loopback only, reached through `ray dashboard`'s SSH tunnel; token
    # authentication for every Ray connection, in the raylets' and the containers' environment
    head, head_env = ray_start(config["head_start_ray_commands"])
    worker, worker_env = ray_start(config["worker_start_ray_commands"])
    assert head["head"] and not worker["head"]
    assert ipaddress.ip_address(head["dashboard_host"]).is_loopback, head["dashboard_host"]
    assert head_env["RAY_AUTH_MODE"] == worker_env["RAY_AUTH_MODE"] == "token"
    # a process that asked for no GPU sees none on every node, whoever started it (test_gpu_resources.py)
    assert head_env[HIDE_GPUS_ON_ZERO] == worker_env[HIDE_GPUS_ON_ZERO] == "1"
    assert ["--env", "RAY_AUTH_MODE=token"] in [shlex.split(option) for option in config["docker"]["run_options"]]
    head = " ".join(config["head_start_ray_commands"])
    # MLflow behind basic auth over HTTPS, started by the repository's script (tests/mlflow_checks.py
    # runs these very command lines), its certificate made on the head, its head secret in Secrets Manager
    authority = "/home/ray/detsweep/cluster/tls/ca.crt"
    assert config["head_setup_commands"] == [f"python -m detsweep.tracking.server tls /home/ray/mlflow {authority}"]
    server = ("/home/ray/detsweep/cluster/mlflow_server.sh {} /home/ray/mlflow {}5000 "
              f"--head-secret secretsmanager:detsweep/mlflow-head --tls {authority}")
    assert server.format("start", "/home/ray/.detsweep/mlflow.env ") in head
    assert 'exec python -m detsweep.tracking.server "$@"' in (REPO / "cluster" / "mlflow_server.sh").read_text()
    # and, hourly, mlflow gc with the same head secret: deleted checkpoints' files go
    assert server.format("gc", "") in head
    # the one MLflow secret every node gets is detsweep's user; the workers' instance profile is not the head's
    assert config["file_mounts"]["/home/ray/.detsweep/mlflow.env"] == "~/.detsweep/mlflow.env"
    assert len([path for path in config["file_mounts"].values() if "detsweep/" in path]) == 1
    assert config["available_node_types"]["gpu_worker"]["node_config"]["IamInstanceProfile"] == {"Name": "detsweep-worker"}
    for commands, uri in ((config["head_start_ray_commands"], "https://$(hostname -I | cut -d' ' -f1):5000"),
                          (config["worker_start_ray_commands"], "https://$RAY_HEAD_IP:5000")):
        [starts_ray] = [c for c in commands if "ray start" in c]
        assert f"export MLFLOW_TRACKING_URI={uri} MLFLOW_TRACKING_SERVER_CERT_PATH={authority}" in starts_ray
        assert "python -m detsweep.tracking.credentials /home/ray/.detsweep/mlflow.env -- ray start" in starts_ray
    assert config["available_node_types"]["head"]["resources"] == {"CPU": 0}  # training never on the head
    # what a g5.2xlarge holds, declared so that a sweep is sized before `ray up`
    assert config["available_node_types"]["gpu_worker"]["resources"] == {"CPU": 8, "GPU": 1}
    # a setup that fails fails the node: nothing swallows an error, and an apt install (if any)
    # comes after apt's lists were updated, by an earlier command or its own
    setup = config["setup_commands"]
    assert not any("||" in command for command in setup)
    for at, command in enumerate(setup):
        if "apt-get install" in command:
            assert any("apt-get update" in earlier for earlier in setup[:at + 1]), command
    assert "~/.ray/auth_token" in config["file_mounts"].values()


def ray_start(commands: list[str]) -> tuple[dict, dict[str, str]]:
    """The options of the ``ray start`` among a node's start ``commands``, as Ray's own command
    line parses them, and the variables set before it in the same command (Ray runs each
    command in a shell of its own, so only those reach it)."""
    from ray.scripts.scripts import start

    found = []
    for command in commands:
        env: dict[str, str] = {}
        for words in simple_commands(command):
            assigns = words[1:] if words[:1] == ["export"] else words  # `export A=1` or `A=1 ray start`
            env.update(word.split("=", 1) for word in assigns if re.fullmatch(r"[A-Za-z_]\w*=.*", word))
            at = next((i for i in range(len(words) - 1) if words[i:i + 2] == ["ray", "start"]), None)
            if at is not None:
                found.append((start.make_context("ray start", words[at + 2:]).params, env))
    [options] = found
    return options


def simple_commands(command: str) -> list[list[str]]:
    """A shell command line's commands (split at ``;``), each as its words. (A command
    substitution, ``$(…)``, comes out in pieces: only ``NAME=value`` words and ``ray start``'s
    own are read.)"""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for word in lexer:
        if word == ";":
            commands.append([])
        else:
            commands[-1].append(word)
    return [words for words in commands if words]


def test_a_gpu_worker_node_installs_tensorflows_cuda_libraries_and_fails_its_start_where_tensorflow_sees_no_gpu():
    """The GPU node type's own setup, run here with no GPU visible: the install is the lock's
    GPU view (this TensorFlow, its CUDA libraries), and the check exits 1 with one line saying what
    TensorFlow saw; a failing setup command fails the node."""
    import os
    from importlib.metadata import version
    from pathlib import Path

    import yaml

    node_type = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())["available_node_types"]["gpu_worker"]
    install, check = node_type["worker_setup_commands"]
    assert install == "pip install --quiet --no-deps -r /home/ray/detsweep/cluster/requirements-gpu.txt"
    pins = (REPO / "cluster" / "requirements-gpu.txt").read_text()
    assert f"\ntensorflow=={version('tensorflow')} " in pins and "\nnvidia-cudnn-cu12==" in pins
    # no GPU visible, as on a GPU node whose TensorFlow sees none: so on a machine with GPUs too
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": ""}
    checked = run_bounded(["bash", "-c", check], env=env, timeout=120, cwd=REPO)
    said = [line for line in checked.stderr.splitlines() if line.startswith("detsweep:")]
    assert checked.returncode == 1 and len(said) == 1, checked.stderr[-2000:]
    assert said[0].startswith(f"detsweep: node check: a GPU node, but TensorFlow on {os.uname().nodename} sees no GPU "
                              "(it sees CPU:0; "), said
    assert not any("||" in command for command in node_type["worker_setup_commands"])


def test_a_cluster_address_where_nothing_answers_is_one_line_before_any_data_is_read(tmp_path):
    from .mlflow_checks import free_port

    nobody = f"127.0.0.1:{free_port()}"
    *to_nobody, to_head = side_by_side([
        lambda: run_cli("train", str(REPO / "configs" / "quickstart.yaml"), "--address", nobody, cwd=tmp_path, timeout=60),
        lambda: run_cli("launch", str(REPO / "sweeps" / "quickstart.yaml"), "--address", nobody, cwd=tmp_path, timeout=60),
        lambda: run_cli("launch", str(REPO / "sweeps" / "quickstart.yaml"), "--address", "head", cwd=tmp_path, timeout=60)])
    for result in to_nobody:
        assert (result.returncode, result.stderr) == (2, f"detsweep: error: --address {nobody}: no Ray cluster answers "
                                                         "there (Connection refused)\n"), result.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists()
    assert to_head.stderr == "detsweep: error: --address: found 'head', expected HOST:PORT, ray://HOST:PORT or auto\n"


def test_a_usage_mistake_is_one_line_naming_the_command_and_its_help():
    result = run_cli("export", "--from", "/nope", "--format", "onnx", "--out", "x", timeout=60)
    assert result.returncode == 2 and result.stderr == (
        "detsweep export: error: argument --format: invalid choice: 'onnx' (choose from 'saved_model', 'tflite', 'tflite-fp16', 'tflite-int8') "
        "(see detsweep export --help)\n")


def test_a_results_folder_this_machine_cannot_make_is_one_line_before_anything_starts(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    sweep = REPO / "sweeps" / "quickstart.yaml"
    launched, result = side_by_side([
        lambda: run_cli("launch", str(sweep), "--set", f"storage={a_file / 'ray'}", cwd=tmp_path, timeout=60),
        lambda: run_cli("train", str(REPO / "configs" / "quickstart.yaml"), "--storage", "/proc/detsweep", cwd=tmp_path,
                        timeout=60)])
    assert (launched.returncode, launched.stderr) == (2, f"detsweep: error: {sweep}: storage: found '{a_file / 'ray'}', "
                                                         f"expected a folder this machine can write (cannot make a folder "
                                                         f"in {a_file}: Not a directory)\n")
    assert result.returncode == 2 and result.stderr.startswith("detsweep: error: --storage: found '/proc/detsweep', "
                                                               "expected a folder this machine can write")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]  # no MLflow, no log, nothing


@pytest.mark.parametrize("asks", ["serving_cost: true", "constraints: ['serve/latency_ms <= 20']",
                                  "objectives: [{metric: eval/AP_best, mode: max}, {metric: serve/size_mb, mode: min}]"])
def test_serving_cost_refuses_a_distribution_over_an_architecture_field(write, asks):
    """It measures every architecture the space holds before the trials start: a finite set.
    A constraint or an objective on a serving cost measures them too."""
    path = sweep_file(write, f"  {asks}\n  space:\n"
                             "    model.image_size: {distribution: q_uniform, min: 64, max: 256, q: 32}\n")
    with pytest.raises(DetsweepError) as caught:
        load_sweep(path)
    assert str(caught.value) == (f"{path}: search.space.model.image_size: found a distribution, expected values or a "
                                 "grid (the serving cost of each architecture the space holds is measured before the "
                                 "trials start)")
    path = sweep_file(write, "  serving_cost: true\n  space:\n    model.image_size: {values: [64, 128]}\n"
                             "    optimizer.learning_rate.learning_rate_base: {distribution: uniform, min: 0.01, max: 0.1}\n")
    from detsweep.sweeps.serving import architectures

    assert [config.model.image_size for config in architectures(load_sweep(path))] == [64, 128]


def test_validate_counts_the_grid_points_that_cannot_train_and_says_why_one_cannot(write):
    """An architecture grid: image sizes against the deepest level. 96 and 160 px are no multiples
    of 2 ** 6: two of the six points would fail at their trial's start, and validate says so first."""
    path = sweep_file(write, "  algorithm: grid\n  space:\n    model.image_size: {grid: [96, 128, 160]}\n"
                             "    model.max_level: {grid: [5, 6]}\n")
    report = validation_report(load_sweep(path), this_machine(), strict=False)
    assert report["grid_points"] == 6
    assert report["grid_points_that_cannot_train"] == [
        {"point": {"model.image_size": 96, "model.max_level": 6},
         "reason": "model.image_size: found 96, expected a multiple of 64 (2 ** max_level)"},
        {"point": {"model.image_size": 160, "model.max_level": 6},
         "reason": "model.image_size: found 160, expected a multiple of 64 (2 ** max_level)"}]
    result = run_here("validate", path)
    assert result.returncode == 0, result.stderr
    assert ("note: 2 of 6 grid points cannot train (their trials will fail at their start), e.g. model.image_size=96, "
            "model.max_level=6: model.image_size: found 96, expected a multiple of 64 (2 ** max_level)") in result.stdout


def test_a_sampled_architecture_that_cannot_train_is_its_trials_one_line_before_anything_starts():
    """What a trial does first with the combination the searcher drew (random draws of a
    space over image sizes and levels): the config's rules, one line, no worker started."""
    from detsweep.config import load_trial_config
    from detsweep.trainables.trial import TrialFailed, run_trial

    tree = load_trial_config(REPO / "configs" / "quickstart.yaml").model_dump(mode="json")
    tree["model"].update(image_size=160, max_level=6)
    with pytest.raises(TrialFailed) as caught:
        run_trial({"trial": tree, "search": {"metric": "eval/AP_best"}})
    assert str(caught.value) == ("the trial's sampled config: model.image_size: found 160, expected a multiple of 64 "
                                 "(2 ** max_level)")
