"""Tune's per-trial result files (``result.json``, ``progress.csv``), kept whole when a trial
starts again in the same sweep: after a pause (HyperBand), an exploit (PBT) or a retried failure.

Tune (2.60) writes them in the driver's staging folder and copies that to the sweep's storage
every few seconds. When a trial with a checkpoint starts again, Tune's loggers first copy the
stored file back over the staged one, and a trial that ran since the last copy loses the rows
it reported in between (a paused trial resumed 3 s later lost its first result here). Within a
driver the staged file is the newer one; only a new driver (``detsweep resume``) starts without
it, and then Tune's own copy is right (the stored file, for a trial with a checkpoint).
"""

from __future__ import annotations

from pathlib import Path

from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback


class _KeepsTheStagedFile:
    def _restore_from_remote(self, file_name: str, trial) -> None:
        if not Path(trial.local_path, file_name).exists():
            super()._restore_from_remote(file_name, trial)


class JsonResults(_KeepsTheStagedFile, JsonLoggerCallback):
    """``result.json``, as Tune writes it, without losing rows to a restart."""


class CsvProgress(_KeepsTheStagedFile, CSVLoggerCallback):
    """``progress.csv``, as Tune writes it, without losing rows to a restart."""


def result_files() -> list:
    """In place of Tune's own JSON and CSV loggers (Tune adds its own only when these are missing)."""
    return [JsonResults(), CsvProgress()]
