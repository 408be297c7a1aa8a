"""Scoring a COCO results file against a COCO ground-truth file (``detsweep eval --detections``)."""

from __future__ import annotations

import json
from pathlib import Path

from detsweep.errors import DetsweepError

from .coco import evaluate_detections


def read_json(path: str) -> object:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DetsweepError(f"{path}: file not found") from None
    except json.JSONDecodeError as error:
        raise DetsweepError(f"{path}: line {error.lineno}: invalid JSON: {error.msg}") from None


def score_files(detections_path: str, annotations_path: str) -> dict[str, float]:
    detections = read_json(detections_path)
    truth = read_json(annotations_path)
    if not isinstance(detections, list):
        raise DetsweepError(f"{detections_path}: found a {type(detections).__name__}, expected a COCO results list")
    if not isinstance(truth, dict) or "images" not in truth or "annotations" not in truth:
        raise DetsweepError(f"{annotations_path}: expected COCO ground truth with images and annotations")
    known = {image["id"] for image in truth["images"]}
    unknown = {d.get("image_id") for d in detections} - known
    if unknown:
        raise DetsweepError(f"{detections_path}: image_id {sorted(unknown, key=str)[0]!r} is not in {annotations_path}")
    truth.setdefault("categories", [])
    return {f"eval/{k}": v for k, v in evaluate_detections(truth, detections).items()}
