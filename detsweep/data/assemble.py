"""The steps every reader shares once it has parsed its annotations.

Readers fill :class:`Example` objects with the boxes as annotated; :func:`assemble`
checks the images (optionally), clips the boxes to the real image size, drops what
has no area, sets empty images aside if asked, and counts each change, so every
format is cleaned the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from detsweep.errors import DetsweepError

from .images import read_header
from .records import Category, DetectionSet, Example


def assemble(
    source: str,
    categories: list[Category],
    examples: list[Example],
    origins: Sequence[str],
    counts: Counter,
    verify: bool,
    skip_empty: bool,
    subset: tuple[int, int] | None = None,
) -> DetectionSet:
    """The finished :class:`DetectionSet`; ``origins[i]`` names what describes ``examples[i]`` (for messages).

    ``subset`` keeps images ``[start, stop)`` before anything is checked or counted.
    """
    if not examples:
        raise DetsweepError(f"{source}: found no images, expected at least one")
    if subset:
        start, stop = subset
        examples, origins = examples[start:stop], list(origins)[start:stop]
        source = f"{source} [{start}:{stop}]"
        if not examples:
            raise DetsweepError(f"{source}: found no images in subset {start}:{stop}, expected at least one")
    if not categories:
        raise DetsweepError(f"{source}: found no categories, expected at least one class to detect")
    for example, origin in zip(examples, origins):
        if verify or example.height <= 0 or example.width <= 0:
            check_image(example, origin, counts)
        clip_example(example, counts)
    kept = [example for example in examples if len(example.labels) or not skip_empty]
    empty = sum(1 for example in examples if not len(example.labels))
    counts["skipped_empty_images" if skip_empty else "empty_images"] += empty
    if not kept:
        raise DetsweepError(f"{source}: all {len(examples)} images have no boxes, and skip_empty drops them all")
    counts["crowd_boxes"] += sum(len(example.crowd_labels) for example in kept)
    return DetectionSet(source, categories, kept, {key: value for key, value in counts.items() if value})


def check_image(example: Example, origin: str, counts: Counter) -> None:
    """Read the image header: it must exist and decode; its real size wins over the annotation's."""
    if example.encoded is None:
        header = read_header(example.path, None, str(example.path), referenced_by=origin)
    else:
        header = read_header(None, example.encoded, origin)
    if (example.height, example.width) != (header.height, header.width):
        counts["size_mismatch"] += example.height > 0 and example.width > 0  # unknown sizes are not mistakes
        example.height, example.width = header.height, header.width
    if header.kind:
        counts[header.kind] += 1


def clip_example(example: Example, counts: Counter) -> None:
    example.boxes, example.labels = clip_boxes(example.boxes, example.labels, example.height, example.width, counts)
    example.crowd_boxes, example.crowd_labels = clip_boxes(
        example.crowd_boxes, example.crowd_labels, example.height, example.width, counts
    )


def clip_boxes(
    boxes: np.ndarray, labels: np.ndarray, height: int, width: int, counts: Counter
) -> tuple[np.ndarray, np.ndarray]:
    """Boxes clipped to the image, without those left with no area (inverted or NaN included)."""
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    labels = np.asarray(labels, np.int32).reshape(-1)
    limits = np.array([height, width, height, width], np.float32)
    clipped = np.clip(boxes, 0, limits)
    # Both sides positive: an inverted box has a positive product of two negative sides.
    keep = (clipped[:, 2] - clipped[:, 0] > 0) & (clipped[:, 3] - clipped[:, 1] > 0)
    changed = np.any(clipped != boxes, axis=1)
    counts["clipped_boxes"] += int(np.sum(changed & keep))
    counts["dropped_zero_area_boxes"] += int(np.sum(~keep))
    return clipped[keep], labels[keep]
