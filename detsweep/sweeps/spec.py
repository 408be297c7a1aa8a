"""The sweep file: ``name``, ``base`` (a trial config), ``search`` and ``storage``.

Loading resolves ``base`` (inline, a path, or ``from: PATH`` plus overrides) and
``search.include`` files, applies ``--set`` to the whole sweep (``base.train.num_steps``,
``search.num_samples``), and checks everything before anything starts: the base config,
every space path and every listed value against the trial schema, bounds, and
algorithm/scheduler combinations.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from detsweep.config import TrialConfig, validate
from detsweep.config.loader import (
    did_you_mean,
    merge_trees,
    model_at,
    read_trial_tree,
    read_yaml_mapping,
    resolve_data_paths,
    set_path,
)
from detsweep.config.schema import ModelConfig, Section, TrainConfig, invalid
from detsweep.errors import DetsweepError
from detsweep.evaluation.metrics import SERVING, SERVING_INT8, reported_metrics
from detsweep.evaluation.objectives import Constraint, Objective

from .space import Parameter, grid_points


class SchedulerSpec(Section):
    type: Literal["fifo", "asha", "pbt", "hyperband", "halving"] = "fifo"
    grace_period: int = Field(100, gt=0, description="ASHA, halving: training steps before a trial can be stopped "
                                                     "(halving: its first rung)")
    reduction_factor: float = Field(3.0, gt=1, description="ASHA, HyperBand, halving: 1 of this many goes on at each rung")
    max_t: int | None = Field(None, gt=0, description="ASHA, HyperBand, halving: steps of the longest trial "
                                                      "(default base.train.num_steps)")
    perturbation_interval: int = Field(100, gt=0, description="PBT: training steps between exploit/explore")
    quantile_fraction: float = Field(0.25, gt=0, le=0.5, description="PBT: the bottom fraction copies the top one")
    synch: bool = Field(False, description="PBT: trials wait for each other at every perturbation (Ray Tune's synch)")
    mutations: dict[str, Parameter] = Field(default_factory=dict, description="PBT: dotted path → values or a distribution")
    metric: str | None = Field(None, description="ASHA, PBT, HyperBand, halving: what the scheduler decides on, if not search.metric "
                                                 "(the best trial is still chosen by search.metric)")
    mode: Literal["max", "min"] | None = Field(None, description="with metric: whether more is better")

    @property
    def pauses(self) -> bool:
        """Whether it pauses trials at rungs and resumes them from a checkpoint there."""
        return self.type in ("hyperband", "halving")


class ObjectiveSpec(Section):
    metric: str
    mode: Literal["max", "min"]
    reference: float | None = Field(None, description="the front's hypervolume is measured up to this value "
                                                      "(default: the worst among the trials trained to the end)")


class SearchSpec(Section):
    metric: str = Field("eval/AP_best", description="what the best trial (the champion) is chosen by; with "
                                                    "objectives, one of them (default: the first training reports)")
    mode: Literal["max", "min"] = "max"
    objectives: list[ObjectiveSpec] = Field(default_factory=list, description="two or more metrics: the sweep "
                                            "hands back the trials on their Pareto front")
    constraints: list[str] = Field(default_factory=list, description='bounds on what serving costs ("serve/latency_ms '
                                   '<= 20"): a trial whose architecture breaks one is recorded and never trained')
    num_samples: int = Field(4, gt=0, description="trials to sample (per grid point with a grid)")
    max_concurrent_trials: int | None = Field(None, gt=0, description="None: as many as the cluster fits")
    time_budget_s: float | None = Field(None, gt=0)
    algorithm: Literal["random", "grid", "optuna", "bohb"] = "random"
    seed: int | None = None
    scheduler: SchedulerSpec = SchedulerSpec()
    include: list[str] = Field(default_factory=list, description="space files, relative to the sweep file")
    space: dict[str, Parameter] = Field(default_factory=dict)
    points: list[dict[str, Any]] = Field(default_factory=list, description="configurations trained as they are "
                                         "(swept path: value), each crossed with the grid parameters (algorithm grid)")
    serving_cost: bool | Literal["int8"] = Field(False, description="measure each architecture the space holds "
                                                 "before the trials start: serve/latency_ms, serve/size_mb, serve/params "
                                                 "on every trial (int8: serve/int8_latency_ms, serve/int8_size_mb too)")

    @model_validator(mode="before")
    @classmethod
    def _metric_of_the_objectives(cls, fields: Any) -> Any:
        """With objectives and no ``metric``, the champion is chosen by the first that training
        reports (the serving costs are known before it)."""
        if isinstance(fields, dict) and isinstance(fields.get("objectives"), list) and "metric" not in fields:
            trained = [o for o in fields["objectives"] if isinstance(o, dict) and not str(o.get("metric")).startswith("serve/")]
            if trained:
                fields = {**fields, "metric": trained[0].get("metric"), "mode": trained[0].get("mode")}
        return fields

    @property
    def ranked_on(self) -> list[Objective]:
        """What trials are ranked on: the objectives, or the one metric."""
        return [Objective(o.metric, o.mode) for o in self.objectives] or [Objective(self.metric, self.mode)]

    @property
    def bounds(self) -> list[Constraint]:
        return [Constraint.parse(text, f"search.constraints[{i}]") for i, text in enumerate(self.constraints)]

    @property
    def measures_serving(self) -> bool:
        """Whether each architecture's serving cost is measured before the trials start: asked
        for, or needed by a constraint or an objective."""
        return bool(self.serving_cost) or any(metric.startswith("serve/") for metric in self._named())

    @property
    def measures_int8(self) -> bool:
        """Whether the int8 file of each architecture is measured too."""
        return self.serving_cost == "int8" or any(metric in SERVING_INT8 for metric in self._named())

    def _named(self) -> list[str]:
        return [c.metric for c in self.bounds] + [o.metric for o in self.objectives]

    @property
    def decided_by(self) -> tuple[str, str]:
        """The metric and mode the scheduler decides on: its own, or the sweep's objective."""
        if self.scheduler.metric is not None and self.scheduler.mode is not None:
            return self.scheduler.metric, self.scheduler.mode
        return self.metric, self.mode

    @model_validator(mode="after")
    def _searcher_fits_the_space_and_scheduler(self) -> SearchSpec:
        has_grid = any(parameter.is_grid for parameter in self.space.values())
        if has_grid and self.algorithm in ("optuna", "bohb"):
            raise invalid("algorithm", self.algorithm, "random or grid when the space has grid parameters")
        # TuneBOHB learns only from the budgets our HyperBand (rungs.py) marks on results, and that
        # HyperBand pauses trials for BOHB's suggestions to fill its brackets: each is built for the other
        if (self.algorithm == "bohb") != (self.scheduler.type == "hyperband"):
            field, value = ("scheduler.type", self.scheduler.type) if self.algorithm == "bohb" else ("algorithm", self.algorithm)
            raise invalid(field, value, "algorithm bohb with scheduler hyperband: BOHB decides with HyperBand's brackets")
        for path, parameter in self.space.items():  # neither converts an unbounded distribution
            if self.algorithm in ("optuna", "bohb") and parameter.distribution == "normal":
                raise invalid(f"space.{path}.distribution", "normal", f"a bounded distribution with algorithm {self.algorithm}")
        if self.algorithm == "optuna" and self.scheduler.type == "pbt":
            raise invalid("algorithm", self.algorithm, "random or grid with scheduler pbt (PBT chooses the next configurations itself)")
        if self.algorithm == "optuna" and self.scheduler.type == "halving":  # its limiter counts paused trials as running
            raise invalid("algorithm", self.algorithm, "random or grid with scheduler halving (it pauses every trial at "
                                                       "a rung until all have reached it)")
        if self.algorithm == "grid" and not (has_grid or self.points):
            raise invalid("algorithm", self.algorithm, "a space with at least one grid parameter, or points")
        if self.points and self.algorithm != "grid":
            raise invalid("algorithm", self.algorithm, "grid with points (each point is a grid point)")
        for index, point in enumerate(self.points):
            if unswept := sorted(set(point) - set(self.space)):
                raise invalid(f"points[{index}]", unswept, f"paths of the space ({', '.join(self.space)})")
        scheduler = self.scheduler
        self._objectives_fit()
        if scheduler.type == "fifo" and (scheduler.metric or scheduler.mode):
            raise invalid("scheduler.metric", scheduler.metric, "nothing with scheduler fifo (it stops no trial)")
        if (scheduler.metric is None) != (scheduler.mode is None):
            field = "scheduler.mode" if scheduler.mode is None else "scheduler.metric"
            raise invalid(field, None, "scheduler.metric and scheduler.mode together (say whether more is better)")
        for path in self.scheduler.mutations:
            if is_architecture(path):
                raise invalid(f"scheduler.mutations.{path}", "a field of the architecture",
                              "training settings only (PBT copies a donor's checkpoint, which fits only its own network)")
            if path in self.space and self.space[path].is_grid:
                raise invalid(f"space.{path}", "a grid", "values or a distribution (PBT mutates this path, a grid point cannot change)")
        return self

    def _objectives_fit(self) -> None:
        for i, text in enumerate(self.constraints):
            try:
                Constraint.parse(text, "")
            except DetsweepError as error:
                raise invalid(f"constraints[{i}]", text, str(error).split("expected ", 1)[1]) from None
        if not self.objectives:
            return
        metrics = [o.metric for o in self.objectives]
        if len(metrics) < 2 or len(set(metrics)) < len(metrics):
            raise invalid("objectives", metrics, "two or more different metrics (one: search.metric and search.mode)")
        if (self.metric, self.mode) not in [(o.metric, o.mode) for o in self.objectives]:
            raise invalid("metric", self.metric, f"one of the objectives with its mode ({', '.join(metrics)}): the "
                                                 "champion is the best trial on it")
        if self.scheduler.type not in ("fifo", "asha"):
            raise invalid("scheduler.type", self.scheduler.type, "fifo or asha with objectives (asha ranks each rung "
                                                                 f"by non-dominated sort; {self.scheduler.type} ranks one metric)")
        if self.scheduler.metric:
            raise invalid("scheduler.metric", self.scheduler.metric, "nothing with objectives (asha ranks its rungs "
                                                                     "on every objective)")


