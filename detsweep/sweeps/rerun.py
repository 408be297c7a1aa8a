"""Whether the winner is real: a finished sweep's top configurations trained again over seeds.

``detsweep rerun`` takes the ``top`` best configurations among a sweep's trials that ended
without error (trained to the end or stopped early by the scheduler: distinct ones, ranked
as the sweep ranks them) and trains each again to the end with the same
``seeds``, none of which the sweep used (its winner was chosen on its own seed's luck), FIFO
to the sweep's ``num_steps``, as a sweep of its own (:class:`.spec.RerunSpec`): a grid whose
points are the configurations, crossed with ``train.seed``. Its end is a table per
objective: each configuration's mean, standard deviation and per-seed values, and its
**paired** difference to the leader (the best mean) over the seeds both finished, with a t
interval; and one verdict on the leader's lead over the 2nd.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from detsweep.errors import DetsweepError, failure_reason
from detsweep.evaluation.objectives import Objective, fronts
from detsweep.tracking.sweep_run import RERUN_RANK_TAG, RERUN_TRIAL_TAG, RERUNS_TAG, TrialStatus

from .experiment import SweepResults, TrialOutcome, as_run
from .spec import Sweep, load_sweep

LEVEL = 0.9  # the leads' intervals' coverage
SEED = "train.seed"


@dataclass(frozen=True)
class Lead:
    """The leader's paired lead over one configuration: the mean of its per-seed differences
    (positive: the leader better) over ``seeds`` seeds both finished, and its interval (none
    below two seeds)."""

    value: float
    low: float | None
    high: float | None
    seeds: int


@dataclass(frozen=True)
class RerunRow:
    """One configuration: its place in the source sweep, the source trial, its final value of
    the objective on each seed that finished, their mean and standard deviation, and the
    leader's lead over it (None: it leads)."""

    rank: int
    trial_id: str
    values: dict[int, float]
    mean: float
    std: float
    lead: Lead | None


@dataclass(frozen=True)
class RerunTable:
    """One objective's rows, the leader first, then by mean; the verdict on the leader's lead."""

    metric: str
    mode: str
    rows: list[RerunRow]
    verdict: str


def plan_rerun(source_path: str, source: Sweep, results: SweepResults, top: int, seeds: int,
               overrides: list[str], register: bool, folder: Path) -> Sweep:
    """The rerun of ``source`` (its results ``results``) as a sweep, its file written into
    ``folder``: refused in one line, before anything starts, when it cannot be made."""
    if source.search.scheduler.type == "pbt":
        raise DetsweepError(f"{source_path}: search.scheduler.type: found 'pbt', expected a sweep whose trials keep "
                            "their values (PBT's winners changed theirs as they trained)")
    if top < 1:
        raise DetsweepError(f"--top: found {top}, expected 1 or more configurations")
    if seeds < 2:
        raise DetsweepError(f"--seeds: found {seeds}, expected 2 or more (one seed has no spread)")
    finished = finished_configurations(results.outcomes)
    if len(finished) < 2:
        raise DetsweepError(f"{source_path}: found {len(finished)} configuration(s) whose trials ended without error, "
                            "expected 2 or more to tell apart")
    if top > len(finished):
        raise DetsweepError(f"--top: found {top}, expected at most {len(finished)} (the configurations of "
                            f"{source.name} whose trials ended without error)")
    chosen = finished[:top]
    path = folder / "rerun.yaml"
    path.write_text(yaml.safe_dump(rerun_tree(source_path, source, results, chosen, seeds, register), sort_keys=False))
    return load_sweep(path, overrides)


def configuration(values: dict[str, Any]) -> dict[str, Any]:
    """A trial's swept values but its seed: what a rerun trains again."""
    return {path: value for path, value in values.items() if path != SEED}


