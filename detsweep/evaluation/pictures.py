"""A picture of a model's detections on a few val images, each beside its ground truth."""

from __future__ import annotations

import functools
import io

import numpy as np

from detsweep.data import DetectionSet

MIN_SCORE = 0.3
# A run's pictures are files (MLflow artifacts), never metrics; these are their paths in the run.
SCHEDULE_FILE = "learning_rate.png"  # once, with a run's first report


def detections_file(step: int) -> str:
    """The picture of the detections at an evaluation of ``step``."""
    return f"detections/step_{step:06d}.png"


def detections_picture(val_set: DetectionSet, detections: list[dict], count: int = 3, title: str = "") -> bytes:
    """PNG bytes: one row per image (the first ``count`` of the val set), ground truth on the
    left, detections scoring at least ``MIN_SCORE`` on the right, with class names and scores."""
    names = {category.id: category.name for category in val_set.categories}
    rows = []
    for example in val_set.examples[:count]:
        image = read_image(example)
        truth = [(box, val_set.categories[label].name, None) for box, label in zip(example.boxes, example.labels)]
        found = [((d["bbox"][1], d["bbox"][0], d["bbox"][1] + d["bbox"][3], d["bbox"][0] + d["bbox"][2]),
                  names.get(d["category_id"], str(d["category_id"])), d["score"])
                 for d in detections if d["image_id"] == example.image_id and d["score"] >= MIN_SCORE]
        rows.append([panel(image, truth, "ground truth", GREEN),
                     panel(image, found, f"detections (score >= {MIN_SCORE})", RED)])
    return png_of(sheet(rows, title))


def image_picture(image: np.ndarray, boxes: list[tuple], title: str = "") -> bytes:
    """PNG bytes of one image with ``boxes`` drawn on it: ``(box in pixels, name, score)``."""
    return png_of(panel(image, boxes, title, RED, width=min(max(PANEL_WIDTH, image.shape[1]), 800)))


# Drawn with Pillow: every evaluation of a trial draws a picture, and Matplotlib took about a
# second for one, a sixth of a quickstart loop on one thread.
PANEL_WIDTH = 256  # pixels: small images are scaled up so that labels stay readable
GREEN, RED = (44, 160, 44), (214, 39, 40)
MARGIN = 4


def panel(image: np.ndarray, boxes, title: str, colour: tuple[int, int, int], width: int = PANEL_WIDTH):
    """``image`` scaled to ``width`` under its ``title``, with ``boxes`` (in the image's pixels)
    outlined in ``colour`` and labelled with their names and scores."""
    from PIL import Image, ImageDraw

    font = text_font()
    height, image_width = image.shape[:2]
    scale = width / image_width
    header = line_height(font) + 2 * MARGIN
    picture = Image.new("RGB", (width, header + round(height * scale)), "white")
    picture.paste(Image.fromarray(image).resize((width, round(height * scale)), Image.Resampling.BILINEAR), (0, header))
    draw = ImageDraw.Draw(picture)
    draw.text((MARGIN, MARGIN), title, fill="black", font=font)
    for box, name, score in boxes:
        if not np.all(np.isfinite(box)):
            continue
        # an untrained model's boxes can lie far outside the image
        ymin, xmin, ymax, xmax = np.clip(box, 0, [height, image_width, height, image_width]) * scale
        ymin, ymax = ymin + header, ymax + header
        draw.rectangle((xmin, ymin, xmax, ymax), outline=colour, width=2)
        label = name if score is None else f"{name} {score:.2f}"
        left, top, right, bottom = draw.textbbox((xmin, ymin), label, font=font, anchor="lb")
        draw.rectangle((left - 1, top - 1, right + 1, bottom + 1), fill=colour)
        draw.text((xmin, ymin), label, fill="white", font=font, anchor="lb")
    return picture


def sheet(rows: list[list], title: str):
    """The panels of ``rows`` side by side, row under row, under ``title``."""
    from PIL import Image, ImageDraw

    font = text_font()
    header = line_height(font) + 2 * MARGIN if title else 0
    width = max(sum(p.width for p in row) + MARGIN * (len(row) - 1) for row in rows)
    height = header + sum(max(p.height for p in row) + MARGIN for row in rows)
    picture = Image.new("RGB", (width, height), "white")
    if title:
        ImageDraw.Draw(picture).text((MARGIN, MARGIN), title, fill="black", font=font)
    top = header
    for row in rows:
        left = 0
        for part in row:
            picture.paste(part, (left, top))
            left += part.width + MARGIN
        top += max(p.height for p in row) + MARGIN
    return picture


@functools.cache
def text_font():
    from PIL import ImageFont

    return ImageFont.load_default(size=12)  # Pillow's own scalable font: no font files needed


def line_height(font) -> int:
    return font.getbbox("Ag")[3]


def png_of(picture) -> bytes:
    out = io.BytesIO()
    picture.save(out, format="png")
    return out.getvalue()


def read_image(example) -> np.ndarray:
    from PIL import Image

    source = io.BytesIO(example.encoded) if example.encoded is not None else example.path
    with Image.open(source) as image:
        return np.asarray(image.convert("RGB"))
