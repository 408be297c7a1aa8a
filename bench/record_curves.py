"""Record learning curves once, for ``detsweep replay``: a FIFO sweep of quickstart
configurations (``bench/curves_sweep.yaml``), every trial trained its whole budget and
evaluated every 20 steps; every metric of every report is written to ``bench/curves.json``
with the date and the machine.

    .venv/bin/python -m bench.record_curves [--set path=value ...] [--out bench/curves.json]

On 2 cores, 24 configurations of 300 steps take about an hour. Then, for instance::

    .venv/bin/detsweep replay bench/curves.json bench/curves_sweep.yaml --set search.scheduler.type=asha --seeds 20
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from .common import BENCH, machine

SWEEP = BENCH / "curves_sweep.yaml"


def record(overrides: list[str], out: Path) -> dict:
    """Runs the sweep in a scratch folder (Ray results and an MLflow file), then writes what its
    MLflow experiment holds as a curves file; returns the file's contents."""
    from detsweep.sweeps import load_sweep
    from detsweep.sweeps.launch import launch
    from detsweep.sweeps.replay import curves_file, load_curves

    with tempfile.TemporaryDirectory(prefix="detsweep-curves-") as scratch:
        settings = [f"storage={scratch}/ray", f"base.tracking.uri=sqlite:///{scratch}/mlflow.db", *overrides]
        sweep = load_sweep(SWEEP, settings)
        started = time.monotonic()
        report = launch(sweep, register=False)
        curves = load_curves(sweep.base.tracking.experiment or sweep.name, sweep)
        minutes = (time.monotonic() - started) / 60
    recorded = (f"{time.strftime('%Y-%m-%d')}, {machine()['cores']} cores, {len(report['trials'])} trials of "
                f"{sweep.base.train.num_steps} steps in {minutes:.0f} min; {len(curves.configs)} trained their whole budget")
    contents = curves_file(curves, recorded, sweep="bench/curves_sweep.yaml", settings=overrides)
    out.write_text(as_lines(contents))
    return contents


def as_lines(contents: dict) -> str:
    """JSON with one recorded trial per line (values to 6 significant digits): small, and a
    new recording's diff reads trial by trial."""
    def rounded(value):
        return float(f"{value:.6g}") if isinstance(value, float) else value

    trials = [json.dumps({"config": trial["config"],
                          "reports": [{k: rounded(v) for k, v in report.items()} for report in trial["reports"]]},
                         separators=(",", ":")) for trial in contents["trials"]]
    head = json.dumps({k: v for k, v in contents.items() if k != "trials"}, indent=1)[:-2]
    return head + ',\n "trials": [\n' + ",\n".join(trials) + "\n ]\n}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE")
    parser.add_argument("--out", type=Path, default=BENCH / "curves.json")
    args = parser.parse_args()
    contents = record(args.overrides, args.out)
    print(f"wrote {args.out}: {contents['recorded']}")


if __name__ == "__main__":
    main()
