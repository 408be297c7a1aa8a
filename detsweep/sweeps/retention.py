"""Bounded checkpoints that PBT can still use.

Tune's ``CheckpointConfig(num_to_keep=K)`` keeps each trial's K latest or best checkpoints
and deletes the rest, whoever still needs them: a PBT exploit hands the recipient the
checkpoint its donor had when it last ranked on top (Tune warns that ``num_to_keep <= 2``
breaks restores), and the recipient reads it only once it has started again, seconds to
minutes later, while the donor writes newer ones. Keeping every checkpoint is what Tune
does otherwise, and in a bucket that grows without end.

:class:`KeepCheckpoints` keeps what can still be asked for, and deletes the rest:

- every checkpoint of the trial's last ``window`` steps. PBT takes a donor's checkpoint at
  its last perturbation (or drops it when the donor was not on top), and the next one comes
  ``perturbation_interval`` steps later: the window is that interval, plus one report and
  one checkpoint of slack, since PBT takes the latest checkpoint at a report;
- the trial's best checkpoint by the sweep's metric (``best``, registration, fine-tuning);
- every checkpoint that some trial's latest checkpoint is (``Trial.checkpoint``): that of
  an exploit's recipient that has not yet started, and each trial's own, which ``resume``
  and a paused trial restart from.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from ray import tune


@dataclass(frozen=True)
class Kept:
    step: int
    score: float  # the sweep's metric at this checkpoint; NaN when it had none
    checkpoint: tune.Checkpoint

    @property
    def key(self) -> tuple[str, str]:
        return _key(self.checkpoint)


def _key(checkpoint) -> tuple[str, str]:
    return checkpoint.filesystem.type_name, checkpoint.path.rstrip("/")


class KeepCheckpoints(tune.Callback):
    def __init__(self, metric: str, mode: str, window: int):
        self.metric, self.mode, self.window = metric, mode, window
        self.kept: dict[str, list[Kept]] = {}  # by trial id, oldest first

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info) -> None:
        result = trial.last_result  # the report this checkpoint came with (Tune saves before the next)
        score = result.get(self.metric)
        new = Kept(int(result.get("step", 0)), float(score) if isinstance(score, (int, float)) else math.nan, checkpoint)
        # A trial restarted from a checkpoint numbers its next ones on from that checkpoint's
        # folder name, over its own older folders: an entry whose folder was written again is gone.
        kept = [*(entry for entry in self.kept.get(trial.trial_id, []) if entry.key != new.key), new]
        newest = max(entry.step for entry in kept)
        best = self._best(kept)
        in_use = {_key(other.checkpoint) for other in trials if other.checkpoint is not None}
        keep = [entry for entry in kept
                if entry.step >= newest - self.window or entry is best or entry.key in in_use or entry is new]
        for entry in kept:
            if entry not in keep:
                _delete(entry.checkpoint)
        self.kept[trial.trial_id] = keep

    def _best(self, kept: list[Kept]) -> Kept | None:
        scored = [entry for entry in kept if not math.isnan(entry.score)]
        if not scored:
            return None
        return (max if self.mode == "max" else min)(scored, key=lambda entry: entry.score)


def _delete(checkpoint) -> None:
    try:
        checkpoint.filesystem.delete_dir(checkpoint.path)
    except OSError as error:  # gone already, or the store refused: it only costs space
        logging.getLogger(__name__).warning("could not delete %s: %s", checkpoint.path, error)
