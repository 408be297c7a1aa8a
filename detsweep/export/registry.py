"""The best trial's model in the MLflow registry: a pyfunc model around detsweep's
:class:`~detsweep.export.detector.Detector`, with its checkpoint as the artifact, its
environment pinned to the versions it was trained with. The best version of all the sweeps
registered under one name carries the alias ``champion`` (MLflow's successor to stages)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow.pyfunc

import detsweep
from detsweep.tracking.source import local_copy
from detsweep.tracking.trial_run import RunLink

MODEL_NAME = "model"
CHAMPION = "champion"
# What the model's code imports when it is served; pinned to this environment's versions.
PACKAGES = ["tensorflow", "keras", "keras-hub", "pycocotools", "pyyaml", "pydantic", "numpy"]


def requirements() -> list[str]:
    """``name==version`` for every package the served model needs, as installed here."""
    from importlib.metadata import PackageNotFoundError, version

    pinned = []
    for name in PACKAGES:
        try:
            pinned.append(f"{name}=={version(name)}")
        except PackageNotFoundError:  # installed under another distribution name (tensorflow-cpu, say)
            pinned.append(name)
    return pinned


class DetectorModel(mlflow.pyfunc.PythonModel):
    """``predict`` takes uint8 images ``[batch, height, width, 3]`` and returns the detections."""

    def load_context(self, context) -> None:
        from detsweep.export.detector import Detector

        use_average = bool((context.model_config or {}).get("use_moving_average", True))
        self.detector = Detector.from_checkpoint(context.artifacts["checkpoint"], use_average)

    def predict(self, context, model_input, params=None) -> dict[str, Any]:
        if isinstance(model_input, dict):  # the signature's named tensor
            model_input = model_input["images"]
        return self.detector.detect(model_input)


def signature():
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.uint8), (-1, -1, -1, 3), "images")]),
        outputs=Schema([
            TensorSpec(np.dtype(np.float32), (-1, -1, 4), "detection_boxes"),
            TensorSpec(np.dtype(np.int64), (-1, -1), "detection_classes"),
            TensorSpec(np.dtype(np.float32), (-1, -1), "detection_scores"),
            TensorSpec(np.dtype(np.int64), (-1,), "num_detections"),
        ]),
    )


def register_trial(link: RunLink, name: str, best: dict[str, Any], checkpoint: str, metric: str,
                  mode: str, tags: dict[str, str] | None = None, crown: bool = True) -> dict[str, Any]:
    """Log ``checkpoint`` (a trial's best READY checkpoint in MLflow, ``models:/…``) as a model
    in the trial's own run (``best["mlflow_run_id"]``) and register it under ``name`` with
    ``tags``, the averaged weights when they scored better; with ``crown`` (the sweep's best
    trial), the new version becomes the ``champion`` unless the champion scored better on ``metric``."""
    run_id = best["mlflow_run_id"]
    use_average = best["metrics"].get("eval_ema/AP", -1.0) >= best["metrics"].get("eval/AP", -1.0)
    mlflow.set_tracking_uri(link.uri)
    status = mlflow.MlflowClient(link.uri).get_run(run_id).info.status
    package = str(Path(detsweep.__file__).parent)  # the model's code travels with it
    mlflow.start_run(run_id=run_id)
    try:
        with local_copy(checkpoint, link.uri) as folder:
            info = mlflow.pyfunc.log_model(
                name=MODEL_NAME, python_model=DetectorModel(), artifacts={"checkpoint": str(folder)},
                model_config={"use_moving_average": use_average}, signature=signature(), code_paths=[package],
                pip_requirements=requirements(),
            )
    finally:
        mlflow.end_run(status)  # the trial's own end (FINISHED, or KILLED if cut short) stays
    score = float(best["metrics"][metric])
    version = mlflow.register_model(info.model_uri, name, tags={
        "source_run_id": run_id, "source_checkpoint": checkpoint, "moving_average": str(use_average).lower(),
        "metric": metric, "mode": mode, "score": repr(score), **(tags or {})})
    client = mlflow.MlflowClient(link.uri)
    champion = crown_if_better(client, name, version.version, metric, mode, score) if crown else None
    return {"name": name, "version": int(version.version), "model_uri": info.model_uri,
            "champion": int(champion) if champion else None}


def crown_if_better(client, name: str, version: str, metric: str, mode: str, score: float) -> str:
    """Point the alias ``champion`` at ``version`` unless the version it points at scored better
    on the same ``metric`` (a tie keeps it; a champion scored on another metric cannot be
    compared and gives way). Returns the champion's version."""
    from mlflow.exceptions import MlflowException

    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:  # no champion yet
        current = None
    if current is not None and current.tags.get("metric") == metric and "score" in current.tags:
        theirs = float(current.tags["score"])
        if (theirs >= score) if mode == "max" else (theirs <= score):
            return str(current.version)
    client.set_registered_model_alias(name, CHAMPION, str(version))
    return str(version)