def finished_configurations(outcomes: list[TrialOutcome]) -> list[TrialOutcome]:
    """The trials that ended without error (trained to the end, or stopped early), best first
    as the sweep ranks them, one for each configuration."""
    seen, kept = [], []
    for outcome in outcomes:
        ended = outcome.status in (TrialStatus.TERMINATED, TrialStatus.STOPPED)
        if ended and configuration(outcome.config) not in seen:
            seen.append(configuration(outcome.config))
            kept.append(outcome)
    return kept


def rerun_tree(source_path: str, source: Sweep, results: SweepResults, chosen: list[TrialOutcome], count: int,
               register_mean: bool) -> dict[str, Any]:
    """The rerun's sweep file: the source's base and space, its configurations as grid points
    crossed with ``count`` seeds the source did not use, FIFO, in the source's experiment."""
    ran = as_run(source)
    used = [int(outcome.config.get(SEED, source.base.train.seed)) for outcome in results.outcomes]
    seeds = list(range(max(used) + 1, max(used) + 1 + count))
    base = ran["base"]
    # the source's runs, wherever this rerun starts from (a relative sqlite path would move)
    base["tracking"] |= {"experiment": source.base.tracking.experiment or source.name,
                         **({"uri": results.link.uri} if results.link else {})}
    points = [configuration(outcome.config) for outcome in chosen]
    search = {key: value for key, value in ran["search"].items() if key not in ("num_samples", "time_budget_s")}
    search |= {"algorithm": "grid", "num_samples": 1, "scheduler": {"type": "fifo"}, "points": points,
               "space": {**narrowed(search["space"], points), SEED: {"grid": seeds}}}
    rerun = {"source": source_path, "source_name": source.name,
             "source_run": results.link.parent_run_id if results.link else None,
             "trials": [outcome.trial_id for outcome in chosen], "seeds": seeds, "register_mean": register_mean}
    return {"name": f"{source.name}-rerun-{time.strftime('%Y%m%d-%H%M%S')}", "base": base, "search": search,
            "storage": ran["storage"], "rerun": rerun}


