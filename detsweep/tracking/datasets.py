"""A trial's datasets as MLflow run inputs: what the runs table's Dataset column shows, with
the context each was used in (``training``, ``validation``).

A dataset is named for its annotations, its source is where they are, and its digest changes
when the config's view of it does (format, paths, subset, …) or when its annotation files do
(their names and sizes; contents are not read, so this stays instant for any size).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from pathlib import Path

from detsweep.config import DatasetConfig, TrialConfig

TRAINING, VALIDATION = "training", "validation"
CONTEXT_TAG = "mlflow.data.context"  # MLflow's own key for the context


def dataset_inputs(config: TrialConfig) -> list:
    """``DatasetInput``s for ``config``'s training set and, when it has one, its val set."""
    from mlflow.entities import DatasetInput, InputTag

    used = [(config.data.train, TRAINING)] + ([(config.data.val, VALIDATION)] if config.data.val else [])
    return [DatasetInput(describe(dataset), [InputTag(CONTEXT_TAG, context)]) for dataset, context in used]


def describe(config: DatasetConfig):
    """An MLflow ``Dataset`` (no data: name, digest, source) for one dataset config."""
    from mlflow.entities import Dataset

    if config.format == "synthetic":
        name = f"synthetic-{config.classes}c-{config.image_size}px-seed{config.seed}"
        source_type, source = "synthetic", {"generator": "detsweep.data.synthetic", "seed": config.seed}
    else:
        name = Path(config.annotations.split(",")[0].rstrip("/")).name
        source_type, source = "local", {"uri": config.annotations}
    fingerprint = hashlib.sha256(json.dumps([config.model_dump(mode="json"), _files(config)]).encode())
    return Dataset(name=name, digest=fingerprint.hexdigest()[:16], source_type=source_type, source=json.dumps(source),
                   profile=json.dumps({"format": config.format, "subset": config.subset}))


def _files(config: DatasetConfig) -> list[tuple[str, int]]:
    """Names and sizes of the annotation files (a file, a folder's files, a list or a glob)."""
    if not config.annotations:
        return []
    found: list[tuple[str, int]] = []
    for part in config.annotations.split(","):
        for path in sorted(glob.glob(part)) or [part]:
            if os.path.isdir(path):
                found += [(entry.name, entry.stat().st_size) for entry in sorted(os.scandir(path), key=lambda e: e.name)
                          if entry.is_file()]
            elif os.path.isfile(path):
                found.append((os.path.basename(path), os.path.getsize(path)))
    return found
