"""Synthetic shapes: coloured circles, squares and triangles on noisy backgrounds.

A dataset that needs no download, is learnable in a few hundred steps, and is the same
for the same seed on every machine (one numpy Generator draws everything). Class k is
shape k % 3 in a colour of its own, so classes that share a shape differ by colour.
:func:`write_synthetic` writes the same data as PNG files and a COCO JSON, so that it
also goes through the COCO reader.
"""

from __future__ import annotations

import colorsys
import io
import json
import os
import secrets
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image

from detsweep.errors import DetsweepError

from .assemble import assemble
from .records import Category, DetectionSet, Example, empty_boxes, empty_labels

SHAPES = ("circle", "square", "triangle")
# Saturated colours, far from the grey backgrounds and from each other.
PALETTE = [
    (230, 40, 40), (40, 200, 60), (50, 90, 240), (240, 210, 30), (220, 50, 220), (30, 210, 220),
    (250, 140, 20), (140, 60, 220), (150, 240, 40), (250, 130, 180), (20, 140, 130), (150, 90, 40),
]
MIN_SIZE, MAX_SIZE = 0.2, 0.45  # object side, as a fraction of the image side
MAX_OVERLAP = 0.1  # of the smaller box's area
PLACEMENT_TRIES = 20


def generate_synthetic(
    num_images: int, image_size: int, classes: int, seed: int, *, verify: bool = False, skip_empty: bool = False
) -> DetectionSet:
    """``num_images`` PNG-encoded images with 1–4 shapes each; category ids 1..``classes``.

    ``verify`` reads each PNG's header back, as for any dataset (load_dataset's default).
    """
    rng = np.random.default_rng(seed)
    categories = [Category(k + 1, name) for k, name in enumerate(category_names(classes))]
    examples = [draw_example(rng, image_id, image_size, classes) for image_id in range(1, num_images + 1)]
    source = f"synthetic shapes (seed {seed})"
    origins = [f"{source}: {example.file_name}" for example in examples]
    return assemble(source, categories, examples, origins, Counter(), verify=verify, skip_empty=skip_empty)


def write_synthetic(out_dir: str | Path, num_images: int, image_size: int, classes: int, seed: int) -> Path:
    """Write ``out_dir/images/*.png`` and ``out_dir/annotations.json`` (COCO); returns the JSON's path.

    Everything is written into a hidden folder beside ``out_dir`` and renamed into place
    at the end, so a failure leaves ``out_dir`` as it was.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        found = "a non-empty folder" if out.is_dir() else "a file"
        raise DetsweepError(f"{out}: found {found}, expected a new or empty folder for the synthetic dataset")
    dataset = generate_synthetic(num_images, image_size, classes, seed)
    target = out.resolve()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Not tempfile.mkdtemp: its 0700 mode would become the dataset folder's.
        staging = target.parent / f".{target.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
        staging.mkdir()
    except OSError as error:
        raise DetsweepError(f"{out}: cannot write: {error.strerror or error}") from None
    try:
        _write_files(staging, dataset, seed)
        if target.exists():
            target.rmdir()
        staging.rename(target)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError):
            raise DetsweepError(f"{out}: cannot write: {error.strerror or error}") from None
        raise
    return out / "annotations.json"


def _write_files(folder: Path, dataset: DetectionSet, seed: int) -> None:
    (folder / "images").mkdir()
    for example in dataset.examples:
        (folder / "images" / example.file_name).write_bytes(example.encoded)
    coco = {"info": {"description": f"detsweep synthetic shapes, seed {seed}"}, **dataset.to_coco()}
    (folder / "annotations.json").write_text(json.dumps(coco))


def category_names(classes: int) -> list[str]:
    """circle, square, triangle, circle_2, square_2, …"""
    return [SHAPES[k % 3] + (f"_{k // 3 + 1}" if k >= 3 else "") for k in range(classes)]


def class_colour(k: int) -> np.ndarray:
    """RGB of class k, float32 [3]."""
    if k < len(PALETTE):
        return np.array(PALETTE[k], np.float32)
    hue = (k * 0.618033988749895) % 1.0  # golden-ratio steps keep further hues apart
    return np.array(colorsys.hsv_to_rgb(hue, 0.85, 0.95), np.float32) * 255


def draw_example(rng: np.random.Generator, image_id: int, size: int, classes: int) -> Example:
    image = background(rng, size)
    boxes: list[tuple[int, int, int, int]] = []
    labels: list[int] = []
    smallest = max(1, round(MIN_SIZE * size))
    largest = max(smallest, int(MAX_SIZE * size))
    for _ in range(int(rng.integers(1, 5))):
        label = int(rng.integers(classes))
        side = int(rng.integers(smallest, largest + 1))
        box = place(rng, size, side, boxes)
        if box is None:
            continue
        paint(rng, image, box, SHAPES[label % 3], class_colour(label))
        boxes.append(box)
        labels.append(label)
    return Example(
        image_id, f"shapes_{image_id:06d}.png", size, size,
        np.array(boxes, np.float32).reshape(-1, 4), np.array(labels, np.int32), empty_boxes(), empty_labels(),
        encoded=encode_png(image),
    )


def background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A greyish, slightly tinted gradient with pixel noise, int16 [size, size, 3]."""
    grey = rng.uniform(60, 190)
    tint = rng.normal(0, 12, 3)
    slope = rng.uniform(-30, 30, 2)
    ramp = np.linspace(-0.5, 0.5, size)
    gradient = slope[0] * ramp[:, None, None] + slope[1] * ramp[None, :, None]
    # Uniform integer noise: as good as Gaussian here, and several times faster to draw.
    noise = rng.integers(-8, 9, (size, size, 3), dtype=np.int16)
    return (grey + tint + gradient).astype(np.int16) + noise


def place(rng: np.random.Generator, size: int, side: int,
          others: list[tuple[int, int, int, int]]) -> tuple[int, int, int, int] | None:
    """A box of ``side`` that overlaps no other box much, or None if none was found."""
    for _ in range(PLACEMENT_TRIES):
        y0, x0 = (int(v) for v in rng.integers(0, size - side + 1, 2))
        box = (y0, x0, y0 + side, x0 + side)
        if all(overlap(box, other) <= MAX_OVERLAP for other in others):
            return box
    return None


def overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    """Intersection over the smaller area."""
    height = min(a[2], b[2]) - max(a[0], b[0])
    width = min(a[3], b[3]) - max(a[1], b[1])
    if height <= 0 or width <= 0:
        return 0.0
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return height * width / smaller


def paint(rng: np.random.Generator, image: np.ndarray, box: tuple[int, int, int, int], shape: str,
          colour: np.ndarray) -> None:
    y0, x0, y1, x1 = box
    side = y1 - y0
    yy, xx = np.ogrid[0:side, 0:side]
    yy, xx = yy + 0.5, xx + 0.5  # pixel centres
    half = side / 2
    if shape == "circle":
        mask = (yy - half) ** 2 + (xx - half) ** 2 <= half**2
    elif shape == "triangle":  # apex at the top centre, base along the bottom
        mask = np.abs(xx - half) <= yy / 2
    else:
        mask = np.ones((side, side), bool)
    shade = colour.astype(np.int16) + rng.integers(-6, 7, (side, side, 3), dtype=np.int16)
    region = image[y0:y1, x0:x1]
    region[mask] = shade[mask]


def encode_png(image: np.ndarray) -> bytes:
    """An RGB PNG (fast compression: these images are regenerated, not archived)."""
    buffer = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8), "RGB").save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()