def narrowed(space: dict[str, dict[str, Any]], points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The source's space with each list of values or grid cut to the values ``points`` hold
    (what ``validate`` shows and the serving cost measures); distributions as they were, for
    the study's sake."""
    kept = {}
    for path, parameter in space.items():
        kind = next((key for key in ("values", "grid") if key in parameter), None)
        used = [value for value in parameter.get(kind, []) if any(point.get(path) == value for point in points)]
        kept[path] = {**parameter, kind: used} if kind and used else parameter
    return kept


def rerun_tables(sweep: Sweep, outcomes: list[TrialOutcome]) -> list[RerunTable]:
    """Each objective's table of the rerun ``sweep``'s trials; a seed that did not finish is left out."""
    points = sweep.search.points
    finished: list[dict[int, dict[str, Any]]] = [{} for _ in points]  # each configuration's metrics by seed
    for outcome in outcomes:
        if outcome.status == TrialStatus.TERMINATED and configuration(outcome.config) in points:
            finished[points.index(configuration(outcome.config))][int(outcome.config[SEED])] = outcome.metrics
    tables = []
    for objective in sweep.search.ranked_on:
        values = [{seed: float(metrics[objective.metric]) for seed, metrics in by_seed.items()
                   if _finite(metrics.get(objective.metric))} for by_seed in finished]
        tables.append(objective_table(objective, [(place + 1, trial_id, each) for place, (trial_id, each)
                                                  in enumerate(zip(sweep.rerun.trials, values))]))
    return tables


def objective_table(objective: Objective, configurations: list[tuple[int, str, dict[int, float]]]) -> RerunTable:
    """``configurations`` (place in the source, source trial, value by seed) as a table: the
    leader by mean, each other one's paired lead, and the verdict."""
    sign = 1.0 if objective.mode == "max" else -1.0
    scored = [(rank, trial_id, values) for rank, trial_id, values in configurations if values]
    scored.sort(key=lambda each: -sign * statistics.fmean(each[2].values()))
    if not scored:
        return RerunTable(objective.metric, objective.mode, [], f"{objective.metric}: no configuration finished a seed")
    leader = scored[0][2]
    rows = [RerunRow(rank, trial_id, values, statistics.fmean(values.values()),
                     statistics.stdev(values.values()) if len(values) > 1 else 0.0,
                     None if index == 0 else paired_lead(leader, values, sign))
            for index, (rank, trial_id, values) in enumerate(scored)]
    return RerunTable(objective.metric, objective.mode, rows, verdict(objective.metric, rows))


def paired_lead(leader: dict[int, float], other: dict[int, float], sign: float) -> Lead:
    """The leader's lead over ``other`` on the seeds both have: the mean of the per-seed
    differences and its t interval at :data:`LEVEL` (none below two seeds)."""
    from scipy.stats import t

    shared = sorted(set(leader) & set(other))
    differences = [sign * (leader[seed] - other[seed]) for seed in shared]
    if not differences:
        return Lead(math.nan, None, None, 0)
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return Lead(mean, None, None, len(differences))
    half = t.ppf(1 - (1 - LEVEL) / 2, len(differences) - 1) * statistics.stdev(differences) / math.sqrt(len(differences))
    return Lead(mean, mean - half, mean + half, len(differences))


def verdict(metric: str, rows: list[RerunRow]) -> str:
    """Whether the leader's lead over the 2nd is larger than its seeds' spread, in one line."""
    if len(rows) < 2:
        return f"{metric}: only one configuration finished a seed: nothing to tell apart"
    lead = rows[1].lead
    if not lead.seeds:
        return f"{metric}: the leader and the 2nd share no finished seed: the lead cannot be judged"
    said = f"{metric}: the lead of {lead.value:.3f} over the 2nd"
    if lead.low is None:
        return f"{said} cannot be judged: they share {lead.seeds} finished seed(s), an interval needs 2"
    interval = f"{LEVEL:.0%} interval [{lead.low:.3f}, {lead.high:.3f}]"
    if lead.low > 0:
        return f"{said} holds: its {interval} is clear of zero"
    return f"{said} is within its {interval}, which holds zero: these are not told apart by {lead.seeds} seeds"


def on_the_front(tables: list[RerunTable], objectives: list[Objective]) -> dict[str, int]:
    """With several objectives: how many seeds put each configuration on the seed's Pareto
    front (among the configurations that finished that seed)."""
    values = {(row.trial_id, seed): {} for table in tables for row in table.rows for seed in row.values}
    for table in tables:
        for row in table.rows:
            for seed, value in row.values.items():
                values[(row.trial_id, seed)][table.metric] = value
    counts = {row.trial_id: 0 for table in tables for row in table.rows}
    for seed in sorted({seed for _, seed in values}):
        present = [(trial_id, found) for (trial_id, each), found in values.items()
                   if each == seed and len(found) == len(objectives)]
        points = [[o.as_min(found[o.metric]) for o in objectives] for _, found in present]
        for index in (fronts(points)[0] if points else []):
            counts[present[index][0]] += 1
    return counts


def table_rows(tables: list[RerunTable]) -> list[dict[str, Any]]:
    """One row per objective and configuration (``rerun.csv``, ``--json``)."""
    return [{"objective": table.metric, "rank": row.rank, "trial_id": row.trial_id, "mean": row.mean, "std": row.std,
             "seeds": {str(seed): value for seed, value in sorted(row.values.items())},
             "lead": None if row.lead is None or not row.lead.seeds else row.lead.value,
             "lead_low": None if row.lead is None else row.lead.low,
             "lead_high": None if row.lead is None else row.lead.high,
             "shared_seeds": None if row.lead is None else row.lead.seeds}
            for table in tables for row in table.rows]


def table_lines(tables: list[RerunTable], seeds: list[int]) -> list[str]:
    """Each objective's table as text, its verdict under it."""
    lines = []
    for table in tables:
        lines.append(f"{table.metric} ({table.mode}) over seeds {', '.join(map(str, seeds))}; lead: the leader's "
                     f"paired difference, {LEVEL:.0%} interval")
        lines.append(f"  {'sweep rank':>10}  {'trial':<14} {'mean':>8} {'std':>8}  {'per seed':<28} lead")
        for row in table.rows:
            per_seed = " ".join(f"{row.values[seed]:.3f}" if seed in row.values else "-" for seed in seeds)
            lead = "leader" if row.lead is None else "-" if not row.lead.seeds else (
                f"{row.lead.value:.3f}" + (f" [{row.lead.low:.3f}, {row.lead.high:.3f}]" if row.lead.low is not None else ""))
            lines.append(f"  {row.rank:>10}  {row.trial_id:<14} {row.mean:>8.3f} {row.std:>8.3f}  {per_seed:<28} {lead}")
        lines.append(table.verdict)
    return lines


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)



