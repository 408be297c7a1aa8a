"""What ``detsweep replay`` refuses before it replays anything. (Replays themselves, and curves
that do not match their sweep: ``tests/test_schedulers.py``.)"""

from __future__ import annotations

import json

from detsweep.cli import main

from .tiny_sweeps import tiny_sweep

LR = "optimizer.learning_rate.learning_rate_base"
EMA = "optimizer.moving_average_decay"


def test_replay_refuses_a_pbt_sweep_in_one_line(tmp_path, capsys):
    """A recorded curve cannot go on from another trial's weights, as PBT's exploit would: the
    sweep is refused in one line, exit code 2, though its curves match it (without the refusal
    it would replay them)."""
    sweep = tiny_sweep(tmp_path, f"""
  metric: train/loss
  mode: min
  num_samples: 2
  space:
    {LR}: {{values: [0.01, 0.02]}}
  scheduler:
    type: pbt
    perturbation_interval: 10
    mutations:
      {EMA}: {{values: [0.99, 0.995]}}
""")
    curves = tmp_path / "curves.json"  # of both paths PBT varies: the space's and the mutation's
    curves.write_text(json.dumps({"paths": [LR, EMA], "trials": [
        {"config": {LR: rate, EMA: 0.99}, "reports": [{"step": step, "train/loss": rate} for step in (5, 10, 15, 20)]}
        for rate in (0.01, 0.02)]}))
    assert main(["replay", str(curves), str(sweep)]) == 2
    said = capsys.readouterr()
    assert said.out == "" and said.err == (
        f"detsweep: error: {sweep}: search.scheduler.type: found 'pbt', expected fifo, asha, hyperband or halving to "
        "replay (a recorded curve cannot continue from another trial's weights)\n")
