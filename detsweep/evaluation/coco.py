"""COCO box metrics: the AP figures by faster-coco-eval's COCOeval (pycocotools' rules in C++,
its figures equal to pycocotools' on the same detections, a test holds it to 1e-6, in about a
ninth of its time on val2017's size: bench/evaluation_cost.py), the per-image matches of the bootstrap
spread by pycocotools' own COCOeval, whose ``evalImgs`` faster-coco-eval does not fill.

Detections arrive in their original images' pixels with the dataset's own category ids
(mapped back by :mod:`detsweep.data.processing`, as exported models map them), so the
numbers are comparable with any other COCO evaluation of the same ground truth.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable
from dataclasses import dataclass

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
    stats = dict(zip(METRIC_NAMES, coco_stats(ground_truth, detections, faster=True)))
    # As in COCOeval, -1 means "no ground truth in this size range", not a score.
    return {name: float(stats[name]) for name in REPORTED}


def coco_stats(ground_truth: dict, detections: list[dict], faster: bool) -> np.ndarray:
    """COCOeval's 12 ``stats`` (bbox): faster-coco-eval's, or with ``faster`` False pycocotools'."""
    if faster:
        from faster_coco_eval import COCO as FasterCOCO
        from faster_coco_eval import COCOeval_faster

        coco, cocoeval = FasterCOCO, COCOeval_faster
    else:
        coco, cocoeval = COCO, COCOeval
    with contextlib.redirect_stdout(io.StringIO()):  # both print their progress
        truth = coco()
        truth.dataset = ground_truth
        truth.createIndex()
        evaluation = cocoeval(truth, truth.loadRes(detections), iouType="bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return np.asarray(evaluation.stats)


def resampled_scores(ground_truth: dict, detections: Iterable[dict], draws: np.ndarray) -> list[tuple[float, float]]:
    """AP and AP50 on each resampling of the images: ``draws`` ``[n, images]`` holds positions
    in ``ground_truth["images"]``, repeats allowed (a bootstrap). Each image is matched once,
    as COCOeval matches images independently; each draw only accumulates its images' matches
    (COCOeval's ``accumulate`` for the scores used, every area and 100 detections, in arrays:
    :func:`_precision`), so a draw costs a fraction of a millisecond, not an evaluation."""
    detections = list(detections)
    if not detections:
        return [(0.0, 0.0)] * len(draws)
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO()
        truth.dataset = ground_truth
        truth.createIndex()
        evaluation = COCOeval(truth, truth.loadRes(detections), iouType="bbox")
        evaluation.evaluate()
    matches = _matches_per_image(evaluation, ground_truth["images"])
    scores = []
    for draw in draws:
        precision = _precision(matches, draw, len(evaluation.params.iouThrs), evaluation.params.recThrs)
        scores.append((_mean_present(precision), _mean_present(precision[0])))
    return scores


@dataclass(frozen=True)
class _Matches:
    """One image's detections of one category, by falling score (COCOeval's ``evaluateImg``, every
    area, at most 100): each IoU threshold's true and false positives (ignored ones neither),
    and how many of its ground-truth boxes count."""

    scores: np.ndarray  # [detections]
    true: np.ndarray  # [thresholds, detections] bool
    false: np.ndarray  # [thresholds, detections] bool
    counted: int


def _matches_per_image(evaluation: COCOeval, images: list[dict]) -> list[list[_Matches | None]]:
    """By category, then by position in ``images``: what COCOeval matched there (None where the
    image has neither boxes nor detections of the category)."""
    ids = evaluation.params.imgIds  # COCOeval's order: sorted
    position = {image_id: n for n, image_id in enumerate(ids)}
    areas = len(evaluation.params.areaRng)  # the first, "all", is the one used
    by_category = []
    for k in range(len(evaluation.params.catIds)):
        found = []
        for image in images:
            e = evaluation.evalImgs[k * areas * len(ids) + position[image["id"]]]
            if e is None:
                found.append(None)
                continue
            ignored = np.asarray(e["dtIgnore"], bool)
            matched = np.asarray(e["dtMatches"]) != 0
            found.append(_Matches(np.asarray(e["dtScores"], float), matched & ~ignored, ~matched & ~ignored,
                                  int(np.count_nonzero(np.asarray(e["gtIgnore"]) == 0))))
        by_category.append(found)
    return by_category


def _precision(matches: list[list[_Matches | None]], draw: np.ndarray, iou_thresholds: int,
               thresholds: np.ndarray) -> np.ndarray:
    """``[IoU thresholds, recall thresholds, categories]`` precision of the images at ``draw``
    (positions, repeats allowed), -1 where a category has no box there: COCOeval's
    ``accumulate`` (every area, 100 detections), its loops as array operations. The draw's
    detections are merged by falling score, ties in the draw's order (a stable sort, as it
    sorts); precision is made non-increasing from the right and read at each recall threshold
    (0 past the last detection's recall)."""
    precision = -np.ones((iou_thresholds, len(thresholds), len(matches)))
    for k, found in enumerate(matches):
        picked = [found[i] for i in draw if found[i] is not None]
        counted = sum(m.counted for m in picked)
        if not picked or counted == 0:
            continue
        order = np.argsort(-np.concatenate([m.scores for m in picked]), kind="mergesort")
        true = np.cumsum(np.concatenate([m.true for m in picked], axis=1)[:, order], axis=1).astype(float)
        false = np.cumsum(np.concatenate([m.false for m in picked], axis=1)[:, order], axis=1).astype(float)
        recall = true / counted
        ratio = true / (false + true + np.spacing(1))
        envelope = np.flip(np.maximum.accumulate(np.flip(ratio, axis=1), axis=1), axis=1)
        read = np.zeros((iou_thresholds, len(thresholds)))
        for t in range(iou_thresholds):
            at = np.searchsorted(recall[t], thresholds, side="left")
            inside = at < recall.shape[1]
            read[t, inside] = envelope[t, at[inside]]
        precision[:, :, k] = read
    return precision


def _mean_present(precision: np.ndarray) -> float:
    present = precision[precision > -1]
    return float(present.mean()) if present.size else -1.0