def record_rerun(sweep: Sweep, results: SweepResults, link, run_ids: dict[str, str]) -> tuple[dict[str, Any], RerunRow | None]:
    """The rerun's tables said and logged on its parent run (``rerun.csv``, ``rerun/*`` metrics),
    each trial run tagged with the source trial it trains again and that trial's place, the
    source's parent run tagged with this rerun; what ``--json`` carries, and the leader on the
    sweep's metric."""
    import csv
    import io

    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from detsweep import console

    rerun = sweep.rerun
    tables = rerun_tables(sweep, results.outcomes)
    objectives = sweep.search.ranked_on
    front = on_the_front(tables, objectives) if len(objectives) > 1 else None
    lines = table_lines(tables, rerun.seeds)
    if front:
        counted = ", ".join(f"trial {trial_id}'s {count} of {len(rerun.seeds)}" for trial_id, count in front.items())
        lines.append(f"seeds whose Pareto front holds each configuration: {counted}")
    for line in lines:
        console.say(line)
    rows = table_rows(tables)
    client = MlflowClient(link.uri)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["objective"])
    writer.writeheader()
    writer.writerows(rows)
    client.log_text(link.parent_run_id, out.getvalue(), "rerun.csv")
    stamp = int(time.time() * 1000)
    metrics = [Metric(f"rerun/{row['objective']}/rank_{row['rank']}/{key}", float(row[key]), stamp, 0)
               for row in rows for key in ("mean", "std", "lead", "lead_low", "lead_high") if _finite(row[key])]
    for start in range(0, len(metrics), 1000):
        client.log_batch(link.parent_run_id, metrics=metrics[start:start + 1000])
    for outcome in results.outcomes:
        if outcome.trial_id in run_ids and configuration(outcome.config) in sweep.search.points:
            index = sweep.search.points.index(configuration(outcome.config))
            client.set_tag(run_ids[outcome.trial_id], RERUN_TRIAL_TAG, rerun.trials[index])
            client.set_tag(run_ids[outcome.trial_id], RERUN_RANK_TAG, str(index + 1))
    if rerun.source_run:
        try:
            earlier = client.get_run(rerun.source_run).data.tags.get(RERUNS_TAG, "")
            ids = [each for each in earlier.split(",") if each] + [link.parent_run_id]
            client.set_tag(rerun.source_run, RERUNS_TAG, ",".join(dict.fromkeys(ids)))
        except Exception as error:  # the table stands without the link back
            console.say(f"MLflow: the source's run {rerun.source_run} is not tagged with this rerun: "
                        f"{failure_reason(error)}")
    ranked = next((table for table in tables if table.metric == sweep.search.metric), None)
    leader = ranked.rows[0] if ranked and ranked.rows else None
    return {"seeds": rerun.seeds, "source": rerun.source, "source_run": rerun.source_run, "rows": rows,
            "verdicts": [table.verdict for table in tables], "on_the_front": front, "lines": lines}, leader
