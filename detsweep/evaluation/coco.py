"""COCO box metrics by pycocotools' own COCOeval.

Detections arrive in their original images' pixels with the dataset's own category ids
(mapped back by :mod:`detsweep.data.processing`, as exported models map them), so the
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


def to_coco_detections(image_ids: np.ndarray, found: dict[str, np.ndarray]) -> list[dict]:
    """A batch of detections in their original images (``boxes`` in pixels, ``classes`` as
    category ids, ``scores``, ``num_detections``: see :func:`~detsweep.data.processing.in_original_image`)
    as COCO result dicts, boxes as ``x, y, width, height``. Images with id -1 are skipped."""
    results = []
    for i, image_id in enumerate(image_ids):
        if image_id < 0:  # filler that completes the last batch
            continue
        count = int(found["num_detections"][i])
        for box, score, category in zip(found["boxes"][i, :count], found["scores"][i, :count], found["classes"][i, :count]):
            ymin, xmin, ymax, xmax = (float(v) for v in box)
            results.append({
                "image_id": int(image_id),
                "category_id": int(category),
                "bbox": [xmin, ymin, xmax - xmin, ymax - ymin],
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


def resampled_scores(ground_truth: dict, detections: Iterable[dict], draws: np.ndarray) -> list[tuple[float, float]]:
    """AP and AP50 on each resampling of the images: ``draws`` ``[n, images]`` holds positions
    in ``ground_truth["images"]``, repeats allowed (a bootstrap). Each image is matched once,
    as COCOeval matches images independently; each draw only accumulates its images' matches,
    so a draw costs a few milliseconds, not an evaluation."""
    detections = list(detections)
    if not detections:
        return [(0.0, 0.0)] * len(draws)
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO()
        truth.dataset = ground_truth
        truth.createIndex()
        evaluation = COCOeval(truth, truth.loadRes(detections), iouType="bbox")
        evaluation.evaluate()
        per_image = evaluation.evalImgs  # [category][area range][image], images in sorted id order
        categories, areas = len(evaluation.params.catIds), len(evaluation.params.areaRng)
        ids = evaluation.params.imgIds
        position = {image_id: n for n, image_id in enumerate(ids)}
        order = np.array([position[image["id"]] for image in ground_truth["images"]])
        scores = []
        for draw in draws:
            picked = order[draw]
            evaluation.evalImgs = [per_image[(k * areas + a) * len(ids) + i]
                                   for k in range(categories) for a in range(areas) for i in picked]
            evaluation.params.imgIds = evaluation._paramsEval.imgIds = list(range(len(picked)))
            evaluation.accumulate()
            precision = evaluation.eval["precision"][:, :, :, 0, -1]  # every area, 100 detections
            scores.append((_mean_present(precision), _mean_present(precision[0])))
    return scores


def _mean_present(precision: np.ndarray) -> float:
    present = precision[precision > -1]
    return float(present.mean()) if present.size else -1.0
