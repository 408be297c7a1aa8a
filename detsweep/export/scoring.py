"""Exported models scored as training scores them: every val image, one per batch at its own
size, pycocotools' COCOeval on the detections the model keeps (its own score threshold and
maximum detections, in the graph); and the spread of each score from a bootstrap over the val
images, so that a difference between two models can be told from the luck of which images
the val set holds. Differences are bootstrapped paired (the same draws for both models).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from detsweep.data import DetectionSet
from detsweep.evaluation import evaluate_detections, to_coco_detections
from detsweep.evaluation.coco import resampled_scores

from .quantize import decoded

SCORED = ("AP", "AP50")
BOOTSTRAP_DRAWS = 200


def detections_of(detect: Callable[[np.ndarray], dict[str, np.ndarray]], val_set: DetectionSet) -> list[dict]:
    """COCO results of a serving function (uint8 ``[1, h, w, 3]`` in, the SavedModel's outputs
    out) on every val image."""
    results = []
    for example in val_set.examples:
        found = detect(decoded(example).numpy()[None])
        pixels = np.array([example.height, example.width] * 2, np.float32)
        results += to_coco_detections(np.array([example.image_id]), {
            "boxes": found["detection_boxes"] * pixels, "classes": found["detection_classes"],
            "scores": found["detection_scores"], "num_detections": found["num_detections"]})
    return results


def scores(val_set: DetectionSet, detections: dict[str, list[dict]], reference: str | None = None,
           draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> dict[str, dict[str, float]]:
    """Per model: ``AP``, ``AP50`` and their bootstrap spreads (``AP_spread``: the standard
    deviation over ``draws`` resamplings of the val images); with a ``reference`` model, each
    other one's ``AP_drop`` below it and that drop's paired spread."""
    truth = val_set.to_coco()
    result = {name: {k: round(v, 4) for k, v in evaluate_detections(truth, found).items() if k in SCORED}
              for name, found in detections.items()}
    drawn = bootstrap(truth, detections, draws, seed)
    for name, values in drawn.items():
        for metric in SCORED:
            result[name][f"{metric}_spread"] = round(float(np.std(values[metric], ddof=1)), 4)
        if reference is not None and name != reference:
            drop = np.array(drawn[reference]["AP"]) - np.array(values["AP"])
            result[name]["AP_drop"] = round(result[reference]["AP"] - result[name]["AP"], 4)
            result[name]["AP_drop_spread"] = round(float(np.std(drop, ddof=1)), 4)
    return result


def bootstrap(truth: dict, detections: dict[str, list[dict]], draws: int, seed: int) -> dict[str, dict[str, list[float]]]:
    """Each model's scores on ``draws`` resamplings (with replacement) of the val images, the
    same resamplings for every model."""
    picks = np.random.default_rng(seed).integers(0, len(truth["images"]), (draws, len(truth["images"])))
    drawn = {}
    for name, found in detections.items():
        pairs = resampled_scores(truth, found, picks)
        drawn[name] = {"AP": [ap for ap, _ in pairs], "AP50": [ap50 for _, ap50 in pairs]}
    return drawn
