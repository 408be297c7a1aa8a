"""What ``detsweep data inspect`` shows: a dataset's size, classes and what loading changed."""

from __future__ import annotations

from typing import Any

import numpy as np

from .records import DetectionSet, describe_count, plural

# Counts that say something was left out; the rest say something was converted or kept.
SKIPPED = {"skipped_empty_images": "empty_images", "dropped_zero_area_boxes": "zero_area_boxes"}


def describe(dataset: DetectionSet, max_boxes: int | None = None) -> dict[str, Any]:
    """A JSON-ready description; ``changes`` holds every count, ``skipped`` what was left out,
    ``max_boxes`` what training keeps of each image's boxes (with ``max_boxes``, what it cuts)."""
    from .index import cut_by, cut_line

    per_category = np.zeros(len(dataset.categories), np.int64)
    for example in dataset.examples:
        per_category += np.bincount(example.labels, minlength=len(dataset.categories))
    box_counts = [len(example.labels) for example in dataset.examples]
    cut = cut_by(box_counts, max_boxes) if max_boxes else (0, 0)
    heights = [example.height for example in dataset.examples]
    widths = [example.width for example in dataset.examples]
    return {
        "source": dataset.source,
        "images": len(dataset.examples),
        "boxes": dataset.num_boxes,
        "crowd_boxes": dataset.num_crowd_boxes,
        "categories": [{"id": category.id, "name": category.name} for category in dataset.categories],
        "per_category": {category.name: int(n) for category, n in zip(dataset.categories, per_category)},
        "image_size": {"min": [min(heights), min(widths)], "max": [max(heights), max(widths)]},
        "skipped": {reason: dataset.counts[key] for key, reason in SKIPPED.items() if dataset.counts.get(key)},
        "changes": dict(dataset.counts),
        "max_boxes": {"most": max(box_counts, default=0), "cut_images": cut[0], "cut_boxes": cut[1],
                      "line": cut_line(box_counts, max_boxes)},
    }


def format_description(description: dict[str, Any]) -> str:
    """The human-readable form of :func:`describe`: a summary, then one row per category."""
    size = description["image_size"]
    lines = [
        f"source      {description['source']}",
        f"images      {description['images']} ({_sizes(size)})",
        f"boxes       {description['boxes']}" + (f" (+ {plural(description['crowd_boxes'], 'crowd box', 'crowd boxes')})"
                                                 if description["crowd_boxes"] else ""),
        f"categories  {len(description['categories'])}",
        "",
        f"{'id':>6}  {'name':<24} {'boxes':>8}",
    ]
    for category in description["categories"]:
        count = description["per_category"][category["name"]]
        lines.append(f"{category['id']:>6}  {category['name']:<24} {count:>8}")
    changes = [describe_count(key, value) for key, value in description["changes"].items()]
    if changes:
        lines += ["", "loading changed:"] + [f"  {change}" for change in changes]
    return "\n".join([*lines, "", description["max_boxes"]["line"]])


def _sizes(size: dict[str, list[int]]) -> str:
    (low_h, low_w), (high_h, high_w) = size["min"], size["max"]
    if (low_h, low_w) == (high_h, high_w):
        return f"all {low_h} x {low_w}"
    return f"height {low_h}–{high_h}, width {low_w}–{high_w}"
