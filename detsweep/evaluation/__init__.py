"""Evaluation: COCO metrics with pycocotools."""

from .coco import REPORTED, evaluate_detections, to_coco_detections

__all__ = ["REPORTED", "evaluate_detections", "to_coco_detections"]
