"""The best trial's model in the MLflow registry: a pyfunc model around detsweep's
:class:`~detsweep.export.detector.Detector`, with its checkpoint as the artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow.pyfunc

import detsweep
from detsweep.tracking.trial_run import RunLink

MODEL_NAME = "model"
REQUIREMENTS = ["tensorflow", "keras-hub", "pycocotools", "pyyaml", "pydantic", "numpy"]


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


def register_best(link: RunLink, name: str, best: dict[str, Any]) -> dict[str, Any]:
    """Log the best trial's checkpoint as a model in its own run (``best["mlflow_run_id"]``)
    and register it under ``name``; the averaged weights when they scored better."""
    run_id = best["mlflow_run_id"]
    use_average = best["metrics"].get("eval_ema/AP", -1.0) >= best["metrics"].get("eval/AP", -1.0)
    mlflow.set_tracking_uri(link.uri)
    status = mlflow.MlflowClient(link.uri).get_run(run_id).info.status
    package = str(Path(detsweep.__file__).parent)  # the model's code travels with it
    mlflow.start_run(run_id=run_id)
    try:
        info = mlflow.pyfunc.log_model(
            name=MODEL_NAME, python_model=DetectorModel(), artifacts={"checkpoint": best["checkpoint"]},
            model_config={"use_moving_average": use_average}, signature=signature(), code_paths=[package],
            pip_requirements=REQUIREMENTS,
        )
    finally:
        mlflow.end_run(status)  # the trial's own end (FINISHED, or KILLED if cut short) stays
    version = mlflow.register_model(info.model_uri, name, tags={"source_run_id": run_id,
                                                                 "moving_average": str(use_average).lower()})
    return {"name": name, "version": int(version.version), "model_uri": info.model_uri}
