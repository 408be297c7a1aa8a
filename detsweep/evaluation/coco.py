"""COCO box metrics by pycocotools' own COCOeval.

Detections arrive in the model's resized-image pixels with contiguous labels; they are
mapped back to the original image and the dataset's original category ids first, so the
numbers are comparable with any other COCO evaluation of the same ground truth.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

# COCOeval.stats, in its order.
METRIC_NAMES = ["AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100"]
REPORTED = ["AP", "AP50", "AP75", "APs", "APm", "APl", "AR100"]


def to_coco_detections(
    image_ids: np.ndarray,
    scales: np.ndarray,
    boxes: np.ndarray,
    scores: np.ndarray,
    labels: np.ndarray,
    counts: np.ndarray,
    original_ids: list[int],
    image_sizes: dict[int, tuple[int, int]],
) -> list[dict]:
    """A batch of model outputs as COCO result dicts (original pixels, xywh, original ids).
    Boxes are clipped to their image (``image_sizes``: height, width by image id), as the OD
    API's and exported models' are, so that every evaluation of a model scores the same boxes."""
    results = []
    for i, image_id in enumerate(image_ids):
        if image_id < 0:  # filler that completes the last batch
            continue
        height, width = image_sizes[int(image_id)]
        for box, score, label in zip(boxes[i, : counts[i]], scores[i, : counts[i]], labels[i, : counts[i]]):
            ymin, xmin, ymax, xmax = np.clip(np.asarray(box, np.float64) / float(scales[i]), 0, [height, width] * 2)
            # labels past the data's categories (model.num_classes above their count) have no ground truth
            if xmax <= xmin or ymax <= ymin or not 0 <= label < len(original_ids):
                continue
            results.append({
                "image_id": int(image_id),
                "category_id": original_ids[int(label)],
                "bbox": [float(xmin), float(ymin), float(xmax - xmin), float(ymax - ymin)],
                "score": float(score),
            })
    return results


def evaluate_detections(ground_truth: dict, detections: Iterable[dict]) -> dict[str, float]:
    """COCOeval bbox metrics of ``detections`` against a COCO ground-truth dict."""
    detections = list(detections)
    if not detections:  # COCO.loadRes rejects an empty list; no detections scores zero
        return {name: 0.0 for name in REPORTED}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        truth = COCO()
        truth.dataset = ground_truth
        truth.createIndex()
        evaluation = COCOeval(truth, truth.loadRes(detections), iouType="bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    stats = dict(zip(METRIC_NAMES, evaluation.stats))
    # As in COCOeval, -1 means "no ground truth in this size range", not a score.
    return {name: float(stats[name]) for name in REPORTED}