class RerunSpec(Section):
    """A sweep that trains another sweep's top configurations again over seeds (``detsweep
    rerun``): its ``search.points`` are ``trials``' configurations, in the order the source
    ranked them, and ``train.seed`` is a grid of ``seeds``."""

    source: str = Field(description="the source sweep as it was named: its folder, file or name")
    source_name: str = Field(description="the source sweep's name: its registered model's")
    source_run: str | None = Field(None, description="the source sweep's MLflow parent run")
    trials: list[str] = Field(min_length=1, description="the source trials whose configurations are the points, the best first")
    seeds: list[int] = Field(min_length=2)
    register_mean: bool = Field(False, description="the best configuration by its mean becomes the registered champion")


class SweepFile(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*$")
    base: dict[str, Any]
    search: SearchSpec = SearchSpec()
    storage: str | None = Field(None, description="a folder or s3:// / gs:// URI; None: Ray's default")
    rerun: RerunSpec | None = None


# Mappings keyed by dotted trial-config paths, and the fields of their values (for --set).
KEYED_BY_PATH = {"search.space": set(Parameter.model_fields), "search.scheduler.mutations": set(Parameter.model_fields)}


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: the file's sections plus the typed base trial config."""

    name: str
    path: Path
    base_tree: dict[str, Any]
    base: TrialConfig
    search: SearchSpec
    storage: str | None
    rerun: RerunSpec | None = None


def load_sweep(path: str | Path, overrides: Iterable[str] = ()) -> Sweep:
    path = Path(path)
    tree = read_yaml_mapping(path)
    tree["base"] = _resolve_base(tree.get("base"), path)
    search = tree.get("search")
    if isinstance(search, dict):
        search = tree["search"] = dict(search)
        search["space"] = {**_included(search.get("include", []), path), **(search.get("space") or {})}
    spec = validate(SweepFile, tree, source=str(path), overrides=list(overrides), keyed_by_path=KEYED_BY_PATH)
    base = validate(TrialConfig, spec.base, source=f"{path}: base")
    _check_space(spec, path)
    _check_reports_carry_the_metric(base, path, spec.search.metric)
    _check_objectives_are_known(spec.search, base, path)
    if spec.search.scheduler.metric:
        _check_reports_carry_the_metric(base, path, spec.search.scheduler.metric, "search.scheduler.metric")
    _check_the_scheduler_fits(spec.search, base.train, path)
    _check_the_searcher_is_installed(spec.search, path)
    return Sweep(spec.name, path, spec.base, base, spec.search, spec.storage, spec.rerun)


def _resolve_base(base: Any, sweep_path: Path) -> dict[str, Any]:
    """Inline mapping, a path, or ``{from: PATH, …overrides}``; paths are relative to the sweep file."""
    if isinstance(base, str):
        base = {"from": base}
    if not isinstance(base, dict):
        raise DetsweepError(f"{sweep_path}: base: found {base!r}, expected a trial config, a path, or from: PATH")
    base = copy.deepcopy(base)
    source = base.pop("from", None)
    if source is None:
        resolve_data_paths(base, sweep_path.parent)
        return base
    config_path = sweep_path.parent / source
    tree = read_trial_tree(config_path)
    resolve_data_paths(tree, config_path.parent)
    resolve_data_paths(base, sweep_path.parent)
    return merge_trees(tree, base)


def _included(files: Any, sweep_path: Path) -> dict[str, Any]:
    space: dict[str, Any] = {}
    for name in files if isinstance(files, list) else []:
        included = sweep_path.parent / name
        for key, value in read_yaml_mapping(included).items():
            space.setdefault(key, value)
    return space


def _check_space(spec: SweepFile, path: Path) -> None:
    """Every space path is a trial-config field, and every listed value is valid there."""
    parameters = {**spec.search.space, **spec.search.scheduler.mutations}
    for dotted, parameter in parameters.items():
        where = f"search.space.{dotted}" if dotted in spec.search.space else f"search.scheduler.mutations.{dotted}"
        _check_field_exists(dotted, where, path)
        if spec.search.measures_serving and is_architecture(dotted) and parameter.distribution:
            raise DetsweepError(f"{path}: {where}: found a distribution, expected values or a grid (the serving cost "
                                "of each architecture the space holds is measured before the trials start)")
        for value in _candidates(parameter):
            tree = copy.deepcopy(spec.base)
            set_path(tree, dotted, value)
            try:
                validate(TrialConfig, tree, source="")
            except DetsweepError as error:
                reason = str(error).removeprefix(": ")
                raise DetsweepError(f"{path}: {where}: the value {value!r} makes the trial invalid: {reason}") from None


def _candidates(parameter: Parameter) -> list[Any]:
    if parameter.values is not None:
        return parameter.values
    if parameter.grid is not None:
        return parameter.grid
    if parameter.distribution is None:
        return [parameter.value]
    if parameter.distribution == "normal":
        return [parameter.mu]
    if parameter.distribution == "int_uniform":
        return [int(parameter.min), int(parameter.max)]
    return [parameter.min, parameter.max]


def _check_field_exists(dotted: str, where: str, path: Path) -> None:
    parts = dotted.split(".")
    for depth, key in enumerate(parts):
        section = model_at(TrialConfig, parts[:depth])
        if section is None:
            raise DetsweepError(f"{path}: {where}: {'.'.join(parts[:depth])} has no fields below it")
        if key not in section.model_fields:
            known = list(section.model_fields)
            raise DetsweepError(f"{path}: {where}: {key!r} is not a field of the trial config, expected one of "
                                f"{', '.join(known)}{did_you_mean(key, known)}")


def _check_reports_carry_the_metric(base: TrialConfig, path: Path, metric: str, field: str = "search.metric") -> None:
    # Tune hears a trial at its evaluations, so checkpoints must fall on them.
    train = base.train
    if train.checkpoint_every and train.eval_every and train.checkpoint_every % train.eval_every:
        raise DetsweepError(f"{path}: base.train.checkpoint_every: found {train.checkpoint_every}, "
                            f"expected a multiple of base.train.eval_every ({train.eval_every}) in a sweep")
    if metric.startswith("eval") and not base.data.val:
        raise DetsweepError(f"{path}: base.data.val: found nothing, expected a validation set (the sweep's metric needs it)")
    known = reported_metrics(base)
    if metric not in known:
        raise DetsweepError(f"{path}: {field}: found {metric!r}, expected a metric training reports: "
                            f"{', '.join(known)}{did_you_mean(metric, known)}")


def _check_objectives_are_known(search: SearchSpec, base: TrialConfig, path: Path) -> None:
    """Every objective is reported (by training, or measured before it), and every constraint is
    on what serving costs: it is checked before a trial trains."""
    known = reported_metrics(base) + list(SERVING) + list(SERVING_INT8)
    for i, objective in enumerate(search.objectives):
        if objective.metric not in known:
            raise DetsweepError(f"{path}: search.objectives[{i}].metric: found {objective.metric!r}, expected a metric "
                                f"training reports or a serving cost: {', '.join(known)}{did_you_mean(objective.metric, known)}")
    serving = [*SERVING, *SERVING_INT8]
    for i, constraint in enumerate(search.bounds):
        if constraint.metric not in serving:
            raise DetsweepError(f"{path}: search.constraints[{i}]: found {constraint.metric!r}, expected a serving cost, "
                                f"known before training: {', '.join(serving)}{did_you_mean(constraint.metric, serving)}")


def grid_of(sweep: Sweep) -> list[dict[str, Any]]:
    """The sweep's grid points (see ``grid_points``), each of its ``points`` crossed with them
    (a point's own value wins); none when no parameter is a grid and there are no points."""
    space, points = sweep.search.space, sweep.search.points
    if not any(parameter.is_grid for parameter in space.values()):
        return [dict(point) for point in points]
    grid = grid_points(space, sweep.base.model_dump(mode="json"))
    if not points:
        return grid
    crossed = {repr(sorted(merged.items())): merged for point in points for merged in
               ({**combination, **point} for combination in grid)}  # a grid the points set collapses
    return list(crossed.values())


def is_architecture(dotted: str) -> bool:
    """A trial-config path of the network's architecture (``ModelConfig.ARCHITECTURE``)."""
    return dotted.startswith("model.") and dotted.removeprefix("model.") in ModelConfig.ARCHITECTURE


def grid_points_that_cannot_train(sweep: Sweep) -> list[tuple[dict[str, Any], str]]:
    """The grid points whose config the schema refuses (an image size that is not a multiple of
    2 ** max_level, say), each with its one-line reason; the space's other fields at the base's
    values. Their trials would fail at their start, each with that line."""
    base = sweep.base.model_dump(mode="json")
    refused = []
    for point in grid_of(sweep):
        tree = copy.deepcopy(base)
        for dotted, value in point.items():
            set_path(tree, dotted, value)
        try:
            validate(TrialConfig, tree, "a grid point")
        except DetsweepError as error:
            refused.append((point, str(error).removeprefix("a grid point: ")))
    return refused


def trial_count(sweep: Sweep) -> int:
    """How many trials the sweep runs: ``num_samples``, per grid point with a grid."""
    return sweep.search.num_samples * max(1, len(grid_of(sweep)))


def reports_every(train: TrainConfig, metric: str) -> int:
    """Training steps between two reports of ``metric``: Tune sees it at the reports that carry
    it, every evaluation or every loop."""
    return train.eval_every if metric.startswith("eval") else train.steps_per_loop


def _check_the_scheduler_fits(search: SearchSpec, train: TrainConfig, path: Path) -> None:
    """A scheduler that could never act on these trials is a mistake to say before they run."""
    scheduler, steps = search.scheduler, train.num_steps
    metric, _ = search.decided_by
    every = reports_every(train, metric)
    if scheduler.type == "asha":
        bound, limit = ("search.scheduler.max_t", scheduler.max_t) if (scheduler.max_t or steps) < steps \
            else ("base.train.num_steps", steps)
        if scheduler.grace_period >= limit:
            raise DetsweepError(f"{path}: search.scheduler.grace_period: found {scheduler.grace_period}, expected fewer "
                                f"steps than {bound} ({limit}): ASHA could never stop a trial")
        _check_seen_before_the_end(scheduler.grace_period, every, steps, metric, "ASHA's first rung", path)
    if scheduler.type == "pbt":
        if scheduler.perturbation_interval >= steps:
            raise DetsweepError(f"{path}: search.scheduler.perturbation_interval: found {scheduler.perturbation_interval}, "
                                f"expected fewer steps than base.train.num_steps ({steps}): PBT would never perturb")
        if not scheduler.mutations:
            raise DetsweepError(f"{path}: search.scheduler.mutations: found nothing, expected the paths PBT mutates")
        if not train.checkpoint_every:
            raise DetsweepError(f"{path}: base.train.checkpoint_every: found 0, expected checkpoints for PBT to copy")
        _check_seen_before_the_end(scheduler.perturbation_interval, every, steps, metric, "PBT's first perturbation",
                                   path)
    if scheduler.pauses:
        field = "base.train.eval_every" if metric.startswith("eval") else "base.train.steps_per_loop"
        who = "HyperBand" if scheduler.type == "hyperband" else "halving"
        if not every:
            raise DetsweepError(f"{path}: {field}: found 0, expected reports of {metric} before base.train.num_steps "
                                f"({steps}): {who} ranks trials at them")
        if every != reports_every(train, search.metric):  # HyperBand ranks at the reports Tune gets: the objective's
            raise DetsweepError(f"{path}: search.scheduler.metric: found {metric!r} (reported every {every} steps), "
                                f"expected a metric reported with search.metric {search.metric!r} (every "
                                f"{reports_every(train, search.metric)}): {who} ranks trials where Tune hears them")
        if (scheduler.max_t or steps) > steps:
            raise DetsweepError(f"{path}: search.scheduler.max_t: found {scheduler.max_t}, expected at most "
                                f"base.train.num_steps ({steps})")
        if train.checkpoint_every != every:
            raise DetsweepError(f"{path}: base.train.checkpoint_every: found {train.checkpoint_every}, expected {every} "
                                f"(as {field}): {who} pauses trials where they report {metric} and resumes them "
                                "from a checkpoint there")
    if scheduler.type == "halving":
        _check_halving_has_rungs(scheduler, every, min(scheduler.max_t or steps, steps), metric, path)


def in_reports(steps: int, every: int) -> int:
    """``steps`` counted in reports of a metric reported every ``every`` steps, rounded up:
    HyperBand's and halving's time, so that their rungs fall on reports."""
    return -(-steps // every)


def _check_halving_has_rungs(scheduler: SchedulerSpec, every: int, limit: int, metric: str, path: Path) -> None:
    """Halving's first rung falls on a report before the trials' last, and each next rung on a later one."""
    first = in_reports(scheduler.grace_period, every)
    if first >= in_reports(limit, every):
        raise DetsweepError(f"{path}: search.scheduler.grace_period: found {scheduler.grace_period}, expected a first "
                            f"rung (the report of {metric} at step {first * every}) before the trials' last report "
                            f"(step {in_reports(limit, every) * every}): halving would rank no trial before its end")
    if int(first * scheduler.reduction_factor) <= first:  # as the bracket moves its rung
        least = math.ceil((first + 1) / first * 100) / 100
        raise DetsweepError(f"{path}: search.scheduler.reduction_factor: found {scheduler.reduction_factor:g}, expected "
                            f"at least {least:g}: the rung after step {first * every} must fall on a later report of "
                            f"{metric} (every {every} steps)")


def _check_the_searcher_is_installed(search: SearchSpec, path: Path) -> None:
    """BOHB's libraries are an extra (``detsweep[bohb]``): without them, say so before Ray starts."""
    import importlib.util

    if search.algorithm == "bohb":
        missing = [name for name in ("hpbandster", "ConfigSpace") if importlib.util.find_spec(name) is None]
        if missing:
            raise DetsweepError(f"{path}: search.algorithm: found 'bohb', expected it installed: {' and '.join(missing)} "
                                "missing (pip install 'detsweep[bohb]')")


def _check_seen_before_the_end(step: int, every: int, steps: int, metric: str, what: str, path: Path) -> None:
    """The first report of ``metric`` at or after ``step`` comes before the last step."""
    first = -(-step // every) * every if every else steps
    if first >= steps:
        field = "base.train.eval_every" if metric.startswith("eval") else "base.train.steps_per_loop"
        raise DetsweepError(f"{path}: {field}: found {every}, expected a report of {metric} between {what} (step {step}) "
                            f"and base.train.num_steps ({steps}), or the scheduler can never act")
