"""A multi-objective sweep's Pareto front, as the sweep's end and ``detsweep best --pareto``
hand it over: the trials trained to the end within the constraints whose objectives no other
such trial beats on all at once, the hypervolume they dominate up to a stated reference point,
``pareto.csv`` and ``pareto.png``.

The reference point is each objective's ``reference`` from the sweep file, or else the worst
value among the trials considered (so the front's hypervolume compares sweeps only when the
sweep file states it).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from detsweep.evaluation.objectives import Objective, fronts, hypervolume


@dataclass(frozen=True)
class Candidate:
    """A trial trained to the end within the constraints: what the front is drawn from."""

    trial_id: str
    run_id: str | None
    swept: dict[str, Any]
    values: dict[str, float]  # each objective's, by metric


@dataclass(frozen=True)
class ParetoFront:
    objectives: list[Objective]
    reference: dict[str, float]  # by metric
    hypervolume: float
    front: list[Candidate]  # best first on the first objective
    candidates: list[Candidate]  # every trial it was drawn from

    def with_runs(self, run_ids: dict[str, str]) -> ParetoFront:
        """The same front, each trial with its MLflow run."""
        def linked(c: Candidate) -> Candidate:
            return Candidate(c.trial_id, run_ids.get(c.trial_id, c.run_id), c.swept, c.values)

        return ParetoFront(self.objectives, self.reference, self.hypervolume, [linked(c) for c in self.front],
                           [linked(c) for c in self.candidates])

    def place(self, trial_id: str) -> str | None:
        """``"2 of 3"``: where the trial stands on the front, best first on the first objective."""
        ids = [member.trial_id for member in self.front]
        return f"{ids.index(trial_id) + 1} of {len(ids)}" if trial_id in ids else None

    def to_dict(self) -> dict[str, Any]:
        """What ``launch --json`` and ``best --pareto --json`` print as ``"pareto"``."""
        return {"objectives": [asdict(o) for o in self.objectives], "reference": self.reference,
                "hypervolume": self.hypervolume, "candidates": len(self.candidates),
                "trials": [asdict(member) | {"place": self.place(member.trial_id)} for member in self.front]}

    def csv(self) -> str:
        """One row per trial considered: its values, swept settings, and its place on the front."""
        paths = sorted({path for candidate in self.candidates for path in candidate.swept})
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["trial_id", "place", *(o.metric for o in self.objectives), *paths, "mlflow_run_id"])
        for candidate in sorted(self.candidates, key=lambda c: self.place(c.trial_id) is None):
            writer.writerow([candidate.trial_id, self.place(candidate.trial_id) or "",
                             *(candidate.values[o.metric] for o in self.objectives),
                             *(candidate.swept.get(path, "") for path in paths), candidate.run_id or ""])
        return out.getvalue()

    def figure(self):
        """The first objective against the second: every trial considered, the front drawn as
        the steps it dominates, each point labelled with its swept values."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        y, x = self.objectives[0], self.objectives[1]
        figure, axes = plt.subplots(figsize=(7, 5))
        axes.scatter([c.values[x.metric] for c in self.candidates], [c.values[y.metric] for c in self.candidates],
                     color="0.6", label="trained to the end")
        front = sorted(self.front, key=lambda c: x.as_min(c.values[x.metric]))
        axes.step([c.values[x.metric] for c in front], [c.values[y.metric] for c in front], where="post",
                  color="tab:red", marker="o", label=f"Pareto front (hypervolume {self.hypervolume:.4g})")
        for candidate in self.candidates:
            label = ", ".join(f"{path.rsplit('.', 1)[-1]}={value:.3g}" if isinstance(value, float)
                              else f"{path.rsplit('.', 1)[-1]}={value}" for path, value in candidate.swept.items())
            axes.annotate(label, (candidate.values[x.metric], candidate.values[y.metric]), fontsize=7,
                          textcoords="offset points", xytext=(4, 4))
        axes.set_xlabel(f"{x.metric} ({'less' if x.mode == 'min' else 'more'} is better)")
        axes.set_ylabel(f"{y.metric} ({'less' if y.mode == 'min' else 'more'} is better)")
        axes.legend(loc="best", fontsize=8)
        figure.tight_layout()
        return figure


def pareto_front(candidates: Sequence[Candidate], objectives: Sequence[Objective],
                 references: dict[str, float | None]) -> ParetoFront | None:
    """The front of ``candidates`` over ``objectives``; None when there is no candidate."""
    if not candidates:
        return None
    points = [tuple(o.as_min(c.values[o.metric]) for o in objectives) for c in candidates]
    worst = {o.metric: max(point[axis] for point in points) for axis, o in enumerate(objectives)}
    reference = {o.metric: references.get(o.metric) if references.get(o.metric) is not None
                 else o.as_min(worst[o.metric]) for o in objectives}  # natural units
    members = sorted(fronts(points)[0], key=lambda i: points[i])
    volume = hypervolume([points[i] for i in members], [o.as_min(reference[o.metric]) for o in objectives])
    return ParetoFront(list(objectives), reference, volume, [candidates[i] for i in members], list(candidates))
